package main

import (
	"math"
	"math/rand"
	"testing"
)

// The analytic gradients of backward match central finite differences of the loss.
func TestBackwardMatchesFiniteDifferences(t *testing.T) {
	m := NewMLP(6, 1)
	rng := rand.New(rand.NewSource(2))
	const b = 3
	x := make([]float32, b*imageSize)
	for i := range x {
		x[i] = rng.Float32()
	}
	labels := []uint8{1, 7, 3}
	grads := Grads{make([]float32, len(m.W1)), make([]float32, len(m.B1)),
		make([]float32, len(m.W2)), make([]float32, len(m.B2))}
	act, _, _ := m.forward(x, labels)
	var order []int
	if err := m.backward(act, grads, func(i int) error { order = append(order, i); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []int{3, 2, 1, 0}; !equalInts(order, want) {
		t.Fatalf("ready order %v, want last layer first %v", order, want)
	}
	loss := func() float64 { _, l, _ := m.forward(x, labels); return l }
	for pi, p := range m.Params() {
		for trial := 0; trial < 12; trial++ {
			k := rng.Intn(len(p))
			orig := p[k]
			const eps = 1e-3
			p[k] = orig + eps
			up := loss()
			p[k] = orig - eps
			down := loss()
			p[k] = orig
			numeric := (up - down) / (2 * eps)
			if diff := math.Abs(numeric - float64(grads[pi][k])); diff > 2e-3+0.05*math.Abs(numeric) {
				t.Errorf("param %d[%d]: analytic %g, numeric %g", pi, k, grads[pi][k], numeric)
			}
		}
	}
}

func TestSGDMomentumMatchesTorchRule(t *testing.T) {
	p := [][]float32{{1, 2}}
	o := &SGD{LR: 0.5, Momentum: 0.9}
	o.Step(p, Grads{{1, -1}}) // buf = g
	o.Step(p, Grads{{1, -1}}) // buf = 0.9*g + g = 1.9 g
	want := []float32{1 - 0.5*1 - 0.5*1.9, 2 + 0.5*1 + 0.5*1.9}
	for i := range want {
		if math.Abs(float64(p[0][i]-want[i])) > 1e-6 {
			t.Fatalf("got %v want %v", p[0], want)
		}
	}
}

func TestDecodeBatchRejectsWrongRecordSize(t *testing.T) {
	rec := make([]byte, recordSize)
	rec[0], rec[1] = 4, 255
	x, labels, err := decodeBatch([][]byte{rec})
	if err != nil || labels[0] != 4 || x[0] != 1 {
		t.Fatalf("decode: %v %v %v", x[:2], labels, err)
	}
	if _, _, err := decodeBatch([][]byte{rec[:10]}); err == nil {
		t.Fatal("a 10-byte record was accepted")
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
