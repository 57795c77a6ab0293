package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"errors"
	"unsafe"
)

// Elastic training (docs/elastic.md): run the program under
// `pybridge-launch --elastic`, join with ElasticInit, keep the training state
// in an ElasticState and train inside RunElastic. When a peer dies or stops
// answering, or processes wait to join at a Commit, every rank's current call
// returns ErrMembership; RunElastic then resets onto the new world (rolled back
// to the last Commit) and calls train again. No process restarts, and no
// callback goes from the library into Go.

// WithElasticStore sets the "host:port" of an elastic job's store for
// ElasticInit; by default MASTER_ADDR and MASTER_PORT, as pybridge-launch
// --elastic sets them.
func WithElasticStore(addr string) ElasticOption {
	return elasticOption(func(c *config) { c.storeAddr = addr })
}

// ElasticInit joins an elastic job and returns the world group, a Group like
// Init's. Its size is the launcher's first world (WORLD_SIZE); a process that
// starts later (a replacement) joins the running job at its next commit. It
// takes WithBackend, WithTimeout (every collective's bound: a peer that stops
// answering is lost after it) and WithElasticStore; the launcher's environment
// gives the rest (PYBRIDGE_ELASTIC_MIN, _MAX, _LOST_AFTER).
//
// After ErrMembership the group is closed (its calls return ErrClosed):
// ElasticState.Reset returns the new one. Close the newest group at the end.
func ElasticInit(opts ...ElasticOption) (*Group, error) {
	return elasticInit(context.Background(), "ElasticInit", opts)
}

// ElasticInitContext is ElasticInit under ctx (see Contexts): a ctx that ends
// while it waits for the job's world ends it (pb_init_abort) with ErrCanceled.
func ElasticInitContext(ctx context.Context, opts ...ElasticOption) (*Group, error) {
	return elasticInit(ctx, "ElasticInitContext", opts)
}

func elasticInit(ctx context.Context, op string, opts []ElasticOption) (*Group, error) {
	var c config
	for _, o := range opts {
		if o != nil {
			o.applyElastic(&c)
		}
	}
	backend, store := cStringOrNil(c.backend), cStringOrNil(c.storeAddr)
	defer C.free(unsafe.Pointer(backend))
	defer C.free(unsafe.Pointer(store))
	var h *C.pb_group
	err := underContext(ctx, op, joinAborter{}, func() error {
		var msg *C.char
		return check(op, C.pbgo_elastic_init(backend, store, C.double(c.timeout.Seconds()), &h, &msg), msg)
	})
	return joined(op, h, err)
}

// ElasticChange describes the latest membership change this process reset after.
type ElasticChange struct {
	Lost             []int // ranks of the old world that were lost (ErrMembership's message names their hosts and pids)
	Joined           int   // processes that joined
	OldSize, NewSize int   // the world sizes before and after
	Generation       int64 // the new world's number; the first world is 1
}

// LastElasticChange returns the latest change this process reset after; before
// any reset, nothing lost or joined and both sizes the current world's. It
// fails with ErrInvalidArgument outside an elastic job.
func LastElasticChange() (ElasticChange, error) {
	const op = "LastElasticChange"
	var ch ElasticChange
	var nLost, joined, oldSize, newSize C.int32_t
	var gen C.int64_t
	lost := make([]C.int32_t, 16)
	for {
		var msg *C.char
		st := C.pbgo_elastic_last_change(&lost[0], C.int32_t(len(lost)), &nLost, &joined, &oldSize, &newSize, &gen, &msg)
		if err := check(op, st, msg); err != nil {
			return ch, err
		}
		if int(nLost) <= len(lost) {
			break
		}
		lost = make([]C.int32_t, int(nLost))
	}
	for _, r := range lost[:nLost] {
		ch.Lost = append(ch.Lost, int(r))
	}
	ch.Joined, ch.OldSize, ch.NewSize, ch.Generation = int(joined), int(oldSize), int(newSize), int64(gen)
	return ch, nil
}

// ElasticState keeps a Checkpoint's registered state (named slices, a loader's
// position, a reducer's counters) in memory, for elastic training: Commit copies
// it in, Restore rolls back to the last commit, Sync hands one rank's last commit
// to every rank over the network (what a rank joining a running job needs), and
// Reset moves onto the next world after ErrMembership. Use it from one goroutine
// at a time, like its Checkpoint.
type ElasticState struct {
	cHandle[*C.pb_state]
	ck *Checkpoint
}

// NewElasticState returns an empty state over what ck registers (AddTensor,
// SetLoader, SetReducer); ck's folder is not used. Close it when done.
func NewElasticState(ck *Checkpoint) (*ElasticState, error) {
	const op = "NewElasticState"
	if ck == nil {
		return nil, newError(statusInvalidArgument, op, "nil *Checkpoint")
	}
	s := &ElasticState{ck: ck}
	var msg *C.char
	if err := check(op, C.pbgo_state_create(&s.h, &msg), msg); err != nil {
		return nil, err
	}
	return s, nil
}

const stateClosed = "elastic state is closed"

// Commit copies the registered state in as step (>= 0), replacing the last commit.
//
// In an elastic world (ElasticInit) it is a collective, made at the same step on
// every rank: after the copy, rank 0 tells every rank whether processes wait to
// join, and if so Commit returns ErrMembership. That is not a failure: the commit
// is made, and Reset rolls back to it (losing no step) and sends it to the
// joiners. Return the error from the training function to RunElastic.
func (s *ElasticState) Commit(step int64) error {
	return s.commit(context.Background(), "ElasticState.Commit", step)
}

// CommitContext is Commit under ctx (see Contexts): a ctx that ends while the
// commit waits for the other ranks aborts the checkpoint's group (NewCheckpoint's;
// without one, ctx only gates the start).
func (s *ElasticState) CommitContext(ctx context.Context, step int64) error {
	return s.commit(ctx, "ElasticState.CommitContext", step)
}

func (s *ElasticState) commit(ctx context.Context, op string, step int64) error {
	if s == nil {
		return nilError(op, "ElasticState")
	}
	h, err := s.acquire(op, stateClosed)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	return s.ck.call(op, func(_ *C.char, n C.int32_t, names **C.char, descs *C.pb_tensor,
		l *C.pb_loader, r *C.pb_reducer) error {
		return underContext(ctx, op, s.ck.group, func() error {
			var msg *C.char
			return check(op, C.pbgo_state_commit(h, C.int64_t(step), n, names, descs, l, r, &msg), msg)
		})
	})
}

// Restore copies the last commit back into the registered slices, loader and
// reducer, and returns its step: the steps since are rolled back.
func (s *ElasticState) Restore() (int64, error) {
	const op = "ElasticState.Restore"
	return s.load(context.Background(), op, nil, func(h *C.pb_state, n C.int32_t, names **C.char, descs *C.pb_tensor, l *C.pb_loader,
		r *C.pb_reducer, step *C.int64_t, msg **C.char) C.int {
		return C.pbgo_state_restore(h, n, names, descs, l, r, step, msg)
	})
}

// Sync is a collective over g: every rank takes rank root's last commit as its
// own and restores it (root included), and gets its step. A root that has
// committed nothing yet sends what the registered slices hold now, as step 0.
func (s *ElasticState) Sync(g *Group, root int) (int64, error) {
	return s.sync(context.Background(), "ElasticState.Sync", g, root)
}

// SyncContext is Sync under ctx (see Contexts): a ctx that ends while it waits
// aborts g.
func (s *ElasticState) SyncContext(ctx context.Context, g *Group, root int) (int64, error) {
	return s.sync(ctx, "ElasticState.SyncContext", g, root)
}

func (s *ElasticState) sync(ctx context.Context, op string, g *Group, root int) (int64, error) {
	gh, err := g.handle(op)
	if err != nil {
		return -1, err
	}
	r32, err := toInt32(op, "root", root)
	if err != nil {
		return -1, err
	}
	return s.load(ctx, op, g, func(h *C.pb_state, n C.int32_t, names **C.char, descs *C.pb_tensor,
		l *C.pb_loader, r *C.pb_reducer, step *C.int64_t, msg **C.char) C.int {
		return C.pbgo_state_sync(h, gh, r32, n, names, descs, l, r, step, msg)
	})
}

// Reset moves onto the world agreed on after ErrMembership, a collective on it:
// the registered reducer and loader are re-bound to it (the loader's epoch goes
// on from the committed position, its unread records shared over the new
// ranks), every rank rolls back to its last commit and takes the new rank 0's
// (the lowest surviving old rank's). It returns the new world's group (the old
// one, and groups made from it, now return ErrClosed) and the committed step.
// Slices from the reducer's Grad must be fetched again. Reset fails with
// ErrMembership when the world changed again meanwhile (call it again), and
// with ErrInvalidArgument outside an elastic job or when there was no change
// (the world then stays live).
func (s *ElasticState) Reset() (*Group, int64, error) {
	return s.reset(context.Background(), "ElasticState.Reset")
}

// ResetContext is Reset under ctx (see Contexts): a ctx that ends while it waits
// for the new world ends it (pb_init_abort), aborting the new world if it was
// formed (the returned group, if any, then says so: close it).
func (s *ElasticState) ResetContext(ctx context.Context) (*Group, int64, error) {
	return s.reset(ctx, "ElasticState.ResetContext")
}

func (s *ElasticState) reset(ctx context.Context, op string) (*Group, int64, error) {
	var h *C.pb_group
	step, err := s.load(ctx, op, joinAborter{}, func(sh *C.pb_state, n C.int32_t, names **C.char,
		descs *C.pb_tensor, l *C.pb_loader, r *C.pb_reducer, step *C.int64_t, msg **C.char) C.int {
		return C.pbgo_state_reset(sh, n, names, descs, l, r, &h, step, msg)
	})
	if h == nil { // still on the old world
		return nil, step, err
	}
	// On the new world, even if the rollback failed: the caller must be able to close it.
	g, gerr := newWorld(op, h)
	if gerr != nil {
		return nil, -1, errors.Join(err, gerr)
	}
	if s.ck.group != nil {
		s.ck.group = g
	}
	if r := s.ck.reducer; r != nil {
		r.group = g
		if rerr := r.reread(op); rerr != nil && err == nil {
			err = rerr
		}
	}
	if l := s.ck.loader; l != nil && l.group != nil {
		l.group = g
	}
	return g, step, err
}

// RunElastic calls train(g, step) until it returns something other than
// ErrMembership (matched with errors.Is, so wrap it with %w) and returns the
// group it ended on (close it) and train's result. When train returns nil the
// job is marked finished: a process that comes later finds no world to join,
// and the launcher starts no replacement. Every entry starts from one
// state on every rank: first st.Sync(g, 0) (rank 0's values or last commit: a
// joiner receives the live state), after ErrMembership st.Reset onto the new
// world, rolled back to the last commit. train must go on from the state the
// slices hold (the step it is given, an epoch registered as a tensor...), as
// a resumed run goes on from a checkpoint. No callback crosses from the library
// into Go: the loop is here.
func RunElastic(st *ElasticState, g *Group, train func(g *Group, step int64) error) (*Group, error) {
	return runElastic(context.Background(), "RunElastic", st, g, train)
}

// RunElasticContext is RunElastic with ctx given to its Sync and Reset
// (SyncContext, ResetContext): a ctx that ends while they wait ends RunElastic
// with ErrCanceled. train is not given ctx: it uses the ...Context calls with its
// own, and returns their errors.
func RunElasticContext(ctx context.Context, st *ElasticState, g *Group,
	train func(g *Group, step int64) error) (*Group, error) {
	return runElastic(ctx, "RunElasticContext", st, g, train)
}

func runElastic(ctx context.Context, op string, st *ElasticState, g *Group,
	train func(g *Group, step int64) error) (*Group, error) {
	if train == nil {
		return g, newError(statusInvalidArgument, op, "nil train function")
	}
	step, err := st.SyncContext(ctx, g, 0)
	for {
		if err == nil {
			if err = train(g, step); err == nil {
				return g, finishElastic(op, g)
			}
		}
		if !errors.Is(err, ErrMembership) {
			return g, err
		}
		var next *Group
		if next, step, err = st.ResetContext(ctx); next != nil {
			g = next
		}
	}
}

// finishElastic marks the job's training finished (pb_elastic_finish).
func finishElastic(op string, g *Group) error {
	h, err := g.handle(op)
	if err != nil {
		return err
	}
	var msg *C.char
	return check(op, C.pbgo_elastic_finish(h, &msg), msg)
}

// load makes the call fn, which loads state into the registered slices, under ctx
// (abort: what ends it).
func (s *ElasticState) load(ctx context.Context, op string, abort aborter, fn func(h *C.pb_state,
	n C.int32_t, names **C.char, descs *C.pb_tensor, l *C.pb_loader, r *C.pb_reducer, step *C.int64_t,
	msg **C.char) C.int) (int64, error) {
	if s == nil {
		return -1, nilError(op, "ElasticState")
	}
	h, err := s.acquire(op, stateClosed)
	if err != nil {
		return -1, err
	}
	defer s.mu.Unlock()
	var step C.int64_t = -1
	err = s.ck.call(op, func(_ *C.char, n C.int32_t, names **C.char, descs *C.pb_tensor,
		l *C.pb_loader, r *C.pb_reducer) error {
		return underContext(ctx, op, abort, func() error {
			var msg *C.char
			return check(op, fn(h, n, names, descs, l, r, &step, &msg), msg)
		})
	})
	return int64(step), err
}

// Close releases the state; closing again does nothing.
func (s *ElasticState) Close() error {
	if s == nil {
		return nil
	}
	return s.close("ElasticState.Close", func(h *C.pb_state, msg **C.char) C.int {
		return C.pbgo_state_close(h, msg)
	})
}
