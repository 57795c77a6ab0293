// Command reducer_go is the Go row of bench/reducer.py: model (a), an MLP of 50
// Linear(256, 256) layers with ReLU between them, trained with batch 32 per rank.
// Forward and backward run in plain Go loops; each layer's weight gradient is
// written straight into the reducer's memory and marked ready as soon as the
// backward pass has produced it, so bucket allreduces overlap the rest of
// backward. It also times the sync alone (mark every gradient, then Wait) with
// no compute, to separate the reducer's cost from Go's matmul speed.
//
// Usage (as each of 2 ranks, with the launcher environment set):
//
//	reducer_go OUT_PREFIX ROUNDS ITERS THREADS
//
// Each rank writes OUT_PREFIX-RANK.json with per-step seconds.
package main

import (
	"encoding/json"
	"fmt"
	"log"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
	"github.com/pybridge/pybridge/go/floats"
)

const (
	width = 256
	depth = 50
	batch = 32
)

type model struct {
	w, b [][]float32 // w[l]: width x width (out x in, like torch's Linear), b[l]: width
	acts [][]float32 // acts[l]: input of layer l (batch x width); acts[depth]: output
	dy   []float32   // gradient flowing backward (batch x width)
	dx   []float32
}

func newModel(seed int64) *model {
	rng := rand.New(rand.NewSource(seed))
	m := &model{}
	bound := 1 / float32(16) // 1/sqrt(256), torch's default init range
	for l := 0; l < depth; l++ {
		w := make([]float32, width*width)
		for i := range w {
			w[i] = (rng.Float32()*2 - 1) * bound
		}
		b := make([]float32, width)
		for i := range b {
			b[i] = (rng.Float32()*2 - 1) * bound
		}
		m.w, m.b = append(m.w, w), append(m.b, b)
	}
	for l := 0; l <= depth; l++ {
		m.acts = append(m.acts, make([]float32, batch*width))
	}
	m.dy, m.dx = make([]float32, batch*width), make([]float32, batch*width)
	return m
}

// parallel runs f(lo, hi) over [0, n) split into `threads` pieces.
func parallel(n, threads int, f func(lo, hi int)) {
	if threads <= 1 {
		f(0, n)
		return
	}
	var wg sync.WaitGroup
	for t := 0; t < threads; t++ {
		lo, hi := n*t/threads, n*(t+1)/threads
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
}

func (m *model) forward(x []float32, threads int) {
	copy(m.acts[0], x)
	for l := 0; l < depth; l++ {
		in, out, w, b := m.acts[l], m.acts[l+1], m.w[l], m.b[l]
		relu := l < depth-1
		parallel(batch, threads, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				xr, yr := in[r*width:(r+1)*width], out[r*width:(r+1)*width]
				for o := 0; o < width; o++ {
					v := floats.Dot(xr, w[o*width:(o+1)*width]) + b[o]
					if relu && v < 0 {
						v = 0
					}
					yr[o] = v
				}
			}
		})
	}
}

// backward of loss = mean(out^2); gw/gb return layer l's gradient slices and
// ready(l) is called once both are written.
func (m *model) backward(threads int, gw, gb func(l int) []float32, ready func(l int)) {
	out := m.acts[depth]
	scale := 2 / float32(len(out))
	for i, v := range out {
		m.dy[i] = scale * v
	}
	for l := depth - 1; l >= 0; l-- {
		in, w := m.acts[l], m.w[l]
		dW, db := gw(l), gb(l)
		dy := m.dy
		parallel(width, threads, func(lo, hi int) {
			for o := lo; o < hi; o++ {
				row := dW[o*width : (o+1)*width]
				clear(row)
				var s float32
				for r := 0; r < batch; r++ {
					a := dy[r*width+o]
					s += a
					if a != 0 {
						floats.Axpy(a, in[r*width:(r+1)*width], row)
					}
				}
				db[o] = s
			}
		})
		ready(l)
		if l == 0 {
			break
		}
		dx := m.dx
		parallel(batch, threads, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				xr := dx[r*width : (r+1)*width]
				clear(xr)
				for o := 0; o < width; o++ {
					if a := dy[r*width+o]; a != 0 {
						floats.Axpy(a, w[o*width:(o+1)*width], xr)
					}
				}
				// ReLU of the previous layer: its output is this layer's input.
				for i, v := range in[r*width : (r+1)*width] {
					if v <= 0 {
						xr[i] = 0
					}
				}
			}
		})
		m.dy, m.dx = m.dx, m.dy
	}
}

func main() {
	if len(os.Args) != 5 {
		log.Fatalf("usage: %s OUT_PREFIX ROUNDS ITERS THREADS", os.Args[0])
	}
	rounds, err1 := strconv.Atoi(os.Args[2])
	iters, err2 := strconv.Atoi(os.Args[3])
	threads, err3 := strconv.Atoi(os.Args[4])
	if err1 != nil || err2 != nil || err3 != nil {
		log.Fatalf("bad arguments %q", os.Args[2:])
	}
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(120*time.Second))
	must(err)
	defer g.Close()

	m := newModel(int64(g.Rank()))
	// Parameters in torch's order (layer 0 weight, layer 0 bias, ...): every rank
	// starts from rank 0's weights.
	var params [][]float32
	var specs []pybridge.ParamSpec
	for l := 0; l < depth; l++ {
		params = append(params, m.w[l], m.b[l])
		specs = append(specs, pybridge.Params[float32](width*width, width)...)
	}
	must(pybridge.BroadcastParams(g, params, 0))
	r, err := pybridge.NewReducer(g, specs, pybridge.WithBucketCapMB(25))
	must(err)
	defer r.Close()
	// The same reducer with uneven inputs enabled: each iteration starts with a count.
	rj, err := pybridge.NewReducer(g, specs, pybridge.WithBucketCapMB(25), pybridge.WithJoin())
	must(err)
	defer rj.Close()

	rng := rand.New(rand.NewSource(int64(100 + g.Rank())))
	x := make([]float32, batch*width)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	grad := func(i int) []float32 {
		v, err := r.Grad(i)
		must(err)
		return v
	}
	var waitTime time.Duration
	step := func() {
		m.forward(x, threads)
		m.backward(threads,
			func(l int) []float32 { return grad(2 * l) },
			func(l int) []float32 { return grad(2*l + 1) },
			func(l int) {
				must(r.MarkReady(2*l + 1))
				must(r.MarkReady(2 * l))
			})
		t := time.Now()
		must(r.Wait(0))
		waitTime += time.Since(t)
	}
	syncOnlyOn := func(r *pybridge.Reducer) {
		for l := depth - 1; l >= 0; l-- {
			must(r.MarkReady(2*l + 1))
			must(r.MarkReady(2 * l))
		}
		must(r.Wait(0))
	}
	syncOnly := func() { syncOnlyOn(r) }
	results := map[string][]float64{}
	for i := 0; i < 2; i++ { // warm-up; the first Wait rebuilds the buckets
		step()
	}
	for round := 0; round < rounds; round++ {
		must(g.Barrier())
		for i := 0; i < iters; i++ {
			waitTime = 0
			t := time.Now()
			step()
			results["step"] = append(results["step"], time.Since(t).Seconds())
			results["wait"] = append(results["wait"], waitTime.Seconds())
		}
		syncOnly()
		must(g.Barrier())
		for i := 0; i < iters; i++ {
			t := time.Now()
			syncOnly()
			results["sync_only"] = append(results["sync_only"], time.Since(t).Seconds())
		}
		syncOnlyOn(rj)
		must(g.Barrier())
		for i := 0; i < iters; i++ {
			t := time.Now()
			syncOnlyOn(rj)
			results["sync_only_join"] = append(results["sync_only_join"], time.Since(t).Seconds())
		}
	}
	// Sanity: every rank holds the same averaged gradient.
	check := []float64{float64(grad(0)[0]), float64(grad(98)[7])}
	all := make([]float64, 2*g.Size())
	must(pybridge.AllGather(g, check, all))
	for q := 1; q < g.Size(); q++ {
		if all[2*q] != all[0] || all[2*q+1] != all[1] {
			log.Fatalf("ranks disagree on reduced gradients: %v", all)
		}
	}
	out, _ := json.Marshal(results)
	must(os.WriteFile(fmt.Sprintf("%s-%d.json", os.Args[1], g.Rank()), out, 0o644))
	must(g.Close())
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
