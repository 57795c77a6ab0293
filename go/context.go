package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"time"
	"unsafe"
)

// The ...Context variants (see Contexts in the package documentation) run their library
// call through underContext, which decides what a context that ends does to it.

// abortEvery is how often a call whose context has ended is aborted again until it
// returns: pb_init_abort ends only a join already in progress, so an Init that had not
// reached the library when the context ended is ended by the next abort. Aborting a group
// again does nothing.
const abortEvery = 50 * time.Millisecond

// aborter is what ends a call whose context ended: a *Group (pb_group_abort: the group
// and its subgroups) or joinAborter (pb_init_abort: the join in progress).
type aborter interface{ abort(reason string) }

// underContext runs call, a library call that may wait on other processes, under ctx: a
// ctx that is already done starts nothing; one that ends while call runs has target end
// it (aborting its group, or the join in progress), and the result is then ErrCanceled
// wrapping ctx.Err(), whatever call returned. A nil target (or nil *Group): nothing can
// end the call (it waits on no other process), so ctx only gates its start. A ctx that
// never ends (context.Background()) costs nothing but the call.
func underContext(ctx context.Context, op string, target aborter, call func() error) error {
	if ctx == nil {
		return newError(statusInvalidArgument, op, "nil Context (pass context.Background())")
	}
	done := ctx.Done()
	if done == nil {
		return call()
	}
	if err := ctx.Err(); err != nil {
		return &Error{Status: statusCanceled, Op: op, Msg: context.Cause(ctx).Error() +
			": the context ended before the call, which started nothing", Err: err}
	}
	if g, ok := target.(*Group); target == nil || ok && (g == nil || g.h == nil) {
		return call()
	}
	stop := make(chan struct{})
	aborted := make(chan bool, 1)
	go func() {
		select {
		case <-stop:
			aborted <- false
			return
		case <-done:
		}
		reason := "the context of " + op + " ended (" + context.Cause(ctx).Error() + ")"
		tick := time.NewTicker(abortEvery)
		defer tick.Stop()
		for {
			target.abort(reason)
			select {
			case <-stop:
				aborted <- true
				return
			case <-tick.C:
			}
		}
	}()
	err := call()
	close(stop)
	if !<-aborted {
		return err
	}
	msg := context.Cause(ctx).Error()
	if e, ok := err.(*Error); ok && e.Msg != "" {
		msg += "; " + e.Msg
	} else {
		msg += "; the call had finished, but its group was aborted as the context ended"
	}
	return &Error{Status: statusCanceled, Op: op, Msg: msg, Err: ctx.Err()}
}

// abort aborts g and its subgroups (pb_group_abort), for underContext.
func (g *Group) abort(reason string) {
	h, err := g.handle("abort")
	if err != nil {
		return // a closed subgroup: nothing waits on it
	}
	r := C.CString(reason)
	defer C.free(unsafe.Pointer(r))
	C.pbgo_group_abort(h, r, nil)
}

// joinAborter ends the Init, ElasticInit or ElasticState.Reset in progress (pb_init_abort).
type joinAborter struct{}

func (joinAborter) abort(reason string) {
	r := C.CString(reason)
	defer C.free(unsafe.Pointer(r))
	C.pbgo_init_abort(r, nil)
}

// run is underContext for a call on g.
func (g *Group) run(ctx context.Context, op string, call func() error) error {
	return underContext(ctx, op, g, call)
}
