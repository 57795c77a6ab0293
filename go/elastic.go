package pybridge

/*
#include "pbgo.h"
*/
import "C"

// ElasticState keeps a Checkpoint's registered state (named slices, a loader's
// position, a reducer's counters) in memory, for elastic training: Commit copies
// it in, Restore rolls back to the last commit, Sync hands one rank's last commit
// to every rank over the network (what a rank joining a running job needs). It
// is the first part of elastic training (docs/elastic.md). Use it from one
// goroutine at a time, like its Checkpoint.
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
func (s *ElasticState) Commit(step int64) error {
	const op = "ElasticState.Commit"
	if s == nil {
		return nilError(op, "*ElasticState")
	}
	h, err := s.acquire(op, stateClosed)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	return s.ck.call(op, func(_ *C.char, n C.int32_t, names **C.char, descs *C.pb_tensor,
		l *C.pb_loader, r *C.pb_reducer) error {
		var msg *C.char
		return check(op, C.pbgo_state_commit(h, C.int64_t(step), n, names, descs, l, r, &msg), msg)
	})
}

// Restore copies the last commit back into the registered slices, loader and
// reducer, and returns its step: the steps since are rolled back.
func (s *ElasticState) Restore() (int64, error) {
	const op = "ElasticState.Restore"
	return s.load(op, func(h *C.pb_state, n C.int32_t, names **C.char, descs *C.pb_tensor, l *C.pb_loader,
		r *C.pb_reducer, step *C.int64_t, msg **C.char) C.int {
		return C.pbgo_state_restore(h, n, names, descs, l, r, step, msg)
	})
}

// Sync is a collective over g: every rank takes rank root's last commit as its
// own and restores it (root included), and gets its step.
func (s *ElasticState) Sync(g *Group, root int) (int64, error) {
	const op = "ElasticState.Sync"
	gh, err := g.handle(op)
	if err != nil {
		return -1, err
	}
	r32, err := toInt32(op, "root", root)
	if err != nil {
		return -1, err
	}
	return s.load(op, func(h *C.pb_state, n C.int32_t, names **C.char, descs *C.pb_tensor, l *C.pb_loader,
		r *C.pb_reducer, step *C.int64_t, msg **C.char) C.int {
		return C.pbgo_state_sync(h, gh, r32, n, names, descs, l, r, step, msg)
	})
}

func (s *ElasticState) load(op string, fn func(h *C.pb_state, n C.int32_t, names **C.char, descs *C.pb_tensor,
	l *C.pb_loader, r *C.pb_reducer, step *C.int64_t, msg **C.char) C.int) (int64, error) {
	if s == nil {
		return -1, nilError(op, "*ElasticState")
	}
	h, err := s.acquire(op, stateClosed)
	if err != nil {
		return -1, err
	}
	defer s.mu.Unlock()
	var step C.int64_t = -1
	err = s.ck.call(op, func(_ *C.char, n C.int32_t, names **C.char, descs *C.pb_tensor,
		l *C.pb_loader, r *C.pb_reducer) error {
		var msg *C.char
		return check(op, fn(h, n, names, descs, l, r, &step, &msg), msg)
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
