package pybridge_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	pybridge "github.com/pybridge/pybridge/go"
)

// Every type holding a library handle keeps one contract (go/handle.go): a nil
// receiver is ErrInvalidArgument naming the type, a call after Close is ErrClosed,
// a second Close is nil, and Close is safe against calls on other goroutines.

func TestNilHandlesNameTheirType(t *testing.T) {
	second := func(_ bool, err error) error { return err }
	joinErr := func(_ pybridge.JoinResult, err error) error { return err }
	asyncErr := func(_ *pybridge.Work, err error) error { return err }
	var (
		g *pybridge.Group
		b *pybridge.Buffer[float32]
		w *pybridge.Work
		l *pybridge.Loader
		r *pybridge.Reducer
		s *pybridge.FedServer[float32]
		f *pybridge.FedWorker[float32]
	)
	for _, c := range []struct {
		call string
		err  error
		want string
	}{
		{"Group.Barrier", g.Barrier(), "nil *Group"},
		{"Group.Close", g.Close(), "nil *Group"},
		{"AllReduceAsync", asyncErr(pybridge.AllReduceAsync(g, b, pybridge.Sum)), "nil *Group"},
		{"Buffer.Close", b.Close(), "nil *Buffer"},
		{"Work.Wait", w.Wait(0), "nil *Work"},
		{"Work.Test", second(w.Test()), "nil *Work"},
		{"Work.Close", w.Close(), "nil *Work"},
		{"Loader.SetEpoch", l.SetEpoch(0), "nil *Loader"},
		{"Loader.Err", l.Err(), "nil *Loader"},
		{"Loader.Close", l.Close(), "nil *Loader"},
		{"Reducer.Zero", r.Zero(), "nil *Reducer"},
		{"Reducer.Close", r.Close(), "nil *Reducer"},
		{"Reducer.Join", joinErr(r.Join()), "nil *Reducer"},
		{"FedServer.Payload", s.Payload(nil), "nil *FedServer"},
		{"FedServer.Close", s.Close(), "nil *FedServer"},
		{"FedWorker.Fail", f.Fail("x"), "nil *FedWorker"},
		{"FedWorker.Close", f.Close(), "nil *FedWorker"},
	} {
		if !errors.Is(c.err, pybridge.ErrInvalidArgument) || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s on nil: got %v, want ErrInvalidArgument saying %q", c.call, c.err, c.want)
		}
	}
}

// TestCloseRacesWithCalls closes a loader and a buffer from several goroutines while
// others use them: every Close returns nil, every call succeeds or (once closed) says
// ErrClosed, and nothing reaches the library after Close.
func TestCloseRacesWithCalls(t *testing.T) {
	files, _ := writeDataset(t, t.TempDir(), 1, 4)
	l, err := pybridge.OpenLoader(nil, files, 2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pybridge.NewBuffer[int32](8)
	if err != nil {
		t.Fatal(err)
	}
	const users, closers, calls = 6, 3, 40
	var wg sync.WaitGroup
	errs := make(chan error, users*calls+closers*2)
	start := make(chan struct{})
	for i := 0; i < users; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			closed := false
			for j := 0; j < calls; j++ {
				_, err := l.Epoch()
				switch {
				case err == nil && closed:
					errs <- errors.New("Loader.Epoch succeeded after it had said ErrClosed")
				case errors.Is(err, pybridge.ErrClosed):
					closed = true
				case err != nil:
					errs <- err
				}
				if d := b.Data(); d != nil && len(d) != 8 {
					errs <- errors.New("Buffer.Data: a slice of the wrong length")
				}
			}
		}()
	}
	for i := 0; i < closers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := l.Close(); err != nil {
				errs <- err
			}
			if err := b.Close(); err != nil {
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := l.SetEpoch(1); !errors.Is(err, pybridge.ErrClosed) || !strings.Contains(err.Error(), "loader is closed") {
		t.Errorf("SetEpoch after Close: %v", err)
	}
	if b.Data() != nil {
		t.Error("Buffer.Data after Close is not nil")
	}
}
