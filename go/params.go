package pybridge

// Parameter broadcast and the slice descriptors that every call over a list of
// parameters shares (BroadcastParams, AverageParams, Averager.Step).

/*
#include "pbgo_reducer.h"
*/
import "C"

import (
	"context"
	"runtime"
)

// BroadcastParams copies every slice of params from rank root to all ranks, in
// place, coalesced into a few broadcasts: use it to start all ranks from rank
// 0's initial weights. Every rank passes slices of the same lengths.
//
// All ranks must call collectives in the same order; when several goroutines
// call them, the program must impose that order.
func BroadcastParams[T Numeric](g *Group, params [][]T, root int) error {
	return broadcastParams(context.Background(), "BroadcastParams", g, params, root)
}

// BroadcastParamsContext is BroadcastParams under ctx (see Contexts): a ctx that
// ends while it waits aborts g.
func BroadcastParamsContext[T Numeric](ctx context.Context, g *Group, params [][]T, root int) error {
	return broadcastParams(ctx, "BroadcastParamsContext", g, params, root)
}

func broadcastParams[T Numeric](ctx context.Context, name string, g *Group, params [][]T, root int) error {
	rt, err := toInt32(name, "root", root)
	if err != nil {
		return err
	}
	return paramsCall(ctx, name, g, params, func(h *C.pb_group, n C.int32_t, d *C.pb_tensor, msg **C.char) C.int {
		return C.pbgo_broadcast_params(h, n, d, rt, msg)
	})
}

// paramsCall makes one library call over g with descriptors of params (pinned
// for the call), under ctx.
func paramsCall[T Numeric](ctx context.Context, name string, g *Group, params [][]T,
	call func(h *C.pb_group, n C.int32_t, d *C.pb_tensor, msg **C.char) C.int) error {
	h, err := g.handle(name)
	if err != nil {
		return err
	}
	n, err := toInt32(name, "parameter count", len(params))
	if err != nil {
		return err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	descs := describeSlices(&pin, params)
	return g.run(ctx, name, func() error {
		var msg *C.char
		return check(name, call(h, n, descs, &msg), msg)
	})
}

// describeSlices returns descriptors of the slices (nil for none), pinning their
// memory in pin: the descriptors hold Go pointers, and cgo requires Go memory
// that contains Go pointers to be pinned for the call.
func describeSlices[T Numeric](pin *runtime.Pinner, slices [][]T) *C.pb_tensor {
	if len(slices) == 0 {
		return nil
	}
	descs := make([]C.pb_tensor, len(slices))
	for i, p := range slices {
		data, count := dataOf(p)
		if data != nil {
			pin.Pin(data)
		}
		descs[i] = C.pb_tensor{data: data, count: count, dtype: dtypeOf[T](), device: CPU}
	}
	return &descs[0]
}
