package pybridge_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() { world2.share("async", "TestAsync2Ranks") }

func TestAsync2Ranks(t *testing.T) {
	expectRolePass(t, world2, "async")
}

func init() { world2.share("worktest", "TestWorkTestReportsDone") }

// TestWorkTestReportsDone polls Work.Test on every kind of asynchronous
// operation: each must report done without anyone calling Wait.
func TestWorkTestReportsDone(t *testing.T) {
	expectRolePass(t, world2, "worktest")
}

func roleWorkTest() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	n, me := g.Size(), g.Rank()
	peer := (me + 1) % n
	one, err := pybridge.NewBuffer[float32](4)
	if err != nil {
		return err
	}
	defer one.Close()
	all, err := pybridge.NewBuffer[float32](4 * n)
	if err != nil {
		return err
	}
	defer all.Close()
	starts := []struct {
		name  string
		start func() (*pybridge.Work, error)
	}{
		{"AllReduceAsync", func() (*pybridge.Work, error) { return pybridge.AllReduceAsync(g, one, pybridge.Sum) }},
		{"BroadcastAsync", func() (*pybridge.Work, error) { return pybridge.BroadcastAsync(g, one, 0) }},
		{"AllGatherAsync", func() (*pybridge.Work, error) { return pybridge.AllGatherAsync(g, one, all) }},
		{"ReduceScatterAsync", func() (*pybridge.Work, error) { return pybridge.ReduceScatterAsync(g, all, one, pybridge.Sum) }},
		{"ISend/IRecv", func() (*pybridge.Work, error) {
			if me == 0 {
				return pybridge.ISend(g, one, peer, 5)
			}
			return pybridge.IRecv(g, one, 0, 5)
		}},
	}
	var stuck []string
	for _, s := range starts {
		if s.name == "ISend/IRecv" && me > 1 {
			continue
		}
		w, err := s.start()
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		done := false
		for deadline := time.Now().Add(5 * time.Second); !done && time.Now().Before(deadline); {
			if done, err = w.Test(); err != nil {
				return fmt.Errorf("%s: Test: %w", s.name, err)
			}
			time.Sleep(time.Millisecond)
		}
		// Wait regardless, so that the ranks stay in step for the next operation.
		if err := w.Wait(0); err != nil {
			return fmt.Errorf("%s: Wait: %w", s.name, err)
		}
		w.Close()
		if !done {
			stuck = append(stuck, s.name)
		}
		logf("%s: Test reported done without Wait: %v", s.name, done)
	}
	if len(stuck) > 0 {
		return fmt.Errorf("Work.Test never reported done within 5s for %v (it does once Wait was called)", stuck)
	}
	return nil
}

func roleAsync() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	checks := []error{
		checkAsync(g, "float32", func(v float64) float32 { return float32(v) }),
		checkAsync(g, "float64", func(v float64) float64 { return v }),
		checkAsync(g, "float16", func(v float64) pybridge.Float16 { return pybridge.Float16FromFloat32(float32(v)) }),
		checkAsync(g, "bfloat16", func(v float64) pybridge.BFloat16 { return pybridge.BFloat16FromFloat32(float32(v)) }),
		checkAsync(g, "int8", func(v float64) int8 { return int8(v) }),
		checkAsync(g, "uint8", func(v float64) uint8 { return uint8(v) }),
		checkAsync(g, "int32", func(v float64) int32 { return int32(v) }),
		checkAsync(g, "int64", func(v float64) int64 { return int64(v) }),
		checkAsyncLifecycle(g),
		checkWaitTimeoutThenResult(g),
	}
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	return g.Close()
}

func newFilled[T pybridge.Numeric](n int, conv func(float64) T, f func(i int) float64) (*pybridge.Buffer[T], error) {
	b, err := pybridge.NewBuffer[T](n)
	if err != nil {
		return nil, err
	}
	copy(b.Data(), fill(n, conv, f))
	return b, nil
}

// finish waits for w by polling Test (poll) or by Wait, then closes it.
func finish(w *pybridge.Work, poll bool) error {
	defer w.Close()
	if !poll {
		return w.Wait(0)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		done, err := w.Test()
		if err != nil || done {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return errors.New("work not done after 60s of polling Test")
}

func checkAsync[T pybridge.Numeric](g *pybridge.Group, name string, conv func(float64) T) error {
	const k = 6
	n, me := g.Size(), g.Rank()
	fail := func(err error) error { return fmt.Errorf("%s: %w", name, err) }

	// Three all-reduces in flight at once, waited for in reverse order.
	ops := []pybridge.Op{pybridge.Sum, pybridge.Max, pybridge.Min}
	bufs := make([]*pybridge.Buffer[T], len(ops))
	works := make([]*pybridge.Work, len(ops))
	for j, op := range ops {
		b, err := newFilled(k, conv, func(i int) float64 { return value(me, i+j) })
		if err != nil {
			return fail(err)
		}
		defer b.Close()
		bufs[j] = b
		if works[j], err = pybridge.AllReduceAsync(g, b, op); err != nil {
			return fail(err)
		}
	}
	for j := len(ops) - 1; j >= 0; j-- {
		if err := finish(works[j], j == 0); err != nil {
			return fail(err)
		}
		want := fill(k, conv, func(i int) float64 {
			return reduce(ops[j], n, func(r int) float64 { return value(r, i+j) })
		})
		if err := same(fmt.Sprintf("%s AllReduceAsync %v", name, ops[j]), bufs[j].Data(), want); err != nil {
			return err
		}
	}

	root := n - 1
	b, err := newFilled(k, conv, func(i int) float64 { return ident(me, i) })
	if err != nil {
		return fail(err)
	}
	defer b.Close()
	w, err := pybridge.BroadcastAsync(g, b, root)
	if err != nil {
		return fail(err)
	}
	if err := finish(w, true); err != nil {
		return fail(err)
	}
	if err := same(name+" BroadcastAsync", b.Data(), fill(k, conv, func(i int) float64 { return ident(root, i) })); err != nil {
		return err
	}

	send, err := newFilled(k, conv, func(i int) float64 { return ident(me, i) })
	if err != nil {
		return fail(err)
	}
	defer send.Close()
	gathered, err := pybridge.NewBuffer[T](n * k)
	if err != nil {
		return fail(err)
	}
	defer gathered.Close()
	if w, err = pybridge.AllGatherAsync(g, send, gathered); err != nil {
		return fail(err)
	}
	if err := finish(w, false); err != nil {
		return fail(err)
	}
	if err := same(name+" AllGatherAsync", gathered.Data(), fill(n*k, conv, func(j int) float64 { return ident(j/k, j%k) })); err != nil {
		return err
	}

	in, err := newFilled(n*k, conv, func(j int) float64 { return value(me, j) })
	if err != nil {
		return fail(err)
	}
	defer in.Close()
	out, err := pybridge.NewBuffer[T](k)
	if err != nil {
		return fail(err)
	}
	defer out.Close()
	if w, err = pybridge.ReduceScatterAsync(g, in, out, pybridge.Sum); err != nil {
		return fail(err)
	}
	if err := finish(w, false); err != nil { // Test never reports done: see TestWorkTestReportsDone
		return fail(err)
	}
	want := fill(k, conv, func(i int) float64 {
		return reduce(pybridge.Sum, n, func(r int) float64 { return value(r, me*k+i) })
	})
	if err := same(name+" ReduceScatterAsync", out.Data(), want); err != nil {
		return err
	}

	// Point to point: rank 0 and rank 1 swap, each posting its receive first.
	if me < 2 && n > 1 {
		peer := 1 - me
		msg, err := newFilled(k, conv, func(i int) float64 { return ident(me, i) })
		if err != nil {
			return fail(err)
		}
		defer msg.Close()
		inbox, err := pybridge.NewBuffer[T](k)
		if err != nil {
			return fail(err)
		}
		defer inbox.Close()
		rw, err := pybridge.IRecv(g, inbox, peer, 3)
		if err != nil {
			return fail(err)
		}
		sw, err := pybridge.ISend(g, msg, peer, 3)
		if err != nil {
			return fail(err)
		}
		if err := finish(sw, false); err != nil {
			return fail(err)
		}
		if err := finish(rw, false); err != nil {
			return fail(err)
		}
		if err := same(name+" IRecv", inbox.Data(), fill(k, conv, func(i int) float64 { return ident(peer, i) })); err != nil {
			return err
		}
	}
	logf("%s: AllReduceAsync x3 in flight, BroadcastAsync, AllGatherAsync, ReduceScatterAsync, ISend/IRecv match", name)
	return nil
}

// checkAsyncLifecycle covers closing buffers and work, and using them afterwards.
func checkAsyncLifecycle(g *pybridge.Group) error {
	if _, err := pybridge.NewBuffer[float32](-1); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("NewBuffer(-1): got %v, want ErrInvalidArgument", err)
	}
	empty, err := pybridge.NewBuffer[int32](0)
	if err != nil {
		return fmt.Errorf("NewBuffer(0): %w", err)
	}
	if empty.Len() != 0 || len(empty.Data()) != 0 {
		return fmt.Errorf("empty buffer has %d elements", len(empty.Data()))
	}
	if err := empty.Close(); err != nil {
		return err
	}

	b, err := pybridge.NewBuffer[float32](4)
	if err != nil {
		return err
	}
	for i, v := range b.Data() {
		if v != 0 {
			return fmt.Errorf("new buffer element %d is %v, want 0", i, v)
		}
	}
	w, err := pybridge.AllReduceAsync(g, b, pybridge.Sum)
	if err != nil {
		return err
	}
	if err := w.Wait(30 * time.Second); err != nil {
		return err
	}
	// A finished operation keeps its result: waiting and testing again agree.
	if err := w.Wait(0); err != nil {
		return fmt.Errorf("second Wait: %w", err)
	}
	if done, err := w.Test(); !done || err != nil {
		return fmt.Errorf("Test after Wait: %v, %v", done, err)
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("second Work.Close: %w", err)
	}
	if err := w.Wait(0); !errors.Is(err, pybridge.ErrClosed) {
		return fmt.Errorf("Wait after Close: got %v, want ErrClosed", err)
	}
	if _, err := w.Test(); !errors.Is(err, pybridge.ErrClosed) {
		return fmt.Errorf("Test after Close: got %v, want ErrClosed", err)
	}

	if err := b.Close(); err != nil {
		return err
	}
	if err := b.Close(); err != nil {
		return fmt.Errorf("second Buffer.Close: %w", err)
	}
	if b.Data() != nil {
		return errors.New("Data after Close is not nil")
	}
	if _, err := pybridge.AllReduceAsync(g, b, pybridge.Sum); !errors.Is(err, pybridge.ErrClosed) {
		return fmt.Errorf("AllReduceAsync on a closed buffer: got %v, want ErrClosed", err)
	}
	var nilBuf *pybridge.Buffer[float32]
	if _, err := pybridge.AllReduceAsync(g, nilBuf, pybridge.Sum); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("AllReduceAsync on a nil buffer: got %v, want ErrInvalidArgument", err)
	}

	// Mismatched sizes fail when the operation is started, before any rank waits.
	small, err := pybridge.NewBuffer[int64](3)
	if err != nil {
		return err
	}
	defer small.Close()
	if _, err := pybridge.AllGatherAsync(g, small, small); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("AllGatherAsync with a too small output: got %v, want ErrInvalidArgument", err)
	}
	if _, err := pybridge.AllReduceAsync(g, small, pybridge.Avg); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("AllReduceAsync Avg on int64: got %v, want ErrInvalidArgument", err)
	}
	logf("buffer and work lifecycle errors as documented")
	return nil
}

// A Wait that times out means "not finished yet": a later Wait returns the result.
func checkWaitTimeoutThenResult(g *pybridge.Group) error {
	if g.Size() < 2 || g.Rank() > 1 {
		return g.Barrier()
	}
	buf, err := pybridge.NewBuffer[float32](3)
	if err != nil {
		return err
	}
	defer buf.Close()
	if g.Rank() == 0 {
		w, err := pybridge.IRecv(g, buf, 1, 9)
		if err != nil {
			return err
		}
		defer w.Close()
		if err := w.Wait(200 * time.Millisecond); !errors.Is(err, pybridge.ErrTimeout) {
			return fmt.Errorf("Wait before the peer sent: %v, want ErrTimeout", err)
		}
		if err := w.Wait(20 * time.Second); err != nil {
			return fmt.Errorf("Wait after a timed-out Wait: %v", err)
		}
		if got := buf.Data(); got[0] != 1 || got[2] != 3 {
			return fmt.Errorf("received %v", got)
		}
	} else {
		time.Sleep(time.Second)
		if err := pybridge.Send(g, []float32{1, 2, 3}, 0, 9); err != nil {
			return err
		}
	}
	return g.Barrier()
}
