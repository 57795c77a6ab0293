package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"errors"
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
	cHandle[*C.pb_buffer]
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
	if err := check(op, C.pbgo_buffer_new_host(dtypeOf[T](), C.int64_t(n), &h, &data, &count, &msg), msg); err != nil {
		return nil, err
	}
	if int(count) != n || (n > 0 && data == nil) {
		C.pbgo_buffer_close(h, nil)
		return nil, newError(statusInternal, op, "library returned %d elements at %p for %d requested", count, data, n)
	}
	b := &Buffer[T]{data: data, n: n}
	b.h = h
	return b, nil
}

// Data returns the buffer's memory as a slice (nil once the buffer is closed).
// The slice is not valid after Close.
func (b *Buffer[T]) Data() []T {
	if b == nil {
		return nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if !b.open() || b.n == 0 {
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
		return nilError(op, "Buffer")
	}
	return b.close(op, func(h *C.pb_buffer, msg **C.char) C.int {
		b.data = nil
		return C.pbgo_buffer_close(h, msg)
	})
}

func (b *Buffer[T]) handle(op string) (*C.pb_buffer, error) {
	if b == nil {
		return nil, nilError(op, "Buffer")
	}
	return b.get(op, "buffer is closed")
}

// Work is an asynchronous operation in flight. Its buffers hold the result
// once Wait returns nil or Test reports done without error. Close it when done.
type Work struct {
	cHandle[*C.pb_work]
	op string
}

// Wait blocks until the operation finishes and returns its error, e.g. ErrComm
// when a peer died. A timeout of zero (or less) waits up to the group's
// timeout. When the timeout passes first Wait returns ErrTimeout, which means
// "not finished yet": the operation goes on, and a later Wait or Test reports
// its result (as Python's Work.wait and concurrent.futures do).
func (w *Work) Wait(timeout time.Duration) error {
	h, err := w.handle("Work.Wait")
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

// WaitContext is Wait that also returns when ctx is done, with ErrCanceled
// wrapping ctx's error (errors.Is(err, context.DeadlineExceeded) or
// context.Canceled), as database/sql's QueryContext does. Waiting can be given up
// without aborting anything: the operation goes on, and a later Wait or Test
// reports its result. A ctx without deadline still waits at most the group's
// timeout.
func (w *Work) WaitContext(ctx context.Context) error {
	op := "Work.WaitContext"
	if w != nil && w.op != "" {
		op = w.op + ".WaitContext"
	}
	for {
		if err := waitEnded(ctx, op, "the operation goes on: a later Wait or Test reports its result"); err != nil {
			return err
		}
		err := w.Wait(waitSlice)
		if !errors.Is(err, ErrTimeout) {
			return err
		}
		// ErrTimeout: either this slice passed (not finished yet) or the operation itself
		// timed out (finished, with that error); Test tells which.
		if done, terr := w.Test(); done || terr != nil {
			return terr
		}
	}
}

// waitSlice: how often WaitContext looks at its context.
const waitSlice = 20 * time.Millisecond

// waitEnded is the error of a wait (WaitContext) that ctx ended, nil while ctx goes on;
// after says what becomes of what was waited for.
func waitEnded(ctx context.Context, op, after string) error {
	if ctx == nil {
		return newError(statusInvalidArgument, op, "nil Context (pass context.Background())")
	}
	if err := ctx.Err(); err != nil {
		return &Error{Status: statusCanceled, Op: op, Msg: context.Cause(ctx).Error() + "; " + after, Err: err}
	}
	return nil
}

// Test reports without blocking whether the operation has finished, and its
// error if it finished with one. Poll until done is true or err is non-nil.
func (w *Work) Test() (bool, error) {
	h, err := w.handle("Work.Test")
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
		return nilError(op, "Work")
	}
	return w.close(op, func(h *C.pb_work, msg **C.char) C.int { return C.pbgo_work_close(h, msg) })
}

func (w *Work) handle(op string) (*C.pb_work, error) {
	if w == nil {
		return nil, nilError(op, "Work")
	}
	return w.get(op, "work is closed")
}

// bufferRef is a *Buffer[T] of any element type.
type bufferRef interface {
	handle(op string) (*C.pb_buffer, error)
}

// intArg is an int argument of an asynchronous start, named for its error.
type intArg struct {
	what string
	v    int
}

// startWork is what every asynchronous start shares: it checks, in this order, the
// group, the int arguments (converted for the C ABI) and the buffers, then start
// makes the library call with them, and its work handle becomes a *Work.
func startWork(name string, g *Group, args []intArg, bufs []bufferRef,
	start func(g *C.pb_group, args []C.int32_t, bufs []*C.pb_buffer, w **C.pb_work, msg **C.char) C.int) (*Work, error) {
	gh, err := g.handle(name)
	if err != nil {
		return nil, err
	}
	cargs := make([]C.int32_t, len(args))
	for i, a := range args {
		if cargs[i], err = toInt32(name, a.what, a.v); err != nil {
			return nil, err
		}
	}
	cbufs := make([]*C.pb_buffer, len(bufs))
	for i, b := range bufs {
		if cbufs[i], err = b.handle(name); err != nil {
			return nil, err
		}
	}
	var h *C.pb_work
	var msg *C.char
	if err := check(name, start(gh, cargs, cbufs, &h, &msg), msg); err != nil {
		return nil, err
	}
	w := &Work{op: name}
	w.h = h
	return w, nil
}

// AllReduceAsync starts AllReduce on b's contents; see AllReduce.
//
// All ranks must start collectives in the same order; when several goroutines
// start them, the program must impose that order.
func AllReduceAsync[T Numeric](g *Group, b *Buffer[T], op Op) (*Work, error) {
	return startWork("AllReduceAsync", g, nil, []bufferRef{b},
		func(g *C.pb_group, _ []C.int32_t, b []*C.pb_buffer, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_all_reduce_async(g, b[0], C.int32_t(op), w, msg)
		})
}

// BroadcastAsync starts Broadcast of b's contents from rank root; see Broadcast.
//
// All ranks must start collectives in the same order; when several goroutines
// start them, the program must impose that order.
func BroadcastAsync[T Numeric](g *Group, b *Buffer[T], root int) (*Work, error) {
	return startWork("BroadcastAsync", g, []intArg{{"root", root}}, []bufferRef{b},
		func(g *C.pb_group, a []C.int32_t, b []*C.pb_buffer, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_broadcast_async(g, b[0], a[0], w, msg)
		})
}

// AllGatherAsync starts AllGather from send into recv; see AllGather.
//
// All ranks must start collectives in the same order; when several goroutines
// start them, the program must impose that order.
func AllGatherAsync[T Numeric](g *Group, send, recv *Buffer[T]) (*Work, error) {
	return startWork("AllGatherAsync", g, nil, []bufferRef{send, recv},
		func(g *C.pb_group, _ []C.int32_t, b []*C.pb_buffer, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_all_gather_async(g, b[0], b[1], w, msg)
		})
}

// ReduceScatterAsync starts ReduceScatter from send into recv; see ReduceScatter.
//
// All ranks must start collectives in the same order; when several goroutines
// start them, the program must impose that order.
func ReduceScatterAsync[T Numeric](g *Group, send, recv *Buffer[T], op Op) (*Work, error) {
	return startWork("ReduceScatterAsync", g, nil, []bufferRef{send, recv},
		func(g *C.pb_group, _ []C.int32_t, b []*C.pb_buffer, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_reduce_scatter_async(g, b[0], b[1], C.int32_t(op), w, msg)
		})
}

// ISend starts sending b's contents to rank dst; see Send.
//
// Point-to-point operations between two ranks must be started in matching
// order on both, like collectives.
func ISend[T Numeric](g *Group, b *Buffer[T], dst, tag int) (*Work, error) {
	return startWork("ISend", g, []intArg{{"destination", dst}, {"tag", tag}}, []bufferRef{b},
		func(g *C.pb_group, a []C.int32_t, b []*C.pb_buffer, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_isend(g, b[0], a[0], a[1], w, msg)
		})
}

// IRecv starts receiving into b from rank src; see Recv.
//
// Point-to-point operations between two ranks must be started in matching
// order on both, like collectives.
func IRecv[T Numeric](g *Group, b *Buffer[T], src, tag int) (*Work, error) {
	return startWork("IRecv", g, []intArg{{"source", src}, {"tag", tag}}, []bufferRef{b},
		func(g *C.pb_group, a []C.int32_t, b []*C.pb_buffer, w **C.pb_work, msg **C.char) C.int {
			return C.pbgo_irecv(g, b[0], a[0], a[1], w, msg)
		})
}
