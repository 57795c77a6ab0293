package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"strconv"
	"unsafe"
)

// Op is a reduction operation.
type Op int32

// Reduction operations (the PB_SUM ... PB_PRODUCT codes of pybridge.h).
const (
	Sum     Op = C.PB_SUM
	Avg     Op = C.PB_AVG // floating-point element types only
	Min     Op = C.PB_MIN
	Max     Op = C.PB_MAX
	Product Op = C.PB_PRODUCT
)

func (o Op) String() string {
	switch o {
	case Sum:
		return "Sum"
	case Avg:
		return "Avg"
	case Min:
		return "Min"
	case Max:
		return "Max"
	case Product:
		return "Product"
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// dataOf returns the address of s's first element, or nil for an empty slice
// (the C ABI accepts NULL only with a zero count). The memory is passed to C
// for the duration of one call, which cgo allows for pointer-free element types.
func dataOf[T Numeric](s []T) (unsafe.Pointer, C.int64_t) {
	if len(s) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(unsafe.SliceData(s)), C.int64_t(len(s))
}

// AllReduce reduces data element-wise over all ranks with op, in place: on
// return every rank holds the same result. Every rank passes the same length.
//
// All ranks must call collectives in the same order; when several goroutines
// call them, the program must impose that order.
func AllReduce[T Numeric](g *Group, data []T, op Op) error {
	return allReduce(context.Background(), "AllReduce", g, data, op)
}

// AllReduceContext is AllReduce under ctx (see Contexts): a ctx that ends while
// it waits aborts g.
func AllReduceContext[T Numeric](ctx context.Context, g *Group, data []T, op Op) error {
	return allReduce(ctx, "AllReduceContext", g, data, op)
}

func allReduce[T Numeric](ctx context.Context, name string, g *Group, data []T, op Op) error {
	h, err := g.handle(name)
	if err != nil {
		return err
	}
	p, n := dataOf(data)
	return g.run(ctx, name, func() error {
		var msg *C.char
		return check(name, C.pbgo_all_reduce_slice(h, p, n, dtypeOf[T](), C.int32_t(op), &msg), msg)
	})
}

// Broadcast copies data from rank root into data on every rank, in place.
// Every rank passes the same length.
//
// All ranks must call collectives in the same order; when several goroutines
// call them, the program must impose that order.
func Broadcast[T Numeric](g *Group, data []T, root int) error {
	return broadcast(context.Background(), "Broadcast", g, data, root)
}

// BroadcastContext is Broadcast under ctx (see Contexts): a ctx that ends while
// it waits aborts g.
func BroadcastContext[T Numeric](ctx context.Context, g *Group, data []T, root int) error {
	return broadcast(ctx, "BroadcastContext", g, data, root)
}

func broadcast[T Numeric](ctx context.Context, name string, g *Group, data []T, root int) error {
	h, err := g.handle(name)
	if err != nil {
		return err
	}
	r, err := toInt32(name, "root", root)
	if err != nil {
		return err
	}
	p, n := dataOf(data)
	return g.run(ctx, name, func() error {
		var msg *C.char
		return check(name, C.pbgo_broadcast_slice(h, p, n, dtypeOf[T](), r, &msg), msg)
	})
}

// AllGather concatenates every rank's send slice, in rank order, into recv on
// every rank. len(recv) must be Size() * len(send).
//
// All ranks must call collectives in the same order; when several goroutines
// call them, the program must impose that order.
func AllGather[T Numeric](g *Group, send, recv []T) error {
	return allGather(context.Background(), "AllGather", g, send, recv)
}

// AllGatherContext is AllGather under ctx (see Contexts): a ctx that ends while
// it waits aborts g.
func AllGatherContext[T Numeric](ctx context.Context, g *Group, send, recv []T) error {
	return allGather(ctx, "AllGatherContext", g, send, recv)
}

func allGather[T Numeric](ctx context.Context, name string, g *Group, send, recv []T) error {
	return sendRecv(ctx, g, name, send, recv, func(h *C.pb_group, ps unsafe.Pointer, ns C.int64_t,
		pr unsafe.Pointer, nr C.int64_t, dt C.int32_t, msg **C.char) C.int {
		return C.pbgo_all_gather_slice(h, ps, ns, pr, nr, dt, msg)
	})
}

// ReduceScatter reduces send (Size() blocks of len(recv) elements) over all
// ranks with op; rank r receives block r of the result in recv.
//
// All ranks must call collectives in the same order; when several goroutines
// call them, the program must impose that order.
func ReduceScatter[T Numeric](g *Group, send, recv []T, op Op) error {
	return reduceScatter(context.Background(), "ReduceScatter", g, send, recv, op)
}

// ReduceScatterContext is ReduceScatter under ctx (see Contexts): a ctx that ends
// while it waits aborts g.
func ReduceScatterContext[T Numeric](ctx context.Context, g *Group, send, recv []T, op Op) error {
	return reduceScatter(ctx, "ReduceScatterContext", g, send, recv, op)
}

func reduceScatter[T Numeric](ctx context.Context, name string, g *Group, send, recv []T, op Op) error {
	return sendRecv(ctx, g, name, send, recv, func(h *C.pb_group, ps unsafe.Pointer, ns C.int64_t,
		pr unsafe.Pointer, nr C.int64_t, dt C.int32_t, msg **C.char) C.int {
		return C.pbgo_reduce_scatter_slice(h, ps, ns, pr, nr, dt, C.int32_t(op), msg)
	})
}

// sendRecv makes a collective that reads send and writes recv (AllGather,
// ReduceScatter) on g's handle.
func sendRecv[T Numeric](ctx context.Context, g *Group, name string, send, recv []T,
	call func(*C.pb_group, unsafe.Pointer, C.int64_t, unsafe.Pointer, C.int64_t, C.int32_t, **C.char) C.int) error {
	h, err := g.handle(name)
	if err != nil {
		return err
	}
	ps, ns := dataOf(send)
	pr, nr := dataOf(recv)
	return g.run(ctx, name, func() error {
		var msg *C.char
		return check(name, call(h, ps, ns, pr, nr, dtypeOf[T](), &msg), msg)
	})
}

// Send sends data to rank dst and returns when it has been handed over. It
// matches the Recv on dst with the same tag (>= 0), same length and type.
//
// Point-to-point calls between two ranks must be issued in matching order on
// both, like collectives.
func Send[T Numeric](g *Group, data []T, dst, tag int) error {
	return send(context.Background(), "Send", g, data, dst, tag)
}

// SendContext is Send under ctx (see Contexts): a ctx that ends while it waits
// for dst aborts g.
func SendContext[T Numeric](ctx context.Context, g *Group, data []T, dst, tag int) error {
	return send(ctx, "SendContext", g, data, dst, tag)
}

func send[T Numeric](ctx context.Context, name string, g *Group, data []T, dst, tag int) error {
	return pointToPoint(ctx, g, name, "destination", data, dst, tag, func(h *C.pb_group, p unsafe.Pointer,
		n C.int64_t, dt, peer, tag C.int32_t, msg **C.char) C.int {
		return C.pbgo_send_slice(h, p, n, dt, peer, tag, msg)
	})
}

// Recv receives into data from rank src, matching its Send with the same tag.
//
// Point-to-point calls between two ranks must be issued in matching order on
// both, like collectives.
func Recv[T Numeric](g *Group, data []T, src, tag int) error {
	return recv(context.Background(), "Recv", g, data, src, tag)
}

// RecvContext is Recv under ctx (see Contexts): a ctx that ends while it waits
// for src aborts g.
func RecvContext[T Numeric](ctx context.Context, g *Group, data []T, src, tag int) error {
	return recv(ctx, "RecvContext", g, data, src, tag)
}

func recv[T Numeric](ctx context.Context, name string, g *Group, data []T, src, tag int) error {
	return pointToPoint(ctx, g, name, "source", data, src, tag, func(h *C.pb_group, p unsafe.Pointer,
		n C.int64_t, dt, peer, tag C.int32_t, msg **C.char) C.int {
		return C.pbgo_recv_slice(h, p, n, dt, peer, tag, msg)
	})
}

// pointToPoint checks a Send or Recv's group, peer (what: "destination" or
// "source") and tag, and makes the call on data.
func pointToPoint[T Numeric](ctx context.Context, g *Group, name, what string, data []T, peer, tag int,
	call func(*C.pb_group, unsafe.Pointer, C.int64_t, C.int32_t, C.int32_t, C.int32_t, **C.char) C.int) error {
	h, err := g.handle(name)
	if err != nil {
		return err
	}
	pr, tg, err := peerAndTag(name, what, peer, tag)
	if err != nil {
		return err
	}
	p, n := dataOf(data)
	return g.run(ctx, name, func() error {
		var msg *C.char
		return check(name, call(h, p, n, dtypeOf[T](), pr, tg, &msg), msg)
	})
}

// peerAndTag converts a point-to-point call's peer rank and tag for the C ABI.
func peerAndTag(op, what string, peer, tag int) (C.int32_t, C.int32_t, error) {
	p, err := toInt32(op, what, peer)
	if err != nil {
		return 0, 0, err
	}
	t, err := toInt32(op, "tag", tag)
	return p, t, err
}
