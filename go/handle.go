package pybridge

/*
#include "pbgo.h"
*/
import "C"

import "sync"

// cHandle is what every type holding a library handle shares (Group, Buffer, Work,
// Loader, Reducer, FedServer, FedWorker embed it): the handle, whether it was closed, and
// the lock that makes a Close on one goroutine safe against calls on others. A closed
// handle never reaches the library again: the library has forgotten it, and Go answers
// ErrClosed itself.
//
// P is the handle's pointer type (*C.pb_work, ...): cgo's opaque struct types are
// incomplete, which Go does not accept as type arguments, but pointers to them are fine.
// A nil *T cannot reach these methods (Go dereferences it to find the field), so each
// type checks for nil itself, with nilError, before calling them.
type cHandle[P comparable] struct {
	mu     sync.RWMutex
	h      P
	closed bool
}

// open reports whether the handle may be passed to the library; mu is held.
func (x *cHandle[P]) open() bool {
	var none P
	return x.h != none && !x.closed
}

// live returns the handle, or ErrClosed with closedMsg; mu is held.
func (x *cHandle[P]) live(op, closedMsg string) (P, error) {
	if !x.open() {
		var none P
		return none, newError(statusClosed, op, "%s", closedMsg)
	}
	return x.h, nil
}

// get returns the handle for a call made without the lock: the library checks a handle
// closed in the meantime itself.
func (x *cHandle[P]) get(op, closedMsg string) (P, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.live(op, closedMsg)
}

// acquire returns the handle with mu held (the caller unlocks): the call cannot
// overlap another one or Close.
func (x *cHandle[P]) acquire(op, closedMsg string) (P, error) { return x.hold(&x.mu, op, closedMsg) }

// acquireShared returns the handle with mu held for reading (the caller RUnlocks):
// such calls may overlap each other, but not Close or an acquire.
func (x *cHandle[P]) acquireShared(op, closedMsg string) (P, error) {
	return x.hold(x.mu.RLocker(), op, closedMsg)
}

// hold takes l (mu or its read side) and keeps it when the handle is open.
func (x *cHandle[P]) hold(l sync.Locker, op, closedMsg string) (P, error) {
	l.Lock()
	h, err := x.live(op, closedMsg)
	if err != nil {
		l.Unlock()
	}
	return h, err
}

// close releases the handle with free, once: closing again, or a handle never set,
// returns nil. free runs with mu held, so it may also clear the caller's own state. The
// handle counts as closed even when free fails (the library released it or never knew it).
func (x *cHandle[P]) close(op string, free func(h P, msg **C.char) C.int) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.open() {
		return nil
	}
	x.closed = true
	var msg *C.char
	return check(op, free(x.h, &msg), msg)
}

// nilError is the error of a method called on a nil *typ.
func nilError(op, typ string) error {
	return newError(statusInvalidArgument, op, "nil *%s", typ)
}

// cArray copies xs into a new C-typed array and returns its first element (nil
// for none): for the calls that take a pointer and a count of int32 or int64.
func cArray[E ~int32 | ~int64](xs []int) *E {
	if len(xs) == 0 {
		return nil
	}
	out := make([]E, len(xs))
	for i, x := range xs {
		out[i] = E(x)
	}
	return &out[0]
}
