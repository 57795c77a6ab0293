package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"runtime"
	"strconv"
	"unsafe"
)

// Tensor describes memory the program owns: a libtorch tensor's storage (host or
// CUDA), memory from C.malloc or cudaMalloc, a Buffer's memory, or a Go slice
// (TensorOf). Every collective, point-to-point call and BroadcastParams has a
// variant that takes Tensors, and reduces or fills the memory in place, with no
// copy. Host memory works under gloo; CUDA memory under nccl (one GPU per
// process), and under gloo where torch moves CUDA tensors.
//
// The asynchronous variants keep the pointer after they return, until their
// Work completes: the memory must stay valid and untouched until then, so they
// refuse Go memory (cgo forbids C to keep a Go pointer). A tensor library's type
// becomes a TensorSource with a few lines (docs/go.md shows gotch and GoTorch).
type Tensor struct {
	Data   unsafe.Pointer // the first element; nil only when Len is 0
	Len    int            // the number of elements
	DType  DType
	Device int // CPU, or a CUDA device index

	goMemory bool // made by TensorOf: valid for synchronous calls only
}

// TensorSource is anything that describes its memory as a Tensor: Tensor itself,
// and a tensor library's type through a small adapter.
type TensorSource interface {
	PybridgeTensor() Tensor
}

// PybridgeTensor returns t, so that a Tensor is a TensorSource.
func (t Tensor) PybridgeTensor() Tensor { return t }

// DTypeTorch is not an element type: a Tensor of this DType names a libtorch
// tensor by handle (see TorchTensor); its Len and Device are not used.
const DTypeTorch DType = C.PB_TORCH_TENSOR

// TorchTensor names the program's own libtorch tensor by handle: an
// at::Tensor* in the process's one libtorch (gotch's x.Ctensor(), GoTorch's
// C.Tensor, a C++ shim's at::Tensor*). Every call that takes a TensorSource
// takes it. The library reads dtype, device, size and memory from libtorch
// itself, so there is no descriptor to get wrong, and holds a reference to the
// tensor while it uses it: an asynchronous call stays safe when the binding
// frees its handle (a finalizer, say) before the Work completes. Refused with
// ErrInvalidArgument naming the reason: a nil or undefined handle, a sparse,
// non-contiguous or complex tensor, a CUDA tensor on another device than the
// process's.
func TorchTensor(handle unsafe.Pointer) Tensor {
	return Tensor{Data: handle, DType: DTypeTorch, Device: CPU}
}

// TensorOf describes a Go slice (host memory) for the synchronous calls.
func TensorOf[T Numeric](s []T) Tensor {
	data, n := dataOf(s)
	return Tensor{Data: data, Len: int(n), DType: DType(dtypeOf[T]()), Device: CPU, goMemory: true}
}

// Tensor describes the buffer's memory (library-owned, so the asynchronous
// Tensor calls accept it). It is not valid after Close.
func (b *Buffer[T]) Tensor() Tensor {
	return Tensor{Data: b.data, Len: b.Len(), DType: DType(dtypeOf[T]()), Device: CPU}
}

// tensorDesc checks a tensor for a call (field names it in errors) and pins Go
// memory for the call's duration, so that its descriptor may be passed to C.
func tensorDesc(op, field string, src TensorSource, async bool, pin *runtime.Pinner) (C.pb_tensor, error) {
	var d C.pb_tensor
	if src == nil {
		return d, newError(statusInvalidArgument, op, "%s: nil TensorSource", field)
	}
	t := src.PybridgeTensor()
	switch {
	case t.DType == DTypeTorch && t.Data == nil:
		return d, newError(statusInvalidArgument, op, "%s: nil libtorch tensor handle", field)
	case t.DType == DTypeTorch:
		return C.pb_tensor{data: t.Data, dtype: C.int32_t(t.DType), device: C.int32_t(CPU)}, nil
	case t.Len < 0:
		return d, newError(statusInvalidArgument, op, "%s: negative Len %d", field, t.Len)
	case t.Data == nil && t.Len > 0:
		return d, newError(statusInvalidArgument, op, "%s: nil Data with Len %d", field, t.Len)
	case t.DType < DTypeFloat32 || t.DType > DTypeInt64:
		return d, newError(statusInvalidArgument, op, "%s: unknown DType %d (use DTypeFloat32 ... DTypeInt64)", field, int32(t.DType))
	case t.Device < CPU:
		return d, newError(statusInvalidArgument, op, "%s: Device %d is neither CPU (-1) nor a CUDA index", field, t.Device)
	case async && t.goMemory:
		return d, newError(statusInvalidArgument, op, "%s: Go memory (from TensorOf) cannot be kept by C after "+
			"the call returns, as an asynchronous call does; use a Buffer or memory the program owns outside Go", field)
	}
	if t.Data != nil {
		pin.Pin(t.Data) // a no-op for memory outside Go
	}
	return C.pb_tensor{data: t.Data, count: C.int64_t(t.Len), dtype: C.int32_t(t.DType), device: C.int32_t(t.Device)}, nil
}

// tensorArray describes srcs as one C array (its first element; nil when srcs is
// empty, as C takes NULL then), element i named field[i] in errors. Go memory is
// pinned with pin.
func tensorArray(op, field string, srcs []TensorSource, async bool, pin *runtime.Pinner) (*C.pb_tensor, error) {
	if len(srcs) == 0 {
		return nil, nil
	}
	descs := make([]C.pb_tensor, len(srcs))
	for i, s := range srcs {
		var err error
		if descs[i], err = tensorDesc(op, field+"["+strconv.Itoa(i)+"]", s, async, pin); err != nil {
			return nil, err
		}
	}
	return &descs[0], nil
}

// tensorCall checks g and the tensors (named by fields) and makes the call with
// their descriptors, under ctx; async calls also get a Work.
func tensorCall(ctx context.Context, name string, g *Group, async bool, fields []string, srcs []TensorSource,
	call func(g *C.pb_group, d []C.pb_tensor, w **C.pb_work, msg **C.char) C.int) (*Work, error) {
	gh, err := g.handle(name)
	if err != nil {
		return nil, err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	descs := make([]C.pb_tensor, len(srcs))
	for i, s := range srcs {
		if descs[i], err = tensorDesc(name, fields[i], s, async, &pin); err != nil {
			return nil, err
		}
	}
	var h *C.pb_work
	err = g.run(ctx, name, func() error {
		var msg *C.char
		return check(name, call(gh, descs, &h, &msg), msg)
	})
	if err != nil || !async {
		return nil, err
	}
	w := &Work{op: name}
	w.h = h
	return w, nil
}

// AllReduceTensor is AllReduce on t's memory, in place.
func AllReduceTensor(g *Group, t TensorSource, op Op) error {
	return allReduceTensor(context.Background(), "AllReduceTensor", g, t, op)
}

// AllReduceTensorContext is AllReduceTensor under ctx (see Contexts): a ctx that ends while it
// waits aborts g.
func AllReduceTensorContext(ctx context.Context, g *Group, t TensorSource, op Op) error {
	return allReduceTensor(ctx, "AllReduceTensorContext", g, t, op)
}

func allReduceTensor(ctx context.Context, name string, g *Group, t TensorSource, op Op) error {
	_, err := tensorCall(ctx, name, g, false, []string{"tensor"}, []TensorSource{t},
		func(g *C.pb_group, d []C.pb_tensor, _ **C.pb_work, msg **C.char) C.int {
			return C.pbgo_all_reduce(g, &d[0], C.int32_t(op), msg)
		})
	return err
}

// BroadcastTensor is Broadcast of t's memory from rank root, in place.
func BroadcastTensor(g *Group, t TensorSource, root int) error {
	return broadcastTensor(context.Background(), "BroadcastTensor", g, t, root)
}

// BroadcastTensorContext is BroadcastTensor under ctx (see Contexts): a ctx that ends while it
// waits aborts g.
func BroadcastTensorContext(ctx context.Context, g *Group, t TensorSource, root int) error {
	return broadcastTensor(ctx, "BroadcastTensorContext", g, t, root)
}

func broadcastTensor(ctx context.Context, name string, g *Group, t TensorSource, root int) error {
	r, err := toInt32(name, "root", root)
	if err != nil {
		return err
	}
	_, err = tensorCall(ctx, name, g, false, []string{"tensor"}, []TensorSource{t},
		func(g *C.pb_group, d []C.pb_tensor, _ **C.pb_work, msg **C.char) C.int {
			return C.pbgo_broadcast(g, &d[0], r, msg)
		})
	return err
}

// AllGatherTensor is AllGather from send into recv (Size() times send's length).
func AllGatherTensor(g *Group, send, recv TensorSource) error {
	return allGatherTensor(context.Background(), "AllGatherTensor", g, send, recv)
}

// AllGatherTensorContext is AllGatherTensor under ctx (see Contexts): a ctx that ends while it
// waits aborts g.
func AllGatherTensorContext(ctx context.Context, g *Group, send, recv TensorSource) error {
	return allGatherTensor(ctx, "AllGatherTensorContext", g, send, recv)
}

func allGatherTensor(ctx context.Context, name string, g *Group, send, recv TensorSource) error {
	_, err := tensorCall(ctx, name, g, false, []string{"send", "recv"}, []TensorSource{send, recv},
		func(g *C.pb_group, d []C.pb_tensor, _ **C.pb_work, msg **C.char) C.int {
			return C.pbgo_all_gather(g, &d[0], &d[1], msg)
		})
	return err
}

// ReduceScatterTensor is ReduceScatter from send into recv.
func ReduceScatterTensor(g *Group, send, recv TensorSource, op Op) error {
	return reduceScatterTensor(context.Background(), "ReduceScatterTensor", g, send, recv, op)
}

// ReduceScatterTensorContext is ReduceScatterTensor under ctx (see Contexts): a ctx that ends while it
// waits aborts g.
func ReduceScatterTensorContext(ctx context.Context, g *Group, send, recv TensorSource, op Op) error {
	return reduceScatterTensor(ctx, "ReduceScatterTensorContext", g, send, recv, op)
}

func reduceScatterTensor(ctx context.Context, name string, g *Group, send, recv TensorSource, op Op) error {
	_, err := tensorCall(ctx, name, g, false, []string{"send", "recv"}, []TensorSource{send, recv},
		func(g *C.pb_group, d []C.pb_tensor, _ **C.pb_work, msg **C.char) C.int {
			return C.pbgo_reduce_scatter(g, &d[0], &d[1], C.int32_t(op), msg)
		})
	return err
}

// SendTensor is Send of t's memory to rank dst.
func SendTensor(g *Group, t TensorSource, dst, tag int) error {
	return sendTensor(context.Background(), "SendTensor", g, t, dst, tag)
}

// SendTensorContext is SendTensor under ctx (see Contexts): a ctx that ends while it
// waits aborts g.
func SendTensorContext(ctx context.Context, g *Group, t TensorSource, dst, tag int) error {
	return sendTensor(ctx, "SendTensorContext", g, t, dst, tag)
}

func sendTensor(ctx context.Context, name string, g *Group, t TensorSource, dst, tag int) error {
	d, tg, err := peerAndTag(name, "destination", dst, tag)
	if err != nil {
		return err
	}
	_, err = tensorCall(ctx, name, g, false, []string{"tensor"}, []TensorSource{t},
		func(g *C.pb_group, ds []C.pb_tensor, _ **C.pb_work, msg **C.char) C.int {
			return C.pbgo_send(g, &ds[0], d, tg, msg)
		})
	return err
}

// RecvTensor is Recv into t's memory from rank src.
func RecvTensor(g *Group, t TensorSource, src, tag int) error {
	return recvTensor(context.Background(), "RecvTensor", g, t, src, tag)
}

// RecvTensorContext is RecvTensor under ctx (see Contexts): a ctx that ends while it
// waits aborts g.
func RecvTensorContext(ctx context.Context, g *Group, t TensorSource, src, tag int) error {
	return recvTensor(ctx, "RecvTensorContext", g, t, src, tag)
}

func recvTensor(ctx context.Context, name string, g *Group, t TensorSource, src, tag int) error {
	s, tg, err := peerAndTag(name, "source", src, tag)
	if err != nil {
		return err
	}
	_, err = tensorCall(ctx, name, g, false, []string{"tensor"}, []TensorSource{t},
		func(g *C.pb_group, ds []C.pb_tensor, _ **C.pb_work, msg **C.char) C.int {
			return C.pbgo_recv(g, &ds[0], s, tg, msg)
		})
	return err
}

// AllReduceTensorAsync starts AllReduceTensor. t's memory must not be Go memory,
// and must stay valid and untouched until the Work completes.
func AllReduceTensorAsync(g *Group, t TensorSource, op Op) (*Work, error) {
	return tensorCall(context.Background(), "AllReduceTensorAsync", g, true, []string{"tensor"}, []TensorSource{t},
		func(g *C.pb_group, d []C.pb_tensor, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_all_reduce_tensor_async(g, &d[0], C.int32_t(op), w, msg)
		})
}

// BroadcastTensorAsync starts BroadcastTensor; see AllReduceTensorAsync for the memory.
func BroadcastTensorAsync(g *Group, t TensorSource, root int) (*Work, error) {
	r, err := toInt32("BroadcastTensorAsync", "root", root)
	if err != nil {
		return nil, err
	}
	return tensorCall(context.Background(), "BroadcastTensorAsync", g, true, []string{"tensor"}, []TensorSource{t},
		func(g *C.pb_group, d []C.pb_tensor, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_broadcast_tensor_async(g, &d[0], r, w, msg)
		})
}

// AllGatherTensorAsync starts AllGatherTensor; see AllReduceTensorAsync for the memory.
func AllGatherTensorAsync(g *Group, send, recv TensorSource) (*Work, error) {
	return tensorCall(context.Background(), "AllGatherTensorAsync", g, true, []string{"send", "recv"}, []TensorSource{send, recv},
		func(g *C.pb_group, d []C.pb_tensor, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_all_gather_tensor_async(g, &d[0], &d[1], w, msg)
		})
}

// ReduceScatterTensorAsync starts ReduceScatterTensor; see AllReduceTensorAsync for the memory.
func ReduceScatterTensorAsync(g *Group, send, recv TensorSource, op Op) (*Work, error) {
	return tensorCall(context.Background(), "ReduceScatterTensorAsync", g, true, []string{"send", "recv"}, []TensorSource{send, recv},
		func(g *C.pb_group, d []C.pb_tensor, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_reduce_scatter_tensor_async(g, &d[0], &d[1], C.int32_t(op), w, msg)
		})
}

// ISendTensor starts SendTensor; see AllReduceTensorAsync for the memory.
func ISendTensor(g *Group, t TensorSource, dst, tag int) (*Work, error) {
	d, tg, err := peerAndTag("ISendTensor", "destination", dst, tag)
	if err != nil {
		return nil, err
	}
	return tensorCall(context.Background(), "ISendTensor", g, true, []string{"tensor"}, []TensorSource{t},
		func(g *C.pb_group, ds []C.pb_tensor, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_isend_tensor(g, &ds[0], d, tg, w, msg)
		})
}

// IRecvTensor starts RecvTensor; see AllReduceTensorAsync for the memory.
func IRecvTensor(g *Group, t TensorSource, src, tag int) (*Work, error) {
	s, tg, err := peerAndTag("IRecvTensor", "source", src, tag)
	if err != nil {
		return nil, err
	}
	return tensorCall(context.Background(), "IRecvTensor", g, true, []string{"tensor"}, []TensorSource{t},
		func(g *C.pb_group, ds []C.pb_tensor, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_irecv_tensor(g, &ds[0], s, tg, w, msg)
		})
}

// BroadcastParamsTensors is BroadcastParams on tensors: rank root's contents are
// copied into every rank's, in place, coalesced into a few broadcasts per dtype.
func BroadcastParamsTensors(g *Group, params []TensorSource, root int) error {
	return broadcastParamsTensors(context.Background(), "BroadcastParamsTensors", g, params, root)
}

// BroadcastParamsTensorsContext is BroadcastParamsTensors under ctx (see Contexts): a ctx that ends while it
// waits aborts g.
func BroadcastParamsTensorsContext(ctx context.Context, g *Group, params []TensorSource, root int) error {
	return broadcastParamsTensors(ctx, "BroadcastParamsTensorsContext", g, params, root)
}

func broadcastParamsTensors(ctx context.Context, name string, g *Group, params []TensorSource, root int) error {
	r, err := toInt32(name, "root", root)
	if err != nil {
		return err
	}
	n, err := toInt32(name, "parameter count", len(params))
	if err != nil {
		return err
	}
	fields := make([]string, len(params))
	for i := range fields {
		fields[i] = "params[" + strconv.Itoa(i) + "]"
	}
	_, err = tensorCall(ctx, name, g, false, fields, params,
		func(g *C.pb_group, d []C.pb_tensor, _ **C.pb_work, msg **C.char) C.int {
			var pd *C.pb_tensor
			if len(d) > 0 {
				pd = &d[0]
			}
			return C.pbgo_broadcast_params(g, n, pd, r, msg)
		})
	return err
}
