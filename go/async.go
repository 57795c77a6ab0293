package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"sync"
	"time"
	"unsafe"
)

// Buffer is host memory owned by the library, for asynchronous operations:
// cgo forbids C to keep a Go pointer after a call returns, so an operation
// that outlives its call works on a Buffer instead of a Go slice.
//
// Data is safe to read and write except while an operation on the buffer is
// in flight (after it starts and before its Work reports done).
type Buffer[T Numeric] struct {
	mu   sync.Mutex
	h    *C.pb_buffer
	data unsafe.Pointer // C memory, valid until Close
	n    int
}

// NewBuffer allocates n zeroed elements of type T in host memory.
func NewBuffer[T Numeric](n int) (*Buffer[T], error) {
	const op = "NewBuffer"
	if n < 0 {
		return nil, newError(statusInvalidArgument, op, "negative element count %d", n)
	}
	var h *C.pb_buffer
	var data unsafe.Pointer
	var count C.int64_t
	var msg *C.char
	if err := check(op, C.pbgo_buffer_new(dtypeOf[T](), C.int64_t(n), &h, &data, &count, &msg), msg); err != nil {
		return nil, err
	}
	if int(count) != n || (n > 0 && data == nil) {
		C.pbgo_buffer_free(h, nil)
		return nil, newError(statusInternal, op, "library returned %d elements at %p for %d requested", count, data, n)
	}
	return &Buffer[T]{h: h, data: data, n: n}, nil
}

// Data returns the buffer's memory as a slice (nil once the buffer is closed).
// The slice is not valid after Close.
func (b *Buffer[T]) Data() []T {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.h == nil || b.n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(b.data), b.n)
}

// Len returns the number of elements.
func (b *Buffer[T]) Len() int {
	if b == nil {
		return 0
	}
	return b.n
}

// Close releases the buffer; closing again returns nil. Memory still used by
// an operation in flight is released when that operation finishes, but slices
// from Data must not be used after Close.
func (b *Buffer[T]) Close() error {
	const op = "Buffer.Close"
	if b == nil {
		return newError(statusInvalidArgument, op, "nil *Buffer")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.h == nil {
		return nil
	}
	h := b.h
	b.h, b.data = nil, nil
	var msg *C.char
	return check(op, C.pbgo_buffer_free(h, &msg), msg)
}

// handle is checked in Go because a freed C handle must never reach the library
// again: it could alias a later allocation.
func (b *Buffer[T]) handle(op string) (*C.pb_buffer, error) {
	if b == nil {
		return nil, newError(statusInvalidArgument, op, "nil *Buffer")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.h == nil {
		return nil, newError(statusClosed, op, "buffer is closed")
	}
	return b.h, nil
}

// Work is an asynchronous operation in flight. Its buffers hold the result
// once Wait returns nil or Test reports done without error. Close it when done.
type Work struct {
	mu sync.Mutex
	h  *C.pb_work
	op string
}

// Wait blocks until the operation finishes and returns its error, e.g. ErrComm
// when a peer died. A timeout of zero (or less) waits up to the group's
// timeout. When the timeout passes first Wait returns ErrTimeout, which means
// "not finished yet": the operation goes on, and a later Wait or Test reports
// its result (as Python's Work.wait and concurrent.futures do).
func (w *Work) Wait(timeout time.Duration) error {
	op := "Work.Wait"
	h, err := w.handle(op)
	if err != nil {
		return err
	}
	secs := 0.0
	if timeout > 0 {
		secs = timeout.Seconds()
	}
	var msg *C.char
	return check(w.op+".Wait", C.pbgo_work_wait(h, C.double(secs), &msg), msg)
}

// Test reports without blocking whether the operation has finished, and its
// error if it finished with one. Poll until done is true or err is non-nil.
func (w *Work) Test() (bool, error) {
	op := "Work.Test"
	h, err := w.handle(op)
	if err != nil {
		return false, err
	}
	var done C.int32_t
	var msg *C.char
	err = check(w.op+".Test", C.pbgo_work_test(h, &done, &msg), msg)
	return done != 0, err
}

// Close releases the work handle; closing again returns nil. Closing
// unfinished work does not cancel the operation.
func (w *Work) Close() error {
	const op = "Work.Close"
	if w == nil {
		return newError(statusInvalidArgument, op, "nil *Work")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.h == nil {
		return nil
	}
	h := w.h
	w.h = nil
	var msg *C.char
	return check(op, C.pbgo_work_free(h, &msg), msg)
}

func (w *Work) handle(op string) (*C.pb_work, error) {
	if w == nil {
		return nil, newError(statusInvalidArgument, op, "nil *Work")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.h == nil {
		return nil, newError(statusClosed, op, "work is closed")
	}
	return w.h, nil
}

// start finishes an async call: the error, or the Work for the handle.
func start(op string, st C.int, h *C.pb_work, msg *C.char) (*Work, error) {
	if err := check(op, st, msg); err != nil {
		return nil, err
	}
	return &Work{h: h, op: op}, nil
}

// AllReduceAsync starts AllReduce on b's contents; see AllReduce.
//
// All ranks must start collectives in the same order; when several goroutines
// start them, the program must impose that order.
func AllReduceAsync[T Numeric](g *Group, b *Buffer[T], op Op) (*Work, error) {
	const name = "AllReduceAsync"
	gh, err := g.handle(name)
	if err != nil {
		return nil, err
	}
	bh, err := b.handle(name)
	if err != nil {
		return nil, err
	}
	var w *C.pb_work
	var msg *C.char
	st := C.pbgo_all_reduce_async(gh, bh, C.int32_t(op), &w, &msg)
	return start(name, st, w, msg)
}

// BroadcastAsync starts Broadcast of b's contents from rank root; see Broadcast.
//
// All ranks must start collectives in the same order; when several goroutines
// start them, the program must impose that order.
func BroadcastAsync[T Numeric](g *Group, b *Buffer[T], root int) (*Work, error) {
	const name = "BroadcastAsync"
	gh, err := g.handle(name)
	if err != nil {
		return nil, err
	}
	r, err := toInt32(name, "root", root)
	if err != nil {
		return nil, err
	}
	bh, err := b.handle(name)
	if err != nil {
		return nil, err
	}
	var w *C.pb_work
	var msg *C.char
	st := C.pbgo_broadcast_async(gh, bh, r, &w, &msg)
	return start(name, st, w, msg)
}

// AllGatherAsync starts AllGather from send into recv; see AllGather.
//
// All ranks must start collectives in the same order; when several goroutines
// start them, the program must impose that order.
func AllGatherAsync[T Numeric](g *Group, send, recv *Buffer[T]) (*Work, error) {
	const name = "AllGatherAsync"
	gh, err := g.handle(name)
	if err != nil {
		return nil, err
	}
	sh, err := send.handle(name)
	if err != nil {
		return nil, err
	}
	rh, err := recv.handle(name)
	if err != nil {
		return nil, err
	}
	var w *C.pb_work
	var msg *C.char
	st := C.pbgo_all_gather_async(gh, sh, rh, &w, &msg)
	return start(name, st, w, msg)
}

// ReduceScatterAsync starts ReduceScatter from send into recv; see ReduceScatter.
//
// All ranks must start collectives in the same order; when several goroutines
// start them, the program must impose that order.
func ReduceScatterAsync[T Numeric](g *Group, send, recv *Buffer[T], op Op) (*Work, error) {
	const name = "ReduceScatterAsync"
	gh, err := g.handle(name)
	if err != nil {
		return nil, err
	}
	sh, err := send.handle(name)
	if err != nil {
		return nil, err
	}
	rh, err := recv.handle(name)
	if err != nil {
		return nil, err
	}
	var w *C.pb_work
	var msg *C.char
	st := C.pbgo_reduce_scatter_async(gh, sh, rh, C.int32_t(op), &w, &msg)
	return start(name, st, w, msg)
}

// ISend starts sending b's contents to rank dst; see Send.
//
// Point-to-point operations between two ranks must be started in matching
// order on both, like collectives.
func ISend[T Numeric](g *Group, b *Buffer[T], dst, tag int) (*Work, error) {
	const name = "ISend"
	gh, err := g.handle(name)
	if err != nil {
		return nil, err
	}
	d, tg, err := peerAndTag(name, "destination", dst, tag)
	if err != nil {
		return nil, err
	}
	bh, err := b.handle(name)
	if err != nil {
		return nil, err
	}
	var w *C.pb_work
	var msg *C.char
	st := C.pbgo_isend(gh, bh, d, tg, &w, &msg)
	return start(name, st, w, msg)
}

// IRecv starts receiving into b from rank src; see Recv.
//
// Point-to-point operations between two ranks must be started in matching
// order on both, like collectives.
func IRecv[T Numeric](g *Group, b *Buffer[T], src, tag int) (*Work, error) {
	const name = "IRecv"
	gh, err := g.handle(name)
	if err != nil {
		return nil, err
	}
	s, tg, err := peerAndTag(name, "source", src, tag)
	if err != nil {
		return nil, err
	}
	bh, err := b.handle(name)
	if err != nil {
		return nil, err
	}
	var w *C.pb_work
	var msg *C.char
	st := C.pbgo_irecv(gh, bh, s, tg, &w, &msg)
	return start(name, st, w, msg)
}
