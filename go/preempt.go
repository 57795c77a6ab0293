package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// ExitRequeue is the exit status of a job that saved its state on a scheduler's
// warning and wants to run again (75, EX_TEMPFAIL; pybridge.h's PB_EXIT_REQUEUE):
// the job script requeues on it (docs/checkpoint.md, "Preemption").
const ExitRequeue = C.PB_EXIT_REQUEUE

// NotifyPreemption returns a copy of parent that is cancelled when the process
// receives one of the scheduler's warning signals (SIGUSR1, as SLURM's
// --signal=USR1@120 sends, and SIGTERM when none are given), Go's way of
// delivering them (signal.NotifyContext). Call stop to restore the default
// behaviour. The signal reaches ranks at different moments, or only some of
// them: ask AnyRank each step before stopping.
func NotifyPreemption(parent context.Context, signals ...os.Signal) (ctx context.Context, stop context.CancelFunc) {
	if len(signals) == 0 {
		signals = []os.Signal{syscall.SIGUSR1, syscall.SIGTERM}
	}
	return signal.NotifyContext(parent, signals...)
}

// AnyRank reports, on every rank, whether flag is true on any rank of g: a
// collective (one allreduce of one integer) that every rank calls at the same
// point. With NotifyPreemption:
//
//	stop, err := pybridge.AnyRank(g, ctx.Err() != nil)
//
// after each step makes every rank stop after the same step.
func AnyRank(g *Group, flag bool) (bool, error) {
	const op = "AnyRank"
	h, err := g.handle(op)
	if err != nil {
		return false, err
	}
	f := C.int32_t(0)
	if flag {
		f = 1
	}
	var out C.int32_t
	var msg *C.char
	err = check(op, C.pbgo_any_rank(h, f, &out, &msg), msg)
	return out != 0, err
}
