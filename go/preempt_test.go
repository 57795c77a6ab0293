package pybridge_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() { roles["preempt"] = rolePreempt }

// TestPreemptionStopsEveryRankAtTheSameStep: only rank 1 receives SIGUSR1 (as a
// scheduler's warning may reach one node), at step 3; NotifyPreemption's context
// and AnyRank stop both ranks after step 3. Work.WaitContext returns the context's
// error while a receive is still open, and a later Wait its result; so does
// Reducer.WaitContext while a bucket is in flight.
func TestPreemptionStopsEveryRankAtTheSameStep(t *testing.T) {
	expectPass(t, runRanks(t, &launch{role: "preempt", world: 2, limit: 90 * time.Second}))
}

// TestNotifyPreemptionReadsTheLaunchersWarning: a warning pybridge-launch
// received before it started this process (PYBRIDGE_PREEMPTED=SIGUSR1) makes
// NotifyPreemption's context cancelled from the start, as Python's Preemption()
// reads it; a signal not watched, or none, leaves it open.
func TestNotifyPreemptionReadsTheLaunchersWarning(t *testing.T) {
	for _, c := range []struct {
		env     string
		signals []os.Signal
		want    bool
	}{
		{"SIGUSR1", nil, true},
		{"SIGTERM", nil, true},
		{"SIGUSR1", []os.Signal{syscall.SIGUSR2}, false},
		{"SIGUSR2", []os.Signal{syscall.SIGUSR2}, true},
		{"", nil, false},
		{"USR1", nil, false},
	} {
		t.Setenv("PYBRIDGE_PREEMPTED", c.env)
		ctx, stop := pybridge.NotifyPreemption(context.Background(), c.signals...)
		if got := ctx.Err() != nil; got != c.want {
			t.Errorf("PYBRIDGE_PREEMPTED=%q, signals %v: cancelled %v, want %v", c.env, c.signals, got, c.want)
		}
		stop()
		if ctx.Err() == nil {
			t.Errorf("PYBRIDGE_PREEMPTED=%q: stop did not cancel the context", c.env)
		}
	}
}

func rolePreempt() error {
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(30*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	if pybridge.ExitRequeue != 75 {
		return fmt.Errorf("ExitRequeue = %d, want 75 (EX_TEMPFAIL)", pybridge.ExitRequeue)
	}
	if err := checkWaitContext(g); err != nil {
		return err
	}
	if err := checkReducerWaitContext(g); err != nil {
		return err
	}
	ctx, stop := pybridge.NotifyPreemption(context.Background())
	defer stop()
	for step := 1; step <= 50; step++ {
		if g.Rank() == 1 && step == 3 {
			if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
				return err
			}
			select { // delivered asynchronously: wait for it, so that step 3 is the one
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				return errors.New("SIGUSR1 did not cancel the context")
			}
		}
		stopNow, err := pybridge.AnyRank(g, ctx.Err() != nil)
		if err != nil {
			return err
		}
		if stopNow {
			if step != 3 {
				return fmt.Errorf("stopped after step %d, want 3", step)
			}
			logf("stopped after step %d (signal seen here: %v)", step, ctx.Err() != nil)
			return nil
		}
	}
	return errors.New("no rank stopped")
}

func checkWaitContext(g *pybridge.Group) error {
	buf, err := pybridge.NewBuffer[float32](2)
	if err != nil {
		return err
	}
	defer buf.Close()
	if g.Rank() == 1 {
		time.Sleep(500 * time.Millisecond)
		return pybridge.Send(g, []float32{4, 5}, 0, 11)
	}
	w, err := pybridge.IRecv(g, buf, 1, 11)
	if err != nil {
		return err
	}
	defer w.Close()
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := w.WaitContext(short); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, pybridge.ErrCanceled) {
		return fmt.Errorf("WaitContext before the peer sent: %v, want ErrCanceled wrapping context.DeadlineExceeded", err)
	}
	if err := w.WaitContext(context.Background()); err != nil {
		return fmt.Errorf("WaitContext after the peer sent: %v", err)
	}
	if got := buf.Data(); got[0] != 4 || got[1] != 5 {
		return fmt.Errorf("received %v, want [4 5]", got)
	}
	return nil
}

// checkReducerWaitContext: rank 1 marks its gradient only once rank 0's short
// context has expired (rank 0 tells it, tag 12), so rank 0's WaitContext returns
// context.DeadlineExceeded with the bucket in flight; the iteration stays, and
// WaitContext(Background) then returns the averaged gradient.
func checkReducerWaitContext(g *pybridge.Group) error {
	r, err := pybridge.NewReducer(g, pybridge.Params[float32](3))
	if err != nil {
		return err
	}
	defer r.Close()
	grad, err := r.Grad(0)
	if err != nil {
		return err
	}
	v := float32(g.Rank()*2 + 1) // rank 0: 1, rank 1: 3; average 2
	copy(grad, []float32{v, v, v})
	if g.Rank() == 1 {
		if err := pybridge.Recv(g, make([]float32, 1), 0, 12); err != nil {
			return err
		}
		if err := r.MarkReady(0); err != nil {
			return err
		}
	} else {
		if err := r.MarkReady(0); err != nil {
			return err
		}
		short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := r.WaitContext(short); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, pybridge.ErrCanceled) {
			return fmt.Errorf("Reducer.WaitContext before rank 1 marked: %v, want ErrCanceled wrapping "+
				"context.DeadlineExceeded", err)
		}
		if err := pybridge.Send(g, []float32{1}, 1, 12); err != nil {
			return err
		}
	}
	if err := r.WaitContext(context.Background()); err != nil {
		return fmt.Errorf("Reducer.WaitContext after both marked: %v", err)
	}
	if grad, err = r.Grad(0); err != nil {
		return err
	}
	if grad[0] != 2 || grad[1] != 2 || grad[2] != 2 {
		return fmt.Errorf("reduced gradient %v, want [2 2 2]", grad)
	}
	return nil
}
