package pybridge_test

import (
	"errors"
	"fmt"
	"log"
	"math"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() {
	roles["reducer"] = roleReducerTraining
}

// A tiny MLP with manual gradients: out = w2 . tanh(W1 x + b1) + b2, loss =
// mean over the batch of (out - y)^2 / 2. Parameters in definition order:
// W1 (hidden x in), b1, w2 (hidden), b2 (1).
const (
	mlpIn     = 4
	mlpHidden = 8
	batch     = 12 // global batch: divisible by 2 and 3 ranks
	steps     = 20
	lr        = 0.1
)

var mlpLens = []int{mlpHidden * mlpIn, mlpHidden, mlpHidden, 1}

type sample struct {
	x [mlpIn]float64
	y float64
}

// dataset is the same global batch on every rank.
func dataset() []sample {
	rng := rand.New(rand.NewSource(42))
	out := make([]sample, batch)
	for i := range out {
		s := 0.0
		for j := range out[i].x {
			out[i].x[j] = rng.Float64()*2 - 1
			s += float64(j+1) * out[i].x[j]
		}
		out[i].y = math.Sin(s)
	}
	return out
}

// initParams returns the weights a rank starts from (deliberately different per
// seed, so that BroadcastParams is what makes the ranks agree).
func initParams(seed int64) [][]float32 {
	rng := rand.New(rand.NewSource(seed))
	ps := make([][]float32, len(mlpLens))
	for i, n := range mlpLens {
		ps[i] = make([]float32, n)
		for j := range ps[i] {
			ps[i][j] = float32(rng.NormFloat64() * 0.5)
		}
	}
	return ps
}

// backward computes the gradients of the mean loss over data with respect to
// the parameters p (W1, b1, w2, b2), handing each parameter's gradient to emit
// as soon as it is complete: the output layer's (w2, b2) before W1 and b1, as a
// backward pass produces them. emit(i) returns the slice to write gradient i to.
func backward[T float32 | float64](p [][]T, data []sample, emit func(i int) []T, done func(i int)) {
	w1, b1, w2, b2 := p[0], p[1], p[2], p[3]
	n := float64(len(data))
	h := make([][mlpHidden]float64, len(data))
	dout := make([]float64, len(data))
	for s, d := range data {
		out := float64(b2[0])
		for k := 0; k < mlpHidden; k++ {
			a := float64(b1[k])
			for j := 0; j < mlpIn; j++ {
				a += float64(w1[k*mlpIn+j]) * d.x[j]
			}
			h[s][k] = math.Tanh(a)
			out += float64(w2[k]) * h[s][k]
		}
		dout[s] = (out - d.y) / n
	}
	gw2, gb2 := emit(2), emit(3)
	for k := range gw2 {
		acc := 0.0
		for s := range data {
			acc += dout[s] * h[s][k]
		}
		gw2[k] = T(acc)
	}
	done(2)
	acc := 0.0
	for s := range data {
		acc += dout[s]
	}
	gb2[0] = T(acc)
	done(3)
	gw1, gb1 := emit(0), emit(1)
	for k := 0; k < mlpHidden; k++ {
		ga := 0.0
		for j := 0; j < mlpIn; j++ {
			gw := 0.0
			for s, d := range data {
				dh := dout[s] * float64(w2[k]) * (1 - h[s][k]*h[s][k])
				gw += dh * d.x[j]
				if j == 0 {
					ga += dh
				}
			}
			gw1[k*mlpIn+j] = T(gw)
		}
		gb1[k] = T(ga)
	}
	done(0)
	done(1)
}

func sgd[T float32 | float64, G float32 | float64](p []T, g []G) {
	for i := range p {
		p[i] -= T(lr * float64(g[i]))
	}
}

// reference trains on the whole global batch in one process, in float64,
// without the library: the independent result data-parallel training must match.
func reference() [][]float64 {
	init := initParams(1) // rank 0's seed: everyone starts from rank 0's weights
	p := make([][]float64, len(init))
	for i, v := range init {
		p[i] = make([]float64, len(v))
		for j := range v {
			p[i][j] = float64(v[j])
		}
	}
	grads := make([][]float64, len(p))
	for i := range p {
		grads[i] = make([]float64, len(p[i]))
	}
	data := dataset()
	for s := 0; s < steps; s++ {
		backward(p, data, func(i int) []float64 { return grads[i] }, func(int) {})
		for i := range p {
			sgd(p[i], grads[i])
		}
	}
	return p
}

func roleReducerTraining() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	rank, world := g.Rank(), g.Size()
	params := initParams(int64(rank) + 1)
	if err := pybridge.BroadcastParams(g, params, 0); err != nil {
		return err
	}
	// A tiny bucket cap puts every parameter in its own bucket, so the first
	// iteration's marking order (w2, b2, W1, b1) rebuilds the layout.
	r, err := pybridge.NewReducer(g, pybridge.Params[float32](mlpLens...), pybridge.WithBucketCapMB(1e-5))
	if err != nil {
		return err
	}
	defer r.Close()
	data := dataset()
	per := batch / world
	local := data[rank*per : (rank+1)*per]
	var markErr error
	for s := 0; s < steps; s++ {
		backward(params, local,
			func(i int) []float32 {
				v, err := r.Grad(i)
				if err != nil && markErr == nil {
					markErr = err
				}
				return v
			},
			func(i int) {
				if err := r.MarkReady(i); err != nil && markErr == nil {
					markErr = err
				}
			})
		if markErr != nil {
			return markErr
		}
		if err := r.Wait(20 * time.Second); err != nil {
			return err
		}
		if s == 0 && r.Generation() != 1 {
			return fmt.Errorf("generation %d after the first Wait, want 1 (buckets rebuilt)", r.Generation())
		}
		for i := range params {
			grad, err := r.Grad(i)
			if err != nil {
				return err
			}
			sgd(params[i], grad)
		}
	}
	want := reference()
	worst := 0.0
	for i := range params {
		for j := range params[i] {
			worst = max(worst, math.Abs(float64(params[i][j])-want[i][j]))
		}
	}
	logf("max |data-parallel - single-process| after %d steps on %d ranks: %.3g", steps, world, worst)
	if worst > 1e-5 {
		return fmt.Errorf("weights differ from single-process training by %.3g (> 1e-5)", worst)
	}
	// Training must have moved the weights, or the comparison says nothing.
	if moved := math.Abs(float64(params[2][0]) - float64(initParams(1)[2][0])); moved < 1e-3 {
		return fmt.Errorf("weights barely moved (%.3g): the test is too weak", moved)
	}

	// Parameter lengths that differ across ranks: every rank is told.
	bad := pybridge.Params[float32](3, 4+rank)
	if _, err := pybridge.NewReducer(g, bad); !errors.Is(err, pybridge.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "differ across ranks") {
		return fmt.Errorf("mismatched reducers: got %v, want ErrInvalidArgument (differ across ranks)", err)
	}
	return g.Close()
}

func init() { world2.share("reducer", "TestReducerTraining2Ranks") }

func TestReducerTraining2Ranks(t *testing.T) {
	expectRolePass(t, world2, "reducer")
}

func TestReducerTraining3Ranks(t *testing.T) {
	expectPass(t, runRanks(t, &launch{role: "reducer", world: 3, limit: 90 * time.Second}))
}

func TestReducerMisuse(t *testing.T) {
	g := singleRank()
	defer g.Close()
	is := func(what string, err, want error, text string) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: got %v, want %v", what, err, want)
		} else if text != "" && !strings.Contains(err.Error(), text) {
			t.Errorf("%s: %q lacks %q", what, err.Error(), text)
		}
	}
	specs := pybridge.Params[float32](3, 2, 4)
	_, err := pybridge.NewReducer(nil, specs)
	is("nil group", err, pybridge.ErrInvalidArgument, "nil *Group")
	_, err = pybridge.NewReducer(g, []pybridge.ParamSpec{{Len: 3, DType: 6}})
	is("int dtype", err, pybridge.ErrInvalidArgument, "floating point")
	_, err = pybridge.NewReducer(g, []pybridge.ParamSpec{{Len: -1, DType: pybridge.DTypeFloat32}})
	is("negative length", err, pybridge.ErrInvalidArgument, "negative")
	_, err = pybridge.NewReducer(g, specs, pybridge.WithReduceOp(pybridge.Max))
	is("op Max", err, pybridge.ErrInvalidArgument, "op")
	_, err = pybridge.NewReducer(g, specs, pybridge.WithCompression(9))
	is("compression 9", err, pybridge.ErrInvalidArgument, "compression")
	_, err = pybridge.NewReducer(g, specs, pybridge.WithBucketCapMB(-1))
	is("negative bucket cap", err, pybridge.ErrInvalidArgument, "WithBucketCapMB must be")
	_, err = pybridge.NewReducer(g, specs, pybridge.WithBucketCapMB(math.NaN()))
	is("NaN bucket cap", err, pybridge.ErrInvalidArgument, "WithBucketCapMB must be")
	_, err = pybridge.NewReducer(g, specs, pybridge.WithHook(7))
	is("hook 7", err, pybridge.ErrInvalidArgument, "hook code 7")
	_, err = pybridge.NewReducer(g, specs, pybridge.WithPowerSGD(0, true))
	is("PowerSGD rank 0", err, pybridge.ErrInvalidArgument, "PowerSGD rank")
	_, err = pybridge.NewReducer(g, specs, pybridge.WithPowerSGD(1, true), pybridge.WithPowerSGDStartIter(1))
	is("PowerSGD start 1", err, pybridge.ErrInvalidArgument, "start iteration")
	_, err = pybridge.NewReducer(g, []pybridge.ParamSpec{{Len: 6, DType: pybridge.DTypeFloat32, Shape: []int{4, 2}}})
	is("shape of 8 for 6", err, pybridge.ErrInvalidArgument, "holds 8 elements")
	// Hooks, compression and gossip choose one thing: the last given wins.
	for _, opts := range [][]pybridge.ReducerOption{
		{pybridge.WithGossip(pybridge.GossipCube, 1, 0, 0), pybridge.WithHook(pybridge.HookFP16)},
		{pybridge.WithCompression(9), pybridge.WithHook(pybridge.HookFP16)},
		{pybridge.WithPowerSGD(2, false), pybridge.WithGossip(pybridge.GossipDissemination, 1, 0, 0)},
	} {
		r, err := pybridge.NewReducer(g, specs, opts...)
		if err != nil {
			t.Errorf("options %d: %v", len(opts), err)
		} else if err := r.Close(); err != nil {
			t.Error(err)
		}
	}

	r, err := pybridge.NewReducer(g, specs, pybridge.WithBucketCapMB(1e-5))
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Grad(3)
	is("Grad(3)", err, pybridge.ErrInvalidArgument, "out of range")
	_, err = r.Grad(-1)
	is("Grad(-1)", err, pybridge.ErrInvalidArgument, "out of range")
	_, err = pybridge.GradAs[float64](r, 0)
	is("GradAs float64", err, pybridge.ErrInvalidArgument, "float32")
	is("MarkReady(7)", r.MarkReady(7), pybridge.ErrInvalidArgument, "out of range")
	is("MarkReady(1<<40)", r.MarkReady(1<<40), pybridge.ErrInvalidArgument, "32 bits")
	if err := r.MarkReady(1); err != nil {
		t.Fatal(err)
	}
	is("mark twice", r.MarkReady(1), pybridge.ErrInvalidArgument, "twice")
	// Missing gradients are named by index, with the rank that missed them.
	is("wait with missing", r.Wait(5*time.Second), pybridge.ErrInvalidArgument,
		"Parameter indices which did not receive grad for rank 0: 0 2.")

	// A full iteration, with marks from several goroutines; one rank, so Avg keeps
	// the values. The rebuild (marking order 1, 0, 2 differs from 2, 1, 0) moves
	// the views and carries the values over.
	for i := range 3 {
		v, err := r.Grad(i)
		if err != nil {
			t.Fatal(err)
		}
		for j := range v {
			v[j] = float32(10*i + j)
		}
	}
	if err := r.MarkReady(1); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, i := range []int{0, 2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- r.MarkReady(i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Wait(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if r.Generation() != 1 {
		t.Errorf("generation %d after a rebuild, want 1", r.Generation())
	}
	for i := range 3 {
		v, _ := r.Grad(i)
		for j := range v {
			if v[j] != float32(10*i+j) {
				t.Fatalf("gradient %d after rebuild: %v", i, v)
			}
		}
	}
	if err := r.Zero(); err != nil {
		t.Fatal(err)
	}
	if v, _ := r.Grad(2); v[3] != 0 {
		t.Errorf("Zero left %v", v)
	}

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	is("MarkReady after Close", r.MarkReady(0), pybridge.ErrClosed, "closed")
	is("Wait after Close", r.Wait(0), pybridge.ErrClosed, "closed")
	is("Zero after Close", r.Zero(), pybridge.ErrClosed, "closed")
	_, err = r.Grad(0)
	is("Grad after Close", err, pybridge.ErrClosed, "closed")

	var nilR *pybridge.Reducer
	is("nil MarkReady", nilR.MarkReady(0), pybridge.ErrInvalidArgument, "nil *Reducer")
	is("nil Wait", nilR.Wait(0), pybridge.ErrInvalidArgument, "nil *Reducer")
	is("nil Close", nilR.Close(), pybridge.ErrInvalidArgument, "nil *Reducer")
	is("BroadcastParams bad root", pybridge.BroadcastParams(g, [][]float32{{1}}, 3), pybridge.ErrInvalidArgument, "root")

	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = pybridge.NewReducer(g, specs)
	is("NewReducer on closed group", err, pybridge.ErrClosed, "")
	is("BroadcastParams on closed group", pybridge.BroadcastParams(g, [][]float32{{1}}, 0), pybridge.ErrClosed, "")
}

// ExampleNewReducer trains one step of a two-parameter model: the program
// computes gradients itself, writes each into the reducer's memory and marks
// it ready; the allreduce of a bucket starts as soon as its gradients are in.
func ExampleNewReducer() {
	g := singleRank()
	defer g.Close()
	weights := [][]float32{{0.5, -0.25, 1}, {0.1}}
	// Start every rank from rank 0's weights.
	if err := pybridge.BroadcastParams(g, weights, 0); err != nil {
		log.Fatal(err)
	}
	r, err := pybridge.NewReducer(g, pybridge.Params[float32](3, 1))
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	// Backward pass: the bias gradient is ready first, then the weights'.
	for _, i := range []int{1, 0} {
		grad, err := r.Grad(i)
		if err != nil {
			log.Fatal(err)
		}
		for j := range grad {
			grad[j] = float32(j+1) / 10 // this rank's gradient
		}
		if err := r.MarkReady(i); err != nil {
			log.Fatal(err)
		}
	}
	// Wait for the reduction, then step with the averaged gradients.
	if err := r.Wait(time.Minute); err != nil {
		log.Fatal(err)
	}
	for i, w := range weights {
		grad, _ := r.Grad(i)
		for j := range w {
			w[j] -= 0.5 * grad[j]
		}
	}
	fmt.Println(weights)
	// Output: [[0.45 -0.35 0.85] [0.05]]
}

func init() {
	roles["reducer-config"] = roleReducerConfig
	world2.share("reducer-config", "TestReducerConfig2Ranks")
}

// One configuration, agreed on across ranks (without checked mode): each
// setting that differs on one rank makes NewReducer fail with
// ErrInvalidArgument on every rank, naming it; WithCompression and WithHook
// spell the same hook.
func TestReducerConfig2Ranks(t *testing.T) {
	expectRolePass(t, world2, "reducer-config")
}

func roleReducerConfig() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	rank := g.Rank()
	odd := rank == g.Size()-1
	pick := func(mine, others pybridge.ReducerOption) pybridge.ReducerOption {
		if odd {
			return mine
		}
		return others
	}
	refused := func(what string, specs []pybridge.ParamSpec, opt pybridge.ReducerOption, words ...string) error {
		r, err := pybridge.NewReducer(g, specs, opt)
		if err == nil {
			r.Close()
			return fmt.Errorf("%s: accepted on rank %d", what, rank)
		}
		if !errors.Is(err, pybridge.ErrInvalidArgument) {
			return fmt.Errorf("%s: %v, want ErrInvalidArgument", what, err)
		}
		for _, w := range append(words, "differ across ranks") {
			if !strings.Contains(err.Error(), w) {
				return fmt.Errorf("%s: %q lacks %q", what, err.Error(), w)
			}
		}
		return nil
	}
	flat := pybridge.Params[float32](16)
	shaped := func(shape ...int) []pybridge.ParamSpec {
		return []pybridge.ParamSpec{{Len: 16, DType: pybridge.DTypeFloat32, Shape: shape}}
	}
	rows, cols := 2, 8
	if odd {
		rows, cols = 4, 4
	}
	for _, c := range []struct {
		what  string
		specs []pybridge.ParamSpec
		opt   pybridge.ReducerOption
		words []string
	}{
		{"PowerSGD beside fp16", flat, pick(pybridge.WithPowerSGD(1, true), pybridge.WithHook(pybridge.HookFP16)),
			[]string{"hook:", "powersgd_hook", "fp16_compress_hook"}},
		{"PowerSGD rank", flat, pybridge.WithPowerSGD(1+rank, true), []string{"rank 1", "rank 2"}},
		{"gossip seed", flat, pybridge.WithGossip(pybridge.GossipCube, 1, int64(rank), 0), []string{"seed 0", "seed 1"}},
		{"gossip beside allreduce", flat, pick(pybridge.WithGossip(pybridge.GossipCube, 1, 0, 0), nil), []string{"gossip"}},
		{"shapes", shaped(rows, cols), nil, []string{"parameters:", "(4, 4)", "(2, 8)"}},
		{"bucket cap", flat, pybridge.WithBucketCapMB(float64(1 + rank)), []string{"bucket caps:"}},
		{"flags", flat, pick(pybridge.WithAllowUnused(), nil), []string{"allow_unused"}},
	} {
		if err := refused(c.what, c.specs, c.opt, c.words...); err != nil {
			return err
		}
	}
	// The two spellings of fp16 agree, and the gradients travel as half.
	r, err := pybridge.NewReducer(g, pybridge.Params[float32](100),
		pick(pybridge.WithCompression(pybridge.CompressFP16), pybridge.WithHook(pybridge.HookFP16)))
	if err != nil {
		return fmt.Errorf("WithCompression beside WithHook of the same hook: %v", err)
	}
	defer r.Close()
	grad, err := r.Grad(0)
	if err != nil {
		return err
	}
	for i := range grad {
		grad[i] = 1.0/3 + float32(rank)
	}
	if err := r.MarkReady(0); err != nil {
		return err
	}
	if err := r.Wait(20 * time.Second); err != nil {
		return err
	}
	grad, _ = r.Grad(0)
	exact := float32(1.0/3 + 0.5)
	if d := math.Abs(float64(grad[0] - exact)); d > 2e-3 || grad[0] == exact {
		return fmt.Errorf("fp16 mean %v, want within 2e-3 of %v but not equal (half on the wire)", grad[0], exact)
	}
	return g.Barrier()
}
