package floats

import "testing"

// The kernels against the plain loops, for every length around the 4-wide
// unrolling (the tail), with values whose products and sums are exact in float32.
func TestDotAndAxpyMatchPlainLoops(t *testing.T) {
	for n := 0; n <= 9; n++ {
		a, b := make([]float32, n), make([]float32, n+2) // b longer: only len(a) counts
		for i := range b {
			b[i] = float32(i%5) - 2
		}
		var want float32
		for i := range a {
			a[i] = float32(i + 1)
			want += a[i] * b[i]
		}
		if got := Dot(a, b); got != want {
			t.Errorf("Dot, n=%d: got %v, want %v", n, got, want)
		}
		y := append([]float32(nil), b...)
		Axpy(0.5, a, y)
		for i := range y {
			w := b[i]
			if i < n {
				w += 0.5 * a[i]
			}
			if y[i] != w {
				t.Errorf("Axpy, n=%d: y[%d] = %v, want %v", n, i, y[i], w)
			}
		}
	}
}

func TestShortSecondOperandPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Dot with b shorter than a did not panic")
		}
	}()
	Dot(make([]float32, 4), make([]float32, 3))
}
