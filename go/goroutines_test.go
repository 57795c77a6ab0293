package pybridge_test

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() { world2.share("goroutines", "TestAnyGoroutine2Ranks") }

func TestAnyGoroutine2Ranks(t *testing.T) {
	expectRolePass(t, world2, "goroutines")
}

// roleGoroutines issues every collective from a fresh goroutine, none locked to
// its OS thread. All goroutines start at once and take turns in index order
// (the order all ranks must share); each turn runs under a mutex.
func roleGoroutines() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	const steps = 120
	var (
		mu      sync.Mutex
		turn    = sync.NewCond(&mu)
		next    int
		threads = map[int]bool{}
		wg      sync.WaitGroup
	)
	errs := make([]error, steps)
	for i := range steps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			for next != i {
				turn.Wait()
			}
			threads[syscall.Gettid()] = true
			errs[i] = goroutineStep(g, i)
			next++
			turn.Broadcast()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	logf("%d collectives from %d goroutines ran on %d OS threads", steps, steps, len(threads))
	return g.Close()
}

func goroutineStep(g *pybridge.Group, i int) error {
	n, me := g.Size(), g.Rank()
	switch i % 4 {
	case 0:
		data := []float32{float32(me + i), float32(i)}
		if err := pybridge.AllReduce(g, data, pybridge.Sum); err != nil {
			return err
		}
		return same("AllReduce", data, []float32{float32(n*(n-1)/2 + n*i), float32(n * i)})
	case 1:
		root := i % n
		data := []int64{int64(me*1000 + i)}
		if err := pybridge.Broadcast(g, data, root); err != nil {
			return err
		}
		return same("Broadcast", data, []int64{int64(root*1000 + i)})
	case 2:
		return g.Barrier()
	default:
		// Started here, waited for on yet another goroutine.
		b, err := pybridge.NewBuffer[pybridge.BFloat16](3)
		if err != nil {
			return err
		}
		defer b.Close()
		for j := range b.Data() {
			b.Data()[j] = pybridge.BFloat16FromFloat32(float32(me + j))
		}
		w, err := pybridge.AllReduceAsync(g, b, pybridge.Max)
		if err != nil {
			return err
		}
		done := make(chan error)
		go func() {
			defer w.Close()
			done <- w.Wait(0)
		}()
		if err := <-done; err != nil {
			return err
		}
		want := make([]pybridge.BFloat16, 3)
		for j := range want {
			want[j] = pybridge.BFloat16FromFloat32(float32(n - 1 + j))
		}
		return same("AllReduceAsync", b.Data(), want)
	}
}
