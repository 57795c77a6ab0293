package pybridge

/*
#include "pbgo_reducer.h"
*/
import "C"

import (
	"context"
	"runtime"
	"time"
	"unsafe"
)

// ParamSpec describes one parameter's gradient: Len elements of type DType.
// Shape (optional, row-major, its product equal to Len) matters to hooks that
// compress matrices, such as WithPowerSGD.
type ParamSpec struct {
	Len   int
	DType DType
	Shape []int
}

// Params returns specs for parameters of element type T with the given lengths.
func Params[T Float](lens ...int) []ParamSpec {
	specs := make([]ParamSpec, len(lens))
	for i, n := range lens {
		specs[i] = ParamSpec{Len: n, DType: DTypeOf[T]()}
	}
	return specs
}

// Reducer averages (or sums) gradients over all ranks, bucket by bucket, while
// the program's backward pass is still running. The library owns the gradient
// memory: Grad returns a slice over it. An iteration is
//
//	for each parameter i, in the order backward produces its gradient:
//		g, _ := r.Grad(i)   // write the gradient into g
//		r.MarkReady(i)      // the bucket's allreduce starts once it is complete
//	r.Wait(0)               // the Grad slices now hold the averaged gradients
//
// Every rank must mark the same gradients (in any order) and call Wait the same
// number of times. After the first Wait the buckets may be rebuilt, once, in the
// order gradients became ready on rank 0 (see Generation), and slices obtained
// before it then no longer take part: call Grad again after Wait rather than
// keeping slices across iterations (Grad itself is cheap and never calls into
// the library).
//
// The methods may be called from any goroutine. Marks of one iteration may come
// from several goroutines, but the program must not mark gradients of the next
// iteration before Wait has returned, nor write a gradient between marking it
// and Wait.
type Reducer struct {
	// Its mu also guards views and gen: calls hold it for reading, Wait and Close for writing.
	cHandle[*C.pb_reducer]
	specs    []ParamSpec
	views    []unsafe.Pointer // library memory of each gradient, for the current generation
	device   int              // where the buckets live: CPU, or a CUDA device under nccl
	gen      int64
	attached bool   // AttachReducer: backward, not Wait, moves to a new generation
	group    *Group // the group its collectives run on: what a ...Context call aborts
}

// NewReducer creates a reducer over gradients described by params, configured
// by opts, in one call into the library. The buckets live in host memory, so
// the group must use the gloo backend.
//
// It is a collective: every rank creates its reducers in the same order with the
// same params (shapes included) and options. When anything differs, the hook
// and its settings and gossip included (say WithPowerSGD on one rank and
// WithHook(HookFP16) on another), every rank gets ErrInvalidArgument naming the
// settings that differ.
func NewReducer(g *Group, params []ParamSpec, opts ...ReducerOption) (*Reducer, error) {
	return newReducer(context.Background(), "NewReducer", g, params, opts)
}

// NewReducerContext is NewReducer under ctx (see Contexts): a ctx that ends while
// it waits for the other ranks aborts g.
func NewReducerContext(ctx context.Context, g *Group, params []ParamSpec, opts ...ReducerOption) (*Reducer, error) {
	return newReducer(ctx, "NewReducerContext", g, params, opts)
}

func newReducer(ctx context.Context, op string, g *Group, params []ParamSpec, opts []ReducerOption) (*Reducer, error) {
	gh, c, n, err := reducerArgs(op, g, opts, len(params))
	if err != nil {
		return nil, err
	}
	counts := make([]C.int64_t, len(params))
	dtypes := make([]C.int32_t, len(params))
	for i, p := range params {
		if p.Len < 0 {
			return nil, newError(statusInvalidArgument, op, "parameter %d: negative length %d", i, p.Len)
		}
		counts[i], dtypes[i] = C.int64_t(p.Len), C.int32_t(p.DType)
	}
	if err := fillShapes(op, params, &c.o); err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(c.o.ndims))
	defer C.free(unsafe.Pointer(c.o.dims))
	defer c.withCStrings()()
	var pc *C.int64_t
	var pd *C.int32_t
	if len(params) > 0 {
		pc, pd = &counts[0], &dtypes[0]
	}
	var h *C.pb_reducer
	err = g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_reducer_create(gh, n, pc, pd, &c.o, &h, &msg), msg)
	})
	r := &Reducer{specs: append([]ParamSpec(nil), params...), gen: -1, group: g}
	return r.made(op, h, err)
}

// made finishes a reducer the library created as h (or failed to, with err).
func (r *Reducer) made(op string, h *C.pb_reducer, err error) (*Reducer, error) {
	if err == nil && h != nil {
		r.h = h
		err = r.refresh(op)
	}
	if err != nil {
		if h != nil { // made by a call whose context ended, or not readable: of no use
			C.pbgo_reducer_close(h, nil)
		}
		return nil, err
	}
	return r, nil
}

// reducerArgs is what NewReducer and AttachReducer begin with: the group's handle,
// opts applied over the C defaults, and the parameter count as C takes it.
func reducerArgs(op string, g *Group, opts []ReducerOption, nparams int) (*C.pb_group, *reducerConfig, C.int32_t, error) {
	gh, err := g.handle(op)
	if err != nil {
		return nil, nil, 0, err
	}
	c := newReducerConfig(opts)
	if err := c.err(op); err != nil {
		return nil, nil, 0, err
	}
	n, err := toInt32(op, "parameter count", nparams)
	return gh, c, n, err
}

// AttachReducer attaches a reducer to a libtorch model's parameters, named by
// handle (TorchTensor), in one call: libtorch's own backward then reduces the
// gradients. A post-accumulate-grad hook on each parameter (what torch DDP's
// reducer installs) marks its gradient ready as soon as autograd has finished
// it, inside libtorch with no callback into Go, so its bucket's allreduce
// overlaps the rest of backward; when backward returns, each parameter's grad
// holds the average over ranks. The program calls no MarkReady, Wait or
// BindGrads, and binds nothing again after its optimizer's zero_grad.
//
// By default each grad stays the program's own tensor, copied into its bucket
// and back (torch DDP's default); WithGradAsBucketView makes each grad a view of
// its bucket (nothing copied). Call Wait(0) after each backward: nil at once,
// or the failure of the reduction as a *pybridge.Error (ErrTimeout, ErrComm,
// ErrMembership). A bucket that cannot start fails backward itself (gotch
// returns pybridge's message as an error); a failure seen as backward ends is
// kept for Wait, and the next backward fails with it if nobody asked. Join,
// GradTensor and the elastic reset work as for NewReducer; Close removes the
// hooks and gives each parameter a grad of its own. The
// library holds references to the parameters, so the program's handles may be
// freed while the reducer lives.
//
// Each parameter must be a leaf tensor that requires grad, of a floating-point
// dtype, on the group's device. It is a collective, as NewReducer.
func AttachReducer(g *Group, params []TensorSource, opts ...ReducerOption) (*Reducer, error) {
	return attachReducer(context.Background(), "AttachReducer", g, params, opts)
}

// AttachReducerContext is AttachReducer under ctx (see Contexts): a ctx that ends
// while it waits for the other ranks aborts g.
func AttachReducerContext(ctx context.Context, g *Group, params []TensorSource, opts ...ReducerOption) (*Reducer, error) {
	return attachReducer(ctx, "AttachReducerContext", g, params, opts)
}

func attachReducer(ctx context.Context, op string, g *Group, params []TensorSource, opts []ReducerOption) (*Reducer, error) {
	gh, c, n, err := reducerArgs(op, g, opts, len(params))
	if err != nil {
		return nil, err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	pd, err := tensorArray(op, "params", params, true, &pin)
	if err != nil {
		return nil, err
	}
	defer c.withCStrings()()
	var h *C.pb_reducer
	err = g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_reducer_attach(gh, n, pd, &c.o, &h, &msg), msg)
	})
	r := &Reducer{specs: make([]ParamSpec, len(params)), gen: -1, attached: true, group: g}
	for i := range r.specs {
		r.specs[i].Len = -1 // read from the library's views by refresh
	}
	return r.made(op, h, err)
}

// fillShapes points o.ndims and o.dims at C copies of the params' shapes (nil
// when none has one); the caller frees them.
func fillShapes(op string, params []ParamSpec, o *C.pb_reducer_options) error {
	total := 0
	for i, p := range params {
		n := 1
		for _, d := range p.Shape {
			n *= d
		}
		if len(p.Shape) > 0 && n != p.Len {
			return newError(statusInvalidArgument, op, "parameter %d: shape %v holds %d elements, Len is %d", i, p.Shape, n, p.Len)
		}
		total += len(p.Shape)
	}
	if total == 0 {
		return nil
	}
	// C memory: the options struct may hold pointers only to memory Go does not own.
	ndims := unsafe.Slice((*C.int32_t)(C.malloc(C.size_t(len(params))*C.size_t(unsafe.Sizeof(C.int32_t(0))))), len(params))
	dims := unsafe.Slice((*C.int64_t)(C.malloc(C.size_t(total)*C.size_t(unsafe.Sizeof(C.int64_t(0))))), total)
	at := 0
	for i, p := range params {
		ndims[i] = C.int32_t(len(p.Shape))
		for _, d := range p.Shape {
			dims[at] = C.int64_t(d)
			at++
		}
	}
	o.ndims, o.dims = &ndims[0], &dims[0]
	return nil
}

// refresh fetches every view's address; r.mu is held for writing (or r is new).
func (r *Reducer) refresh(op string) error {
	n := len(r.specs)
	if n == 0 {
		r.gen = 0
		return nil
	}
	descs := (*C.pb_tensor)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.pb_tensor{}))))
	if descs == nil {
		return newError(statusInternal, op, "out of memory")
	}
	defer C.free(unsafe.Pointer(descs))
	var gen C.int64_t
	var msg *C.char
	if err := check(op, C.pbgo_reducer_views(r.h, C.int32_t(n), descs, &gen, &msg), msg); err != nil {
		return err
	}
	views := make([]unsafe.Pointer, n)
	for i, d := range unsafe.Slice(descs, n) {
		r.device = int(d.device)
		if r.specs[i].Len < 0 { // AttachReducer: the parameter as libtorch describes it
			r.specs[i].Len, r.specs[i].DType = int(d.count), DType(d.dtype)
		}
		if int(d.count) != r.specs[i].Len || DType(d.dtype) != r.specs[i].DType {
			return newError(statusInternal, op, "library describes gradient %d as %d x %v, want %d x %v",
				i, int(d.count), DType(d.dtype), r.specs[i].Len, r.specs[i].DType)
		}
		views[i] = d.data
	}
	r.views, r.gen = views, int64(gen)
	return nil
}

// reread fetches the gradient views again: an elastic reset may lay the buckets out anew.
func (r *Reducer) reread(op string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.open() {
		return nil
	}
	return r.refresh(op)
}

// rhandle returns the C handle while holding r.mu for reading; the caller must
// RUnlock when it returns no error. A closed reducer's handle is never passed on.
func (r *Reducer) rhandle(op string) (*C.pb_reducer, error) {
	if r == nil {
		return nil, nilError(op, "Reducer")
	}
	return r.acquireShared(op, "reducer is closed")
}

// NumParams returns the number of gradients.
func (r *Reducer) NumParams() int {
	if r == nil {
		return 0
	}
	return len(r.specs)
}

// Generation counts the bucket layouts: 0 at creation, 1 once the first Wait
// rebuilt the buckets in the order gradients became ready on rank 0. The
// rebuild happens at most once and only when that order gives other buckets:
// when it gives the same ones (or WithoutRebuild), the generation stays 0 and
// the slices stay valid. Slices from Grad are tied to the generation in which
// they were obtained.
func (r *Reducer) Generation() int64 {
	if r == nil {
		return 0
	}
	r.current("Reducer.Generation")
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.gen
}

// current brings an attached reducer's views up to date: libtorch's backward, not
// Wait, may have rebuilt its buckets. A no-op for other reducers (Wait does it).
func (r *Reducer) current(op string) error {
	if !r.attached {
		return nil
	}
	return r.reread(op)
}

// Grad returns gradient i of a float32 parameter as a slice over library
// memory; see GradAs.
func (r *Reducer) Grad(i int) ([]float32, error) { return GradAs[float32](r, i) }

// GradAs returns gradient i as a slice over library memory, of element type T,
// which must match the parameter's DType. Write the gradient into it before
// MarkReady(i); read the reduced gradient from it after Wait. The slice is
// valid until the generation changes or the reducer is closed.
func GradAs[T Float](r *Reducer, i int) ([]T, error) {
	const op = "Reducer.Grad"
	if err := r.current(op); err != nil {
		return nil, err
	}
	if _, err := r.rhandle(op); err != nil {
		return nil, err
	}
	defer r.mu.RUnlock()
	if i < 0 || i >= len(r.specs) {
		return nil, newError(statusInvalidArgument, op, "gradient index %d is out of range for %d parameters", i, len(r.specs))
	}
	s := r.specs[i]
	if want := DTypeOf[T](); s.DType != want {
		return nil, newError(statusInvalidArgument, op, "gradient %d is %v, not %v", i, s.DType, want)
	}
	if r.device != CPU {
		return nil, newError(statusInvalidArgument, op, "gradient buckets are on CUDA device %d: a Go slice "+
			"needs host memory; use GradTensor", r.device)
	}
	if s.Len == 0 {
		return []T{}, nil
	}
	return unsafe.Slice((*T)(r.views[i]), s.Len), nil
}

// GradTensor describes gradient i's place in its bucket (host memory, or CUDA
// memory under nccl), so that a tensor library can make the parameter's
// gradient a view of it (libtorch: from_blob) and backward writes straight into
// the bucket: torch DDP's gradient_as_bucket_view. Valid, like Grad's slices,
// until the generation changes or the reducer is closed.
func (r *Reducer) GradTensor(i int) (Tensor, error) {
	const op = "Reducer.GradTensor"
	if err := r.current(op); err != nil {
		return Tensor{}, err
	}
	if _, err := r.rhandle(op); err != nil {
		return Tensor{}, err
	}
	defer r.mu.RUnlock()
	if i < 0 || i >= len(r.specs) {
		return Tensor{}, newError(statusInvalidArgument, op, "gradient index %d is out of range for %d parameters", i, len(r.specs))
	}
	s := r.specs[i]
	return Tensor{Data: r.views[i], Len: s.Len, DType: s.DType, Device: r.device}, nil
}

// BindGrads makes the reducer reduce the program's own gradient memory (torch
// DDP's default mode): from then on MarkReady(i) first copies grads[i] into its
// bucket, and Wait copies the reduced gradients back into grads. One tensor per
// parameter, of its length and DType, on the buckets' device. The reducer keeps
// the pointers until the next BindGrads or Close, so Go memory (TensorOf) is
// refused: pass libtorch or C memory. BindGrads(nil) unbinds. Between iterations.
// (The other mode copies nothing: make the gradients views of GradTensor.)
func (r *Reducer) BindGrads(grads []TensorSource) error {
	const op = "Reducer.BindGrads"
	h, err := r.rhandle(op)
	if err != nil {
		return err
	}
	defer r.mu.RUnlock()
	n, err := toInt32(op, "gradient count", len(grads))
	if err != nil {
		return err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	pd, err := tensorArray(op, "grads", grads, true, &pin)
	if err != nil {
		return err
	}
	var msg *C.char
	return check(op, C.pbgo_reducer_bind_grads(h, n, pd, &msg), msg)
}

// CHandle returns the reducer's pb_reducer handle for C or C++ code in the same
// process, e.g. a libtorch autograd hook that calls pb_reducer_mark_ready itself
// (no Go callback during backward). It is valid until Close; the C code must not
// use it after Close nor call pb_reducer_close on it. Nil for a closed reducer.
func (r *Reducer) CHandle() unsafe.Pointer {
	if r == nil {
		return nil
	}
	h, err := r.rhandle("Reducer.CHandle")
	if err != nil {
		return nil
	}
	r.mu.RUnlock()
	return unsafe.Pointer(h)
}

// MarkReady reports that gradient i of this iteration is written. When that
// completes its bucket, the bucket's allreduce starts; MarkReady does not wait
// for it. Marking a gradient twice in one iteration is ErrInvalidArgument.
func (r *Reducer) MarkReady(i int) error {
	return r.markReady(context.Background(), "Reducer.MarkReady", i)
}

// MarkReadyContext is MarkReady under ctx (see Contexts). MarkReady waits on the
// other ranks only where it must agree first: the settings after a hook or shape
// changed, and WithJoinDivideByActive's count at an iteration's first mark. A ctx
// that ends while it waits aborts the reducer's group.
func (r *Reducer) MarkReadyContext(ctx context.Context, i int) error {
	return r.markReady(ctx, "Reducer.MarkReadyContext", i)
}

func (r *Reducer) markReady(ctx context.Context, op string, i int) error {
	h, err := r.rhandle(op)
	if err != nil {
		return err
	}
	defer r.mu.RUnlock()
	idx, err := toInt32(op, "index", i)
	if err != nil {
		return err
	}
	return underContext(ctx, op, r.group, func() error {
		var msg *C.char
		return check(op, C.pbgo_reducer_mark_ready(h, idx, &msg), msg)
	})
}

// Wait blocks until every bucket of this iteration is reduced; then the
// gradients (fetch them with Grad) hold the average (or sum) over ranks. A
// timeout of zero or less waits up to the group's timeout.
//
// Gradients not marked ready make Wait fail with ErrInvalidArgument listing
// their indices and this rank (torch DDP's "Expected to have finished reduction
// in the prior iteration" error) unless the reducer was created WithAllowUnused;
// the iteration is then abandoned and the next MarkReady starts a new one. A failed
// reduction returns ErrTimeout or ErrComm; so does a timeout that passes, which gives
// the iteration up (WaitContext keeps it).
func (r *Reducer) Wait(timeout time.Duration) error {
	const op = "Reducer.Wait"
	if r == nil {
		return nilError(op, "Reducer")
	}
	h, err := r.acquire(op, "reducer is closed")
	if err != nil {
		return err
	}
	defer r.mu.Unlock()
	secs := 0.0
	if timeout > 0 {
		secs = timeout.Seconds()
	}
	var gen C.int64_t
	var msg *C.char
	err = check(op, C.pbgo_reducer_wait_generation(h, C.double(secs), &gen, &msg), msg)
	if int64(gen) != r.gen {
		if rerr := r.refresh(op); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

// WaitContext is Wait that also returns when ctx is done, with ErrCanceled
// wrapping ctx's error (errors.Is(err, context.DeadlineExceeded) or
// context.Canceled), as database/sql's QueryContext does. Waiting can be given up
// without aborting anything: the buckets in flight go on, and the iteration stays,
// so that a later Wait or WaitContext returns its result (mark no more gradients
// of it meanwhile). A ctx without deadline still waits at most the group's
// timeout, as Wait(0) does.
func (r *Reducer) WaitContext(ctx context.Context) error {
	const op = "Reducer.WaitContext"
	if r == nil {
		return nilError(op, "Reducer")
	}
	for {
		if err := waitEnded(ctx, op, "the buckets in flight go on: a later Wait or WaitContext returns "+
			"their result"); err != nil {
			return err
		}
		done, err := r.poll(op, waitSlice)
		if err != nil || done {
			return err
		}
	}
}

// poll waits up to slice for this iteration's buckets without giving the
// iteration up (pb_reducer_poll): done once they are reduced.
func (r *Reducer) poll(op string, slice time.Duration) (bool, error) {
	h, err := r.acquire(op, "reducer is closed")
	if err != nil {
		return false, err
	}
	defer r.mu.Unlock()
	var done C.int32_t
	var gen C.int64_t
	var msg *C.char
	err = check(op, C.pbgo_reducer_poll_generation(h, C.double(slice.Seconds()), &done, &gen, &msg), msg)
	if int64(gen) != r.gen {
		if rerr := r.refresh(op); rerr != nil && err == nil {
			err = rerr
		}
	}
	return done != 0, err
}

// Zero sets every gradient to zero.
func (r *Reducer) Zero() error {
	const op = "Reducer.Zero"
	h, err := r.rhandle(op)
	if err != nil {
		return err
	}
	defer r.mu.RUnlock()
	var msg *C.char
	return check(op, C.pbgo_reducer_zero(h, &msg), msg)
}

// Close releases the reducer, its gradient memory and its hook's state (the
// gossip thread and node groups); slices from Grad must not be used afterwards.
// Closing again returns nil.
func (r *Reducer) Close() error {
	const op = "Reducer.Close"
	if r == nil {
		return nilError(op, "Reducer")
	}
	return r.close(op, func(h *C.pb_reducer, msg **C.char) C.int {
		r.views = nil
		return C.pbgo_reducer_close(h, msg)
	})
}
