package pybridge

/*
#include "pbgo_reducer.h"
*/
import "C"

import (
	"context"
	"runtime"
	"strconv"
	"time"
	"unsafe"
)

// Float is the set of element types a gradient may have.
type Float interface {
	~float32 | ~float64 | Float16 | BFloat16
}

// DType is an element type (the PB_FLOAT32 ... PB_INT64 codes of pybridge.h):
// of a Tensor, or of a reducer parameter (floating point only).
type DType int32

// Element types. Gradients are one of the first four.
const (
	DTypeFloat32  DType = dtFloat32
	DTypeFloat64  DType = dtFloat64
	DTypeFloat16  DType = dtFloat16
	DTypeBFloat16 DType = dtBFloat16
	DTypeInt8     DType = dtInt8
	DTypeUint8    DType = dtUint8
	DTypeInt32    DType = dtInt32
	DTypeInt64    DType = dtInt64
)

func (d DType) String() string {
	switch d {
	case DTypeFloat32:
		return "float32"
	case DTypeFloat64:
		return "float64"
	case DTypeFloat16:
		return "float16"
	case DTypeBFloat16:
		return "bfloat16"
	case DTypeInt8:
		return "int8"
	case DTypeUint8:
		return "uint8"
	case DTypeInt32:
		return "int32"
	case DTypeInt64:
		return "int64"
	case DTypeTorch:
		return "libtorch tensor"
	}
	return "DType(" + strconv.Itoa(int(d)) + ")"
}

// DTypeOf returns the DType of T.
func DTypeOf[T Float]() DType { return DType(dtypeOf[T]()) }

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

// Compression is the wire format of float32 gradient buckets: another name for
// a Hook (CompressFP16 is HookFP16).
type Compression int32

// Gradient compression (PB_COMPRESS_* of pybridge.h, equal to the PB_HOOK_*
// codes of the same hooks). Only float32 buckets are compressed; they are
// decompressed in place after the allreduce.
const (
	NoCompression Compression = C.PB_COMPRESS_NONE
	CompressFP16  Compression = C.PB_COMPRESS_FP16
	CompressBF16  Compression = C.PB_COMPRESS_BF16
)

// reducerConfig is what the options set; NewReducer passes it to the library
// at once, as one pb_reducer_options.
type reducerConfig struct {
	capMB      float64
	firstCapMB float64
	op         Op
	flags      int32
	hook       Hook
	hookRank   int
	hookFlags  int32
	hookStart  int
	perNode    int         // WithHierarchical's ranks per node
	wire       Compression // WithHierarchicalCompression's wire type
	gossip     *gossipConfig
	badComp    *Compression // WithCompression got an unknown value
	hookName   *string      // WithHookName: a hook chosen by name (registry.go)
}

// ReducerOption configures NewReducer. Hooks, compression, PowerSGD and gossip
// choose one thing, how buckets travel: the last of them given wins.
type ReducerOption func(*reducerConfig)

// WithBucketCapMB sets the bucket size in MiB, the first bucket's too (torch DDP's
// rule). Without it, or with 0, buckets hold 25 MiB and the first 1 MiB, so that
// the first allreduce starts early. A negative or NaN size makes NewReducer fail
// with ErrInvalidArgument (bucket_cap_mb), as Python's Reducer refuses it.
func WithBucketCapMB(mb float64) ReducerOption { return func(c *reducerConfig) { c.capMB = mb } }

// WithFirstBucketCapMB sets the first bucket's size in MiB apart from the others
// (0: by WithBucketCapMB's rule).
func WithFirstBucketCapMB(mb float64) ReducerOption {
	return func(c *reducerConfig) { c.firstCapMB = mb }
}

// WithReduceOp chooses Avg (the default: gradients are averaged over ranks) or Sum.
func WithReduceOp(op Op) ReducerOption { return func(c *reducerConfig) { c.op = op } }

// WithCompression sends float32 buckets as half or bfloat16: the same as
// WithHook(HookFP16) or WithHook(HookBF16).
//
// Deprecated: use WithHook.
func WithCompression(comp Compression) ReducerOption {
	return func(c *reducerConfig) {
		c.setHook(Hook(comp))
		if comp != NoCompression && comp != CompressFP16 && comp != CompressBF16 {
			c.badComp = &comp
		}
	}
}

// WithAllowUnused lets Wait succeed when some gradients were not marked ready:
// they are reduced with whatever their views hold (Zero them for "no gradient").
func WithAllowUnused() ReducerOption {
	return func(c *reducerConfig) { c.flags |= C.PB_REDUCER_ALLOW_UNUSED }
}

// WithoutRebuild keeps the initial bucket layout (reverse parameter order)
// instead of rebuilding it once in the order gradients became ready.
func WithoutRebuild() ReducerOption {
	return func(c *reducerConfig) { c.flags |= C.PB_REDUCER_NO_REBUILD }
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
	attached bool // AttachReducer: backward, not Wait, moves to a new generation
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
	const op = "NewReducer"
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
	var o C.pb_reducer_options
	if err := c.fill(op, &o); err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(o.hook_name))
	if err := fillShapes(op, params, &o); err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(o.ndims))
	defer C.free(unsafe.Pointer(o.dims))
	var pc *C.int64_t
	var pd *C.int32_t
	if len(params) > 0 {
		pc, pd = &counts[0], &dtypes[0]
	}
	var h *C.pb_reducer
	var msg *C.char
	if err := check(op, C.pbgo_reducer_create(gh, n, pc, pd, &o, &h, &msg), msg); err != nil {
		return nil, err
	}
	r := &Reducer{specs: append([]ParamSpec(nil), params...), gen: -1}
	r.h = h
	if err := r.refresh(op); err != nil {
		C.pbgo_reducer_close(h, nil)
		return nil, err
	}
	return r, nil
}

// reducerArgs is what NewReducer and AttachReducer begin with: the group's handle,
// opts applied to the defaults, and the parameter count as C takes it.
func reducerArgs(op string, g *Group, opts []ReducerOption, nparams int) (*C.pb_group, reducerConfig, C.int32_t, error) {
	c := reducerConfig{op: Avg, hook: HookAllReduce, hookRank: 1, hookStart: 2}
	gh, err := g.handle(op)
	if err != nil {
		return nil, c, 0, err
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.badComp != nil {
		return nil, c, 0, newError(statusInvalidArgument, op, "WithCompression: unknown compression %d; "+
			"use NoCompression, CompressFP16 or CompressBF16 (or WithHook)", int32(*c.badComp))
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
	const op = "AttachReducer"
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
	var o C.pb_reducer_options
	if err := c.fill(op, &o); err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(o.hook_name))
	var h *C.pb_reducer
	var msg *C.char
	if err := check(op, C.pbgo_reducer_attach(gh, n, pd, &o, &h, &msg), msg); err != nil {
		return nil, err
	}
	r := &Reducer{specs: make([]ParamSpec, len(params)), gen: -1, attached: true}
	for i := range r.specs {
		r.specs[i].Len = -1 // read from the library's views by refresh
	}
	r.h = h
	if err := r.refresh(op); err != nil {
		C.pbgo_reducer_close(h, nil)
		return nil, err
	}
	return r, nil
}

// WithGradAsBucketView (AttachReducer only) makes each parameter's grad a view
// of its place in its bucket, torch DDP's gradient_as_bucket_view: backward
// accumulates straight into the bucket and nothing is copied. A grad the
// optimizer set to nil is made a view again at the next backward.
func WithGradAsBucketView() ReducerOption {
	return func(c *reducerConfig) { c.flags |= C.PB_REDUCER_BUCKET_VIEW }
}

// fill sets every field of o from c (so o does not depend on the library's
// defaults). o.hook_name is C memory (or nil) that the caller frees.
func (c *reducerConfig) fill(op string, o *C.pb_reducer_options) error {
	rank, err := toInt32(op, "PowerSGD rank", c.hookRank)
	if err != nil {
		return err
	}
	start, err := toInt32(op, "PowerSGD start iteration", c.hookStart)
	if err != nil {
		return err
	}
	o.size = C.uint32_t(unsafe.Sizeof(*o))
	o.op = C.int32_t(c.op)
	o.bucket_cap_mb, o.first_bucket_cap_mb = C.double(c.capMB), C.double(c.firstCapMB)
	o.flags = C.int32_t(c.flags)
	perNode, err := toInt32(op, "hierarchical ranks per node", c.perNode)
	if err != nil {
		return err
	}
	flags := c.hookFlags
	switch c.wire {
	case NoCompression:
	case CompressFP16:
		flags |= C.PB_HOOK_WIRE_FP16
	case CompressBF16:
		flags |= C.PB_HOOK_WIRE_BF16
	default:
		return newError(statusInvalidArgument, op, "WithHierarchicalCompression: unknown compression %d; "+
			"use NoCompression, CompressFP16 or CompressBF16", int32(c.wire))
	}
	o.hook, o.hook_rank, o.hook_flags, o.hook_start_iter = C.int32_t(c.hook), rank, C.int32_t(flags), start
	o.hook_ranks_per_node = perNode
	o.gossip_topology, o.gossip_ranks_per_node, o.gossip_seed, o.gossip_sync_every = C.PB_GOSSIP_NONE, 0, 0, 0
	if gc := c.gossip; gc != nil {
		per, err := toInt32(op, "ranks per node", gc.ranksPerNode)
		if err != nil {
			return err
		}
		sync, err := toInt32(op, "sync every", gc.syncEvery)
		if err != nil {
			return err
		}
		o.gossip_topology, o.gossip_ranks_per_node = C.int32_t(gc.topology), per
		o.gossip_seed, o.gossip_sync_every = C.int64_t(gc.seed), sync
	}
	o.hook_name = nil
	if c.hookName != nil { // last: nothing after it can fail and leave it unfreed
		o.hook_name = C.CString(*c.hookName)
	}
	return nil
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
	const op = "Reducer.MarkReady"
	h, err := r.rhandle(op)
	if err != nil {
		return err
	}
	defer r.mu.RUnlock()
	idx, err := toInt32(op, "index", i)
	if err != nil {
		return err
	}
	var msg *C.char
	return check(op, C.pbgo_reducer_mark_ready(h, idx, &msg), msg)
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

// WaitContext is Wait that also returns when ctx is done, with ctx's error
// (context.Canceled or context.DeadlineExceeded), as database/sql's
// QueryContext does. The buckets in flight cannot be called back: they go on,
// and the iteration stays, so that a later Wait or WaitContext returns its
// result (mark no more gradients of it meanwhile). A ctx without deadline still
// waits at most the group's timeout, as Wait(0) does.
func (r *Reducer) WaitContext(ctx context.Context) error {
	const op = "Reducer.WaitContext"
	if r == nil {
		return nilError(op, "Reducer")
	}
	for {
		if err := ctx.Err(); err != nil {
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

// Hook selects how a full bucket travels (pybridge.h's PB_HOOK_*): the reducer
// keeps readiness, order and rebuilds; the hook is torch's DDP comm hook.
type Hook int32

// Built-in communication hooks.
const (
	HookAllReduce Hook = C.PB_HOOK_ALLREDUCE // sum, divided first for Avg (the default)
	HookFP16      Hook = C.PB_HOOK_FP16      // float32 buckets travel as half
	HookBF16      Hook = C.PB_HOOK_BF16      // float32 buckets travel as bfloat16
	HookPowerSGD  Hook = C.PB_HOOK_POWERSGD  // torch's PowerSGD low-rank compression
	// Sum in the node, allreduce among node leaders, broadcast in the node (WithHierarchical).
	HookHierarchical Hook = C.PB_HOOK_HIERARCHICAL
)

// WithHook chooses a built-in communication hook (HookPowerSGD with rank 1
// and warm start; WithPowerSGD chooses those). WithHook(HookFP16) and
// WithCompression(CompressFP16) make the same reducer.
func WithHook(h Hook) ReducerOption {
	return func(c *reducerConfig) { c.setHook(h) }
}

// setHook makes h how buckets travel, in place of gossip or an earlier hook.
func (c *reducerConfig) setHook(h Hook) {
	c.hook, c.gossip, c.badComp, c.hookName = h, nil, nil, nil
}

// WithPowerSGD compresses gradients with torch's PowerSGD: matrices are sent as
// rank-`rank` factors (1 to 4 are typical), with error feedback; the first two
// iterations run plain allreduce. warmStart reuses the last step's factors.
// Give matrix gradients their shape (ParamSpec.Shape): vectors travel
// uncompressed.
func WithPowerSGD(rank int, warmStart bool) ReducerOption {
	return func(c *reducerConfig) {
		c.setHook(HookPowerSGD)
		c.hookRank, c.hookFlags = rank, 0
		if !warmStart {
			c.hookFlags = C.PB_HOOK_NO_WARM_START
		}
	}
}

// WithPowerSGDStartIter sets how many iterations run plain allreduce before
// PowerSGD compresses (torch's start_powerSGD_iter; at least 2, the default).
// Other hooks ignore it.
func WithPowerSGDStartIter(iterations int) ReducerOption {
	return func(c *reducerConfig) { c.hookStart = iterations }
}

// WithHierarchical reduces each bucket in three steps: a sum within the node
// (ranksPerNode consecutive ranks; 0: the launcher's LOCAL_WORLD_SIZE, as
// pybridge-launch and torchrun set it), an allreduce among the node leaders
// (local rank 0 of each node), a broadcast within the node. The result is the
// plain allreduce's (up to the order floats are added in), but only one bucket
// per node crosses node links instead of one per rank. NewReducer is then a
// collective that also creates the node groups; ranks that give another node
// size get ErrInvalidArgument.
func WithHierarchical(ranksPerNode int) ReducerOption {
	return func(c *reducerConfig) {
		c.setHook(HookHierarchical)
		c.perNode = ranksPerNode
	}
}

// WithHierarchicalCompression sends WithHierarchical's float32 buckets as half
// (CompressFP16) or bfloat16 (CompressBF16) through all three steps. Other hooks
// refuse it (use WithHook(HookFP16) for a plain allreduce on a half wire).
func WithHierarchicalCompression(comp Compression) ReducerOption {
	return func(c *reducerConfig) { c.wire = comp }
}

// GossipTopology chooses GossipGraD's partners (pybridge.h's PB_GOSSIP_*).
type GossipTopology int32

// Gossip topologies: see WithGossip.
const (
	GossipCube          GossipTopology = C.PB_GOSSIP_CUBE          // pairs i XOR 2^k
	GossipDissemination GossipTopology = C.PB_GOSSIP_DISSEMINATION // send i+2^k, receive i-2^k
)

// WithGossip replaces the allreduce with GossipGraD: each node (ranksPerNode
// consecutive ranks; 0: the launcher's ranks per node, LOCAL_WORLD_SIZE, or 1
// without a launcher) averages within itself and exchanges with one partner node
// per step, partners rotating from seed. Communication per step no longer grows
// with the world, but replicas drift apart: every syncEvery-th step (0: never)
// the gradients are averaged exactly, and the program should average its
// parameters there (AllReduce with Avg). NewReducer is then a collective that
// also creates the node groups.
func WithGossip(topology GossipTopology, ranksPerNode int, seed int64, syncEvery int) ReducerOption {
	return func(c *reducerConfig) {
		c.setHook(HookAllReduce)
		c.gossip = &gossipConfig{topology, ranksPerNode, seed, syncEvery}
	}
}

type gossipConfig struct {
	topology     GossipTopology
	ranksPerNode int
	seed         int64
	syncEvery    int
}
