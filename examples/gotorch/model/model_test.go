package model_test

import (
	"fmt"
	"github.com/pybridge/pybridge/examples/gotorch/model"
	"github.com/pybridge/pybridge/examples/mnist/mnistdata"
	"strings"
	"sync"
	"testing"
)

func batch(n int) (pixels, labels []byte) {
	pixels = make([]byte, n*mnistdata.ImageSize)
	labels = make([]byte, n)
	for i := range pixels {
		pixels[i] = byte(i * 7 % 251)
	}
	for i := range labels {
		labels[i] = byte(i % mnistdata.NumClasses)
	}
	return pixels, labels
}

// Backward gives every parameter a gradient; ZeroGrad drops them (set to none, as
// libtorch's optimizers do), and a second backward makes fresh ones.
func TestBackwardMakesGradientsAndZeroGradDropsThem(t *testing.T) {
	m, err := model.NewModel(16, 1, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pixels, labels := batch(8)
	if _, _, err := m.ForwardBackward(pixels, labels); err != nil {
		t.Fatal(err)
	}
	for i := range m.NumParams() {
		if _, err := m.GradHandle(i); err != nil {
			t.Fatalf("parameter %d after backward: %v", i, err)
		}
		p, err := m.ParamHandle(i)
		if err != nil || p.Data == nil {
			t.Fatalf("parameter %d: handle %v, %v", i, p.Data, err)
		}
	}
	if err := m.ZeroGrad(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.GradHandle(3); err == nil || !strings.Contains(err.Error(), "has no gradient") {
		t.Fatalf("after ZeroGrad: got %v, want no gradient", err)
	}
	if p, _ := m.GradPointer(3); p != nil {
		t.Fatal("ZeroGrad left a gradient")
	}
}

func TestBadIndexIsReported(t *testing.T) {
	m, err := model.NewModel(8, 1, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.ParamHandle(4); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("got %v, want an out-of-range error", err)
	}
}

// mlp_last_error is per OS thread; goroutines that fail at once, each with its own bad
// index, must each get their own message (CI once saw an empty one: the goroutine had
// moved to another thread between the failing call and the read).
func TestConcurrentFailuresKeepTheirOwnMessages(t *testing.T) {
	m, err := model.NewModel(8, 1, -1)
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
				if _, err := m.ParamHandle(bad); err == nil || !strings.Contains(err.Error(), want) {
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
