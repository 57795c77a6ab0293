package main

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

func batch(n int) (pixels, labels []byte) {
	pixels = make([]byte, n*imageSize)
	labels = make([]byte, n)
	for i := range pixels {
		pixels[i] = byte(i * 7 % 251)
	}
	for i := range labels {
		labels[i] = byte(i % numClasses)
	}
	return pixels, labels
}

// Backward accumulates into the memory a gradient views, and the hook reports every
// parameter once, last layer first (the order backward produces them).
func TestBackwardWritesIntoGradViewsAndReportsEachParameter(t *testing.T) {
	m, err := NewModel(16, 1, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	views := make([][]float32, m.NumParams())
	for i := range views {
		_, n, _, err := m.Param(i)
		if err != nil {
			t.Fatal(err)
		}
		var free func()
		views[i], free = cFloats(n) // C memory stands in for a reducer bucket
		defer free()
		if err := m.SetGradView(i, unsafe.Pointer(&views[i][0])); err != nil {
			t.Fatal(err)
		}
	}
	var order []int
	m.OnGradReady(func(i int) error { order = append(order, i); return nil })
	pixels, labels := batch(8)
	if _, _, err := m.ForwardBackward(pixels, labels); err != nil {
		t.Fatal(err)
	}
	if len(order) != 4 || order[0] < 2 || order[3] > 1 {
		t.Fatalf("hook order %v: want each of the 4 parameters once, the second layer's first", order)
	}
	first := append([]float32(nil), views[3]...)
	var norm float32
	for _, v := range first {
		norm += v * v
	}
	if norm == 0 {
		t.Fatal("backward did not write the gradient view")
	}
	for i := range views {
		p, _ := m.GradPointer(i)
		if p != unsafe.Pointer(&views[i][0]) {
			t.Fatalf("parameter %d: gradient moved out of its view", i)
		}
	}
	// A second backward accumulates (torch's semantics); ZeroGrad clears in place.
	if _, _, err := m.ForwardBackward(pixels, labels); err != nil {
		t.Fatal(err)
	}
	for k, v := range views[3] {
		if d := v - 2*first[k]; d > 1e-5 || d < -1e-5 {
			t.Fatalf("b2[%d] = %g after two backward passes, want %g", k, v, 2*first[k])
		}
	}
	if err := m.ZeroGrad(); err != nil {
		t.Fatal(err)
	}
	for _, v := range views[3] {
		if v != 0 {
			t.Fatal("ZeroGrad left a non-zero gradient")
		}
	}
	m.OnGradReady(nil)
}

func TestHookErrorAndBadIndexAreReported(t *testing.T) {
	m, err := NewModel(8, 1, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.OnGradReady(func(i int) error {
		if i == 1 {
			return errBoom
		}
		return nil
	})
	pixels, labels := batch(4)
	if _, _, err := m.ForwardBackward(pixels, labels); err == nil || !strings.Contains(err.Error(), "parameter 1") {
		t.Fatalf("got %v, want the hook failure of parameter 1", err)
	}
	if err := m.SetGradView(4, nil); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("got %v, want an out-of-range error", err)
	}
}

// mlp_last_error is per OS thread; goroutines that fail at once, each with its own bad
// index, must each get their own message (CI once saw an empty one: the goroutine had
// moved to another thread between the failing call and the read).
func TestConcurrentFailuresKeepTheirOwnMessages(t *testing.T) {
	m, err := NewModel(8, 1, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bad := 100 + g
			want := fmt.Sprintf("parameter index %d is out of range", bad)
			for range 500 {
				if err := m.SetGradView(bad, nil); err == nil || !strings.Contains(err.Error(), want) {
					errs <- fmt.Errorf("goroutine %d: got %v, want %q", g, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

type boom struct{}

func (boom) Error() string { return "boom" }

var errBoom error = boom{}
