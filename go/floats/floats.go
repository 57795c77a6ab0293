// Package floats holds the float32 vector kernels that the MNIST example
// (examples/mnist) and the reducer benchmark (bench/reducer_go) share, so that
// both compute a dot product the same way. It is pure Go (no cgo) and not part
// of pybridge's training API.
package floats

// Dot returns sum(a[i]*b[i]) over a; b must be at least as long as a. Four
// accumulators let the CPU overlap the additions (a first layer's 784-long dot
// products dominate an MNIST step); they are added pairwise.
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// Axpy computes y[i] += alpha*x[i] over x; y must be at least as long as x.
func Axpy(alpha float32, x, y []float32) {
	y = y[:len(x)]
	i := 0
	for ; i+4 <= len(x); i += 4 {
		y[i] += alpha * x[i]
		y[i+1] += alpha * x[i+1]
		y[i+2] += alpha * x[i+2]
		y[i+3] += alpha * x[i+3]
	}
	for ; i < len(x); i++ {
		y[i] += alpha * x[i]
	}
}
