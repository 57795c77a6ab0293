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
//
// A warning that pybridge-launch received before it started this process
// reaches it as PYBRIDGE_PREEMPTED=<signal name> (e.g. SIGUSR1), as Python's
// pybridge.runtime.preempt.Preemption reads it: when that names one of the
// signals watched, the returned context is already cancelled.
func NotifyPreemption(parent context.Context, signals ...os.Signal) (ctx context.Context, stop context.CancelFunc) {
	if len(signals) == 0 {
		signals = []os.Signal{syscall.SIGUSR1, syscall.SIGTERM}
	}
	ctx, stopSignals := signal.NotifyContext(parent, signals...)
	if !pendingWarning(os.Getenv(preemptedEnv), signals) {
		return ctx, stopSignals
	}
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	return ctx, func() { cancel(); stopSignals() }
}

// preemptedEnv is set by pybridge-launch for the workers it starts after a
// warning (pybridge/launch/exits.py PENDING): the signal's name.
const preemptedEnv = "PYBRIDGE_PREEMPTED"

// signalNames: the names pybridge-launch writes (Python's signal.Signals names)
// of the signals a scheduler warns with.
var signalNames = map[string]syscall.Signal{
	"SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGTERM": syscall.SIGTERM,
	"SIGINT": syscall.SIGINT, "SIGHUP": syscall.SIGHUP, "SIGQUIT": syscall.SIGQUIT,
	"SIGCONT": syscall.SIGCONT, "SIGURG": syscall.SIGURG, "SIGXCPU": syscall.SIGXCPU,
}

// pendingWarning: whether name (PYBRIDGE_PREEMPTED) is one of signals.
func pendingWarning(name string, signals []os.Signal) bool {
	num, ok := signalNames[name]
	if !ok {
		return false
	}
	for _, s := range signals {
		if s == num {
			return true
		}
	}
	return false
}

// AnyRank reports, on every rank, whether flag is true on any rank of g: a
// collective (one allreduce of one integer) that every rank calls at the same
// point. With NotifyPreemption:
//
//	stop, err := pybridge.AnyRank(g, ctx.Err() != nil)
//
// after each step makes every rank stop after the same step.
func AnyRank(g *Group, flag bool) (bool, error) {
	return anyRank(context.Background(), "AnyRank", g, flag)
}

// AnyRankContext is AnyRank under ctx (see Contexts): a ctx that ends while it
// waits aborts g.
func AnyRankContext(ctx context.Context, g *Group, flag bool) (bool, error) {
	return anyRank(ctx, "AnyRankContext", g, flag)
}

func anyRank(ctx context.Context, op string, g *Group, flag bool) (bool, error) {
	h, err := g.handle(op)
	if err != nil {
		return false, err
	}
	f := C.int32_t(0)
	if flag {
		f = 1
	}
	var out C.int32_t
	err = g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_any_rank(h, f, &out, &msg), msg)
	})
	return out != 0, err
}
