package main

import (
	"math"
	"math/rand"
	"strconv"

	"github.com/pybridge/pybridge/examples/mnist/mnistdata"
	"github.com/pybridge/pybridge/go/floats"
)

// Image and record layout shared with prepare.py and train.py: one label byte,
// then 28x28 pixel bytes, row-major.
const (
	imageSize  = mnistdata.ImageSize
	recordSize = mnistdata.RecordSize
	numClasses = mnistdata.NumClasses
)

// MLP is a 784-H-10 perceptron with ReLU and softmax cross-entropy, in plain Go.
// Parameters are stored as W1 (H x 784), B1 (H), W2 (10 x H), B2 (10), row-major,
// in that order; Params returns them in that order so that every rank agrees.
type MLP struct {
	Hidden         int
	W1, B1, W2, B2 []float32
}

// NewMLP initializes weights like torch.nn.Linear: uniform in +-1/sqrt(fan_in).
func NewMLP(hidden int, seed int64) *MLP {
	rng := rand.New(rand.NewSource(seed))
	m := &MLP{Hidden: hidden,
		W1: make([]float32, hidden*imageSize), B1: make([]float32, hidden),
		W2: make([]float32, numClasses*hidden), B2: make([]float32, numClasses)}
	fill := func(p []float32, fanIn int) {
		bound := 1 / math.Sqrt(float64(fanIn))
		for i := range p {
			p[i] = float32((rng.Float64()*2 - 1) * bound)
		}
	}
	fill(m.W1, imageSize)
	fill(m.B1, imageSize)
	fill(m.W2, hidden)
	fill(m.B2, hidden)
	return m
}

// Params lists the parameter tensors in a fixed order.
func (m *MLP) Params() [][]float32 { return [][]float32{m.W1, m.B1, m.W2, m.B2} }

// Grads holds one gradient slice per parameter, in Params order. The slices may be
// views into a reducer's buckets: Backward writes into them in place.
type Grads [][]float32

// Activations of one forward pass, kept for the backward pass.
type activations struct {
	x      []float32 // B x 784, scaled to [0, 1]
	h      []float32 // B x H after ReLU
	probs  []float32 // B x 10 softmax
	labels []uint8
}

// Forward computes the mean cross-entropy loss and the number of correct
// predictions of a batch (x: B images of 784 pixels in [0,1]).
func (m *MLP) forward(x []float32, labels []uint8) (act activations, loss float64, correct int) {
	b, hid := len(labels), m.Hidden
	act = activations{x: x, h: make([]float32, b*hid), probs: make([]float32, b*numClasses), labels: labels}
	for n := 0; n < b; n++ {
		xn := x[n*imageSize : (n+1)*imageSize]
		hn := act.h[n*hid : (n+1)*hid]
		for j := 0; j < hid; j++ {
			if s := m.B1[j] + floats.Dot(m.W1[j*imageSize:(j+1)*imageSize], xn); s > 0 {
				hn[j] = s
			}
		}
		logits := act.probs[n*numClasses : (n+1)*numClasses]
		maxLogit := float32(math.Inf(-1))
		best := 0
		for c := 0; c < numClasses; c++ {
			w := m.W2[c*hid : (c+1)*hid]
			s := m.B2[c]
			for j, v := range hn {
				s += w[j] * v
			}
			logits[c] = s
			if s > maxLogit {
				maxLogit, best = s, c
			}
		}
		var sum float64
		for c := range logits {
			e := math.Exp(float64(logits[c] - maxLogit))
			logits[c] = float32(e)
			sum += e
		}
		for c := range logits {
			logits[c] = float32(float64(logits[c]) / sum)
		}
		loss -= math.Log(math.Max(float64(logits[labels[n]]), 1e-30))
		if best == int(labels[n]) {
			correct++
		}
	}
	return act, loss / float64(b), correct
}

// backward writes the gradients of the mean loss into g, last layer first, and calls
// ready(i) as soon as parameter i's gradient is complete (so its reduction can start
// while the earlier layers' gradients are still being computed).
func (m *MLP) backward(act activations, g Grads, ready func(i int) error) error {
	b, hid := len(act.labels), m.Hidden
	gW1, gB1, gW2, gB2 := g[0], g[1], g[2], g[3]
	dlogits := make([]float32, b*numClasses)
	inv := 1 / float32(b)
	for n := 0; n < b; n++ {
		for c := 0; c < numClasses; c++ {
			d := act.probs[n*numClasses+c]
			if c == int(act.labels[n]) {
				d--
			}
			dlogits[n*numClasses+c] = d * inv
		}
	}
	clear(gW2)
	clear(gB2)
	for n := 0; n < b; n++ {
		hn := act.h[n*hid : (n+1)*hid]
		for c := 0; c < numClasses; c++ {
			d := dlogits[n*numClasses+c]
			gB2[c] += d
			row := gW2[c*hid : (c+1)*hid]
			for j, v := range hn {
				row[j] += d * v
			}
		}
	}
	if err := ready(3); err != nil {
		return err
	}
	if err := ready(2); err != nil {
		return err
	}
	dh := make([]float32, b*hid)
	for n := 0; n < b; n++ {
		hn := act.h[n*hid : (n+1)*hid]
		dn := dh[n*hid : (n+1)*hid]
		for c := 0; c < numClasses; c++ {
			d := dlogits[n*numClasses+c]
			w := m.W2[c*hid : (c+1)*hid]
			for j := range dn {
				dn[j] += d * w[j]
			}
		}
		for j := range dn {
			if hn[j] <= 0 {
				dn[j] = 0
			}
		}
	}
	clear(gW1)
	clear(gB1)
	for n := 0; n < b; n++ {
		xn := act.x[n*imageSize : (n+1)*imageSize]
		dn := dh[n*hid : (n+1)*hid]
		for j, d := range dn {
			if d == 0 {
				continue
			}
			gB1[j] += d
			floats.Axpy(d, xn, gW1[j*imageSize:(j+1)*imageSize])
		}
	}
	if err := ready(1); err != nil {
		return err
	}
	return ready(0)
}

// SGD with momentum, as torch.optim.SGD: buf = momentum*buf + grad; p -= lr*buf.
type SGD struct {
	LR, Momentum float32
	bufs         [][]float32
}

func (o *SGD) Step(params [][]float32, grads Grads) {
	o.ensureBufs(params)
	for i, p := range params {
		buf, g := o.bufs[i], grads[i]
		for k := range p {
			buf[k] = o.Momentum*buf[k] + g[k]
			p[k] -= o.LR * buf[k]
		}
	}
}

// ensureBufs allocates zero momentum buffers for params unless they exist.
func (o *SGD) ensureBufs(params [][]float32) {
	if o.bufs == nil {
		o.bufs = make([][]float32, len(params))
		for i, p := range params {
			o.bufs[i] = make([]float32, len(p))
		}
	}
}

// decodeBatch turns RecordIO records (label byte + 784 pixels) into model input.
func decodeBatch(records [][]byte) (x []float32, labels []uint8, err error) {
	x = make([]float32, len(records)*imageSize)
	labels = make([]uint8, len(records))
	for n, r := range records {
		if len(r) != recordSize {
			return nil, nil, errRecordSize(len(r))
		}
		labels[n] = r[0]
		for k, p := range r[1:] {
			x[n*imageSize+k] = float32(p) / 255
		}
	}
	return x, labels, nil
}

type errRecordSize int

func (e errRecordSize) Error() string {
	return "mnist: record of " + strconv.Itoa(int(e)) + " bytes, want 785 (1 label byte + 784 pixels)"
}
