package pybridge

/*
#include "pbgo_reducer.h"
*/
import "C"

import "context"

// Uneven inputs (torch's Join): ranks with different numbers of batches, as the
// dynamic partition gives them, train together without waiting on each other.

// JoinResult is what Join reports.
type JoinResult struct {
	// Root is the rank whose parameters every rank should take (the largest of
	// the ranks that joined last, which stepped in every iteration):
	// BroadcastParams(g, params, res.Root).
	Root int
	// Shadowed is the number of iterations this rank took part in with zero
	// gradients after running out of batches.
	Shadowed int64
}

// Join is called by a rank with no more batches (its Loader's Next returned
// false) between iterations: until every rank has joined, it takes part in the
// iterations of the ranks still training with zero gradients, so none of them
// waits for it. Every rank calls it once at the end of each epoch (the last to
// run out return at once), then broadcasts the parameters from Root:
//
//	for loader.Next() { ...MarkReady...; r.Wait(0); step }
//	res, err := r.Join()
//	err = pybridge.BroadcastParams(g, params, res.Root)
//
// The reducer is then ready for the next epoch. The reducer must have been
// created WithJoin (or WithJoinDivideByActive) on every rank, else Join is
// ErrInvalidArgument. Collectives the program issues itself during an
// iteration are not shadowed: issue them after the join. This rank's Grad
// slices keep their values.
func (r *Reducer) Join() (JoinResult, error) { return r.join(context.Background(), "Reducer.Join") }

// JoinContext is Join under ctx (see Contexts): a ctx that ends while it shadows
// the other ranks' iterations aborts the reducer's group.
func (r *Reducer) JoinContext(ctx context.Context) (JoinResult, error) {
	return r.join(ctx, "Reducer.JoinContext")
}

func (r *Reducer) join(ctx context.Context, op string) (JoinResult, error) {
	if r == nil {
		return JoinResult{}, nilError(op, "Reducer")
	}
	h, err := r.acquire(op, "reducer is closed")
	if err != nil {
		return JoinResult{}, err
	}
	defer r.mu.Unlock()
	var root C.int32_t
	var shadowed C.int64_t
	err = underContext(ctx, op, r.group, func() error {
		var msg *C.char
		return check(op, C.pbgo_reducer_join(h, &root, &shadowed, &msg), msg)
	})
	// A rank that joined before its first Wait takes part in the one rebuild.
	if rerr := r.refresh(op); rerr != nil && err == nil {
		err = rerr
	}
	return JoinResult{Root: int(root), Shadowed: int64(shadowed)}, err
}
