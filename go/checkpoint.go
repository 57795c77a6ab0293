package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"runtime"
	"unsafe"
)

// Checkpoint saves and restores a training state: named slices (parameters,
// optimizer state), a loader's position and a reducer's counters, as one file
// per step in a folder (pybridge.h's pb_checkpoint_save; format and Python
// API: docs/checkpoint.md). Register what it holds with AddTensor, SetLoader
// and SetReducer, then call Save after each step and Restore after a start.
//
// A Checkpoint keeps references to the registered slices: it reads them in
// Save and writes them in Restore. Use it from one goroutine at a time.
type Checkpoint struct {
	group   *Group
	dir     string
	keep    int
	names   []string
	tensors []ckTensor
	loader  *Loader
	reducer *Reducer
}

type ckTensor struct {
	data  unsafe.Pointer // the slice's first element (nil when empty)
	count C.int64_t
	dtype C.int32_t
}

// CheckpointOption configures NewCheckpoint.
type CheckpointOption func(*Checkpoint)

// WithKeep sets how many checkpoints Save keeps in the folder, the newest (0: all;
// default 2).
func WithKeep(n int) CheckpointOption { return func(c *Checkpoint) { c.keep = n } }

// WithLoader makes Save store l's position (a StaticPartition loader) and Restore
// continue the saved epoch: the records no rank had read, shared over the ranks of
// l's group, however many there are now.
func WithLoader(l *Loader) CheckpointOption { return func(c *Checkpoint) { c.loader = l } }

// WithReducer makes the checkpoint hold r's iteration and hook step counters.
func WithReducer(r *Reducer) CheckpointOption { return func(c *Checkpoint) { c.reducer = r } }

// NewCheckpoint returns a checkpoint of the folder dir, restored over group
// g (nil: this process alone), configured by opts (WithKeep, WithLoader,
// WithReducer). Register its slices with AddTensor.
func NewCheckpoint(g *Group, dir string, opts ...CheckpointOption) *Checkpoint {
	c := &Checkpoint{group: g, dir: dir, keep: 2}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	return c
}

// AddTensor registers data under name (distinct, non-empty): Save stores it
// and Restore overwrites it with the saved values (same length and type).
func AddTensor[T Numeric](c *Checkpoint, name string, data []T) error {
	const op = "AddTensor"
	if c == nil {
		return newError(statusInvalidArgument, op, "nil *Checkpoint")
	}
	if name == "" {
		return newError(statusInvalidArgument, op, "empty tensor name")
	}
	for _, n := range c.names {
		if n == name {
			return newError(statusInvalidArgument, op, "tensor name %q registered twice", name)
		}
	}
	p, count := dataOf(data)
	c.names = append(c.names, name)
	c.tensors = append(c.tensors, ckTensor{data: p, count: count, dtype: dtypeOf[T]()})
	return nil
}

// SetLoader is WithLoader after creation.
//
// Deprecated: pass WithLoader to NewCheckpoint.
func (c *Checkpoint) SetLoader(l *Loader) { c.loader = l }

// SetReducer is WithReducer after creation.
//
// Deprecated: pass WithReducer to NewCheckpoint.
func (c *Checkpoint) SetReducer(r *Reducer) { c.reducer = r }

// SetKeep is WithKeep after creation.
//
// Deprecated: pass WithKeep to NewCheckpoint.
func (c *Checkpoint) SetKeep(n int) { c.keep = n }

// call runs fn with the C view of the registered state: names in C memory,
// descriptors whose Go memory is pinned for the call, and the handles.
func (c *Checkpoint) call(op string, fn func(dir *C.char, n C.int32_t, names **C.char, descs *C.pb_tensor,
	l *C.pb_loader, r *C.pb_reducer) error) error {
	if c == nil {
		return newError(statusInvalidArgument, op, "nil *Checkpoint")
	}
	n, err := toInt32(op, "tensor count", len(c.tensors))
	if err != nil {
		return err
	}
	var lh *C.pb_loader
	if c.loader != nil {
		if lh, err = c.loader.handle(op); err != nil {
			return err
		}
	}
	var rh *C.pb_reducer
	if c.reducer != nil {
		if rh, err = c.reducer.rhandle(op); err != nil {
			return err
		}
		defer c.reducer.mu.RUnlock()
	}
	dir := C.CString(c.dir)
	defer C.free(unsafe.Pointer(dir))
	var cnames **C.char
	if len(c.names) > 0 {
		cnames = (**C.char)(C.malloc(C.size_t(len(c.names)) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
		names := unsafe.Slice(cnames, len(c.names))
		for i, s := range c.names {
			names[i] = C.CString(s)
		}
		defer func() {
			for _, p := range names {
				C.free(unsafe.Pointer(p))
			}
			C.free(unsafe.Pointer(cnames))
		}()
	}
	// The descriptors hold Go pointers: pinned for the call, as cgo requires.
	var pin runtime.Pinner
	defer pin.Unpin()
	descs := make([]C.pb_tensor, len(c.tensors))
	for i, t := range c.tensors {
		if t.data != nil {
			pin.Pin(t.data)
		}
		descs[i] = C.pb_tensor{data: t.data, count: t.count, dtype: t.dtype, device: CPU}
	}
	var pd *C.pb_tensor
	if len(descs) > 0 {
		pd = &descs[0]
	}
	return fn(dir, n, cnames, pd, lh, rh)
}

// Save writes the state as step (>= 0), atomically (temporary file, fsync,
// rename), then deletes all but the newest checkpoints (SetKeep). It is not a
// collective: call it on the ranks that should write (rank 0 for a shared
// folder, or every rank with a folder each), after the step whose batches the
// loader handed out.
func (c *Checkpoint) Save(step int64) error {
	return c.save(context.Background(), "Checkpoint.Save", step)
}

// SaveContext is Save under ctx (see Contexts): a ctx already done writes nothing.
// A write once started is not interrupted (it waits on no other process), so that
// no checkpoint is left half written.
func (c *Checkpoint) SaveContext(ctx context.Context, step int64) error {
	return c.save(ctx, "Checkpoint.SaveContext", step)
}

func (c *Checkpoint) save(ctx context.Context, op string, step int64) error {
	return c.call(op, func(dir *C.char, n C.int32_t, names **C.char, descs *C.pb_tensor,
		l *C.pb_loader, r *C.pb_reducer) error {
		keep, err := toInt32(op, "keep", c.keep)
		if err != nil {
			return err
		}
		return underContext(ctx, op, nil, func() error {
			var msg *C.char
			return check(op, C.pbgo_checkpoint_save(dir, C.int64_t(step), n, names, descs, l, r, keep, &msg), msg)
		})
	})
}

// Restore loads the newest checkpoint any rank of the group holds (each rank
// looks in its own folder; the lowest rank holding the newest step sends it
// to the others) into the registered slices, loader and reducer, and returns
// its step; found is false, and nothing changed, when no rank holds one. It is
// a collective over the group.
func (c *Checkpoint) Restore() (step int64, found bool, err error) {
	return c.restore(context.Background(), "Checkpoint.Restore")
}

// RestoreContext is Restore under ctx (see Contexts): a ctx that ends while it
// waits for the group aborts it (without a group, ctx only gates the start).
func (c *Checkpoint) RestoreContext(ctx context.Context) (step int64, found bool, err error) {
	return c.restore(ctx, "Checkpoint.RestoreContext")
}

func (c *Checkpoint) restore(ctx context.Context, op string) (step int64, found bool, err error) {
	var gh *C.pb_group
	var g *Group
	if c != nil && c.group != nil {
		if gh, err = c.group.handle(op); err != nil {
			return -1, false, err
		}
		g = c.group
	}
	var out C.int64_t = -1
	err = c.call(op, func(dir *C.char, n C.int32_t, names **C.char, descs *C.pb_tensor,
		l *C.pb_loader, r *C.pb_reducer) error {
		return underContext(ctx, op, g, func() error {
			var msg *C.char
			return check(op, C.pbgo_checkpoint_restore(gh, dir, n, names, descs, l, r, &out, &msg), msg)
		})
	})
	if err != nil {
		return -1, false, err
	}
	return int64(out), out >= 0, nil
}
