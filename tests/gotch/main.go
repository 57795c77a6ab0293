// Command gotch trains a small gotch model (two nn.NewLinear layers, gotch's SGD with
// momentum) on one process or, under pybridge-launch, data-parallel; tests/test_gotch.py
// builds it against a gotch checkout, beside docs/go.md's gotch block (gotchparams.go:
// gotchTensor, gotchParams, attachGotch), which is what it tests. Modes:
//
//	single  one process on the whole batch, no pybridge
//	copy    each rank its share of the batch, AttachReducer over gotchParams (copy mode)
//	view    the same with pybridge.WithGradAsBucketView(); after every backward each
//	        gradient must be its bucket's memory
//	ws      AttachReducer over the layer's Ws and Bs, which must be refused
//
// Rank 0 (or the single process) writes the trained parameters by name to -out as JSON.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"runtime"

	pybridge "github.com/pybridge/pybridge/go"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/nn"
	"github.com/sugarme/gotch/ts"
)

// The model and the global batch; tests/test_gotch.py computes the same with torch.
const (
	batch, in, hidden, out = 16, 8, 16, 4
	lr, momentum           = 0.05, 0.9
)

// data is rows [lo, hi) of the global batch: a fixed formula, the same on every rank.
func data(lo, hi int) (*ts.Tensor, *ts.Tensor) {
	var xs, ys []float32
	for i := lo; i < hi; i++ {
		for j := 0; j < in; j++ {
			xs = append(xs, float32(math.Sin(float64(i*in+j))))
		}
		for j := 0; j < out; j++ {
			ys = append(ys, float32(math.Cos(0.7*float64(i*out+j))))
		}
	}
	return ts.MustOfSlice(xs).MustView([]int64{int64(hi - lo), in}, true),
		ts.MustOfSlice(ys).MustView([]int64{int64(hi - lo), out}, true)
}

// fixedStart sets parameter i (gotchParams' order) to 0.3*sin(1.3k + i), k its flat index:
// gotch has no seed, and the single process must start where rank 0 does.
func fixedStart(params []pybridge.TensorSource) {
	for i, p := range params {
		x := p.(gotchTensor).Tensor
		v := make([]float32, x.Numel())
		for k := range v {
			v[k] = float32(0.3 * math.Sin(1.3*float64(k)+float64(i)))
		}
		ts.NoGrad(func() { x.Copy_(ts.MustOfSlice(v).MustView(x.MustSize(), true)) })
	}
}

func main() {
	mode := flag.String("mode", "single", "single, copy, view or ws")
	steps := flag.Int("steps", 20, "SGD steps")
	outPath := flag.String("out", "", "where rank 0 writes the trained parameters (JSON)")
	flag.Parse()
	if err := run(*mode, *steps, *outPath); err != nil {
		log.Fatal(err)
	}
}

func run(mode string, steps int, outPath string) error {
	runtime.LockOSThread() // libtorch's grad mode is per OS thread (docs/go.md, gotch)
	vs := nn.NewVarStore(gotch.CPU)
	l1 := nn.NewLinear(vs.Root().Sub("l1"), in, hidden, nn.DefaultLinearConfig())
	l2 := nn.NewLinear(vs.Root().Sub("l2"), hidden, out, nn.DefaultLinearConfig())
	rank, world := 0, 1
	var g *pybridge.Group
	if mode != "single" {
		var err error
		if g, err = pybridge.Init(); err != nil {
			return err
		}
		defer g.Close()
		rank, world = g.Rank(), g.Size()
	}
	if rank == 0 { // the other ranks keep gotch's random start: attachGotch broadcasts rank 0's
		fixedStart(gotchParams(vs))
	}
	var r *pybridge.Reducer
	switch mode {
	case "single":
	case "copy", "view":
		var opts []pybridge.ReducerOption
		if mode == "view" {
			opts = append(opts, pybridge.WithGradAsBucketView())
		}
		var err error
		if r, err = attachGotch(g, vs, opts...); err != nil {
			return err
		}
		defer r.Close()
	case "ws":
		_, err := pybridge.AttachReducer(g, []pybridge.TensorSource{gotchTensor{l1.Ws}, gotchTensor{l1.Bs}})
		if err == nil {
			return fmt.Errorf("AttachReducer took Linear.Ws")
		}
		fmt.Printf("refused: %v\n", err)
		return nil
	default:
		return fmt.Errorf("unknown -mode %q", mode)
	}

	per := batch / world
	x, y := data(rank*per, (rank+1)*per)
	opt, err := nn.NewSGDConfig(momentum, 0, 0, false).Build(vs, lr)
	if err != nil {
		return err
	}
	inPlace := 0
	for step := 0; step < steps; step++ {
		if err := opt.ZeroGrad(); err != nil {
			return err
		}
		loss := l2.Forward(l1.Forward(x).MustRelu(true)).MustMseLoss(y, 1, true) // 1: the mean
		// With a reducer attached, the gradients are averaged when backward returns.
		loss.MustBackward()
		loss.MustDrop()
		if r != nil {
			if err := r.Wait(0); err != nil {
				return err
			}
		}
		if mode == "view" {
			if err := checkInPlace(r, gotchParams(vs)); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
			inPlace++
		}
		if err := opt.Step(); err != nil {
			return err
		}
	}
	if mode == "view" {
		fmt.Printf("rank %d: every gradient was its bucket's memory after %d of %d steps\n", rank, inPlace, steps)
	}
	if rank != 0 || outPath == "" {
		return nil
	}
	trained := map[string][]float64{}
	for name := range vs.Variables() {
		trained[name] = vs.Root().MustGet(name).Float64Values()
	}
	b, err := json.Marshal(trained)
	if err != nil {
		return err
	}
	return os.WriteFile(outPath, b, 0o644)
}

// checkInPlace fails unless each parameter's gradient (as libtorch holds it) is the memory of
// its place in the reducer's bucket: backward wrote the bucket and nothing was copied.
func checkInPlace(r *pybridge.Reducer, params []pybridge.TensorSource) error {
	for i, p := range params {
		place, err := r.GradTensor(i)
		if err != nil {
			return err
		}
		grad := p.(gotchTensor).MustGrad(false)
		have := grad.MustDataPtr()
		grad.MustDrop()
		if have != place.Data {
			return fmt.Errorf("parameter %d: gradient at %p, its bucket place at %p", i, have, place.Data)
		}
	}
	return nil
}
