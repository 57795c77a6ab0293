package pybridge

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestYieldDuePacesYields(t *testing.T) {
	saved := lastYield.Load()
	defer lastYield.Store(saved)
	const ms = int64(1e6)
	base := saved + 100*ms
	if !yieldDue(base) {
		t.Fatal("no yield due after a long quiet time")
	}
	if yieldDue(base) || yieldDue(base+int64(yieldEvery)-1) {
		t.Fatal("yield due again before yieldEvery passed")
	}
	if !yieldDue(base + int64(yieldEvery)) {
		t.Fatal("no yield due once yieldEvery passed")
	}
}

func TestYieldDueOneOfConcurrentCallers(t *testing.T) {
	saved := lastYield.Load()
	defer lastYield.Store(saved)
	now := saved + int64(100*yieldEvery)
	var yields atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if yieldDue(now) {
				yields.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := yields.Load(); n != 1 {
		t.Fatalf("%d of 8 concurrent callers yielded, want 1", n)
	}
}
