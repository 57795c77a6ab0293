// Command gotorch trains the MNIST MLP the way a GoTorch-style program does:
// the parameters, forward, backward and SGD step run in libtorch (mlp.cpp,
// reached from Go through cgo and a small C wrapper, as GoTorch is built), and
// pybridge makes it data-parallel: rank 0's parameters broadcast to all, the
// gradients averaged bucket by bucket while backward still runs, the RecordIO
// loader handing each rank its share, pybridge-launch starting one process per
// rank. The same flags and output as examples/mnist's trainers:
//
//	pybridge-launch --nproc-per-node 2 ./gotorch --data data/mnist --epochs 5
//
// The parameters go to pybridge by handle (libtorch's own at::Tensor*):
// pybridge.AttachReducer puts a post-accumulate-grad hook on each, so libtorch's
// backward marks each gradient ready as it completes and its bucket's allreduce
// overlaps the rest of backward; when backward returns the gradients are
// averaged. --grad-as-bucket-view makes each gradient a view of its bucket
// (torch DDP's gradient_as_bucket_view): nothing is copied.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/pybridge/pybridge/examples/gotorch/model"
	"github.com/pybridge/pybridge/examples/mnist/mnistdata"
	pybridge "github.com/pybridge/pybridge/go"
)

// The record layout and model of examples/mnist (mnist_format.py is the one definition).
const (
	imageSize  = mnistdata.ImageSize
	recordSize = mnistdata.RecordSize
	numClasses = mnistdata.NumClasses
	hidden     = 128
)

type options struct {
	mnistdata.Training
	device, hook            string
	bucketCapMB             float64
	checkInPlace, noOverlap bool
	bucketView, timing      bool
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("gotorch", flag.ContinueOnError)
	o.Register(fs)
	fs.StringVar(&o.hook, "hook", "allreduce", "how buckets travel: allreduce, fp16, bf16, powersgd (rank 1) or gossip (cube)")
	fs.Float64Var(&o.bucketCapMB, "bucket-cap-mb", 0, "reducer bucket size in MiB (0: 25, the first bucket 1, as torch DDP)")
	fs.BoolVar(&o.bucketView, "grad-as-bucket-view", false, "make each gradient a view of its bucket (torch DDP's gradient_as_bucket_view): nothing is copied")
	fs.BoolVar(&o.noOverlap, "no-overlap", false, "reduce every gradient after backward instead of from autograd hooks (to measure the overlap)")
	fs.BoolVar(&o.timing, "timing", false, "rank 0 prints the median forward+backward, wait and step times at the end")
	fs.BoolVar(&o.checkInPlace, "check-in-place", false, "with --grad-as-bucket-view: after every step, fail unless each gradient libtorch holds is its bucket's memory")
	fs.StringVar(&o.device, "device", "cpu", "cpu (gloo) or cuda (nccl, one GPU per process: the GPU of the local rank; not yet run on a GPU)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := o.Check(); err != nil {
		return o, err
	}
	if _, ok := hooks[o.hook]; !ok {
		return o, fmt.Errorf("--hook %q: choose allreduce, fp16, bf16, powersgd or gossip", o.hook)
	}
	if o.checkInPlace && !o.bucketView {
		return o, errors.New("--check-in-place needs --grad-as-bucket-view (otherwise gradients are the program's own)")
	}
	if o.noOverlap && o.bucketView {
		return o, errors.New("--no-overlap reduces the program's own gradients: leave out --grad-as-bucket-view")
	}
	if o.bucketCapMB < 0 {
		return o, errors.New("--bucket-cap-mb must be >= 0")
	}
	if _, ok := backends[o.device]; !ok {
		return o, fmt.Errorf("--device %q: choose cpu or cuda", o.device)
	}
	return o, nil
}

// backends maps --device to the process group's backend.
var backends = map[string]string{"cpu": "gloo", "cuda": "nccl"}

// hooks maps --hook to the reducer option that chooses it (nil: plain allreduce).
var hooks = map[string]pybridge.ReducerOption{
	"allreduce": nil,
	"fp16":      pybridge.WithHook(pybridge.HookFP16),
	"bf16":      pybridge.WithHook(pybridge.HookBF16),
	"powersgd":  pybridge.WithPowerSGD(1, true),
	"gossip":    pybridge.WithGossip(pybridge.GossipCube, 1, 1, 0),
}

func main() {
	opts, err := parseFlags(os.Args[1:])
	if err == flag.ErrHelp {
		return
	}
	if err == nil {
		err = run(opts)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gotorch:", err)
		os.Exit(1)
	}
}

// trainer holds one rank's state.
type trainer struct {
	host                  *pybridge.Group // the world, or its gloo copy under nccl: for host memory
	model                 *model.Model
	reducer               *pybridge.Reducer // attached to the parameters (or, with --no-overlap, driven after backward)
	check                 bool              // verify after every step that the gradients are the buckets' memory
	overlap               bool              // the reducer is attached: autograd marks gradients ready
	timed                 bool              // --timing: wait for the GPU before reading the clock
	backward, wait, total []time.Duration   // per step, with --timing
	pixels                []byte
	labels                []byte
}

func run(opts options) error {
	g, err := pybridge.Init(pybridge.WithBackend(backends[opts.device]))
	if err != nil {
		return err
	}
	defer g.Close()
	rank, world := g.Rank(), g.Size()
	// Host memory (the loader's bookkeeping, the metrics in Go slices) travels over
	// gloo; under nccl that is a gloo copy of the world beside it.
	host := g
	if g.Device() != pybridge.CPU {
		if host, err = g.SplitWithBackend(0, rank, "gloo"); err != nil {
			return err
		}
	}
	say := mnistdata.Say(rank)
	perRank, err := mnistdata.PerRank(opts.BatchSize, world)
	if err != nil {
		return err
	}

	net, err := model.NewModel(hidden, opts.Seed, g.Device()) // libtorch memory on this rank's GPU under nccl
	if err != nil {
		return err
	}
	defer net.Close()
	t := &trainer{host: host, model: net, check: opts.checkInPlace, overlap: !opts.noOverlap, timed: opts.timing}
	params := make([]pybridge.TensorSource, net.NumParams())
	for i := range params {
		if params[i], err = net.ParamHandle(i); err != nil {
			return err
		}
	}
	// Every rank starts from rank 0's parameters, written in place in libtorch's memory.
	if err := pybridge.BroadcastParamsTensors(g, params, 0); err != nil {
		return err
	}
	var reduceOpts []pybridge.ReducerOption
	if h := hooks[opts.hook]; h != nil {
		reduceOpts = append(reduceOpts, h)
	}
	if opts.bucketCapMB > 0 {
		reduceOpts = append(reduceOpts, pybridge.WithBucketCapMB(opts.bucketCapMB))
	}
	if opts.bucketView {
		reduceOpts = append(reduceOpts, pybridge.WithGradAsBucketView())
	}
	if t.overlap {
		t.reducer, err = pybridge.AttachReducer(g, params, reduceOpts...)
	} else {
		t.reducer, err = newUnattached(g, net, reduceOpts)
	}
	if err != nil {
		return err
	}
	defer t.reducer.Close()

	data, err := mnistdata.Open(host, opts.Data, perRank, opts.BatchSize, opts.Seed)
	if err != nil {
		return err
	}
	defer data.Close()
	train, test := data.Train, data.Test
	say("%s", data.Header(world, opts.BatchSize, opts.LR, opts.Momentum))

	epoch, step := 0, 0
	acc := -1.0
	for epoch < opts.Epochs && (opts.Steps < 0 || step < opts.Steps) {
		if err := train.SetEpoch(epoch); err != nil {
			return err
		}
		var lossSum float64
		done := 0
		start := time.Now()
		for train.Next() {
			if opts.Steps >= 0 && step >= opts.Steps {
				continue // finish the pass so the loader is ready for the next one
			}
			loss, err := t.step(train.Batch(), float32(opts.LR), float32(opts.Momentum))
			if err != nil {
				return err
			}
			lossSum += float64(loss)
			done++
			step++
		}
		if err := train.Err(); err != nil {
			return err
		}
		elapsed := time.Since(start).Seconds()
		correct, counted, err := t.evaluate(test)
		if err != nil {
			return err
		}
		totals := []float64{lossSum, float64(done), float64(correct), float64(counted)}
		if err := pybridge.AllReduce(host, totals, pybridge.Sum); err != nil {
			return err
		}
		acc = totals[2] / max(totals[3], 1)
		epoch++
		loss, rate := totals[0]/max(totals[1], 1), float64(done*opts.BatchSize)/max(elapsed, 1e-9)
		say("%s", mnistdata.EpochLine(epoch, opts.Epochs, loss, acc, rate, rank, world))
	}
	if opts.timing {
		say("timing: forward+backward %.3f ms  wait %.3f ms  step %.3f ms  (medians of %d steps, rank 0)",
			median(t.backward), median(t.wait), median(t.total), len(t.total))
	}
	if rank == 0 && opts.SaveWeights != "" {
		if err := t.saveWeights(opts.SaveWeights, epoch, step); err != nil {
			return err
		}
	}
	say("final test accuracy: %.4f", acc)
	return nil
}

// newUnattached makes the reducer of --no-overlap: not attached to the
// parameters; after backward the step binds the gradients (by handle) and marks
// them all ready at once.
func newUnattached(g *pybridge.Group, net *model.Model, opts []pybridge.ReducerOption) (*pybridge.Reducer, error) {
	specs := make([]pybridge.ParamSpec, net.NumParams())
	for i := range specs {
		_, n, shape, err := net.Param(i)
		if err != nil {
			return nil, err
		}
		specs[i] = pybridge.ParamSpec{Len: n, DType: pybridge.DTypeFloat32, Shape: shape} // shapes for PowerSGD
	}
	return pybridge.NewReducer(g, specs, opts...)
}

// step runs forward and backward in libtorch (the attached reducer averages the
// gradients during backward) and steps SGD on the averaged gradients. It
// returns the local mean loss.
func (t *trainer) step(b *pybridge.Batch, lr, momentum float32) (float32, error) {
	start := time.Now()
	if err := t.decode(b.Records()); err != nil {
		return 0, err
	}
	if err := t.model.ZeroGrad(); err != nil { // set to none, as libtorch's optimizers do
		return 0, err
	}
	loss, _, err := t.model.ForwardBackward(t.pixels, t.labels)
	if err != nil {
		return 0, err
	}
	backward := time.Now()
	if t.check { // GradTensor reads the attached reducer's current buckets itself: no Wait needed
		if err := t.checkInPlace(); err != nil {
			return 0, err
		}
	}
	if !t.overlap {
		if err := t.reduceAfterBackward(); err != nil {
			return 0, err
		}
	}
	if err := t.reducer.Wait(0); err != nil { // attached: PB_OK at once, or the reduction's error
		return 0, err
	}
	if t.timed && t.model.Device() != pybridge.CPU { // CUDA returns before the reduction ends
		if err := t.model.Synchronize(); err != nil {
			return 0, err
		}
	}
	t.backward = append(t.backward, backward.Sub(start))
	t.wait = append(t.wait, time.Since(backward))
	defer func() { t.total = append(t.total, time.Since(start)) }()
	return loss, t.model.Step(lr, momentum)
}

// reduceAfterBackward (--no-overlap) reduces the fresh gradients all at once,
// last layer first, as backward produced them.
func (t *trainer) reduceAfterBackward() error {
	grads := make([]pybridge.TensorSource, t.model.NumParams())
	for i := range grads {
		g, err := t.model.GradHandle(i)
		if err != nil {
			return err
		}
		grads[i] = g
	}
	if err := t.reducer.BindGrads(grads); err != nil { // fresh gradient tensors every step
		return err
	}
	for i := len(grads) - 1; i >= 0; i-- {
		if err := t.reducer.MarkReady(i); err != nil {
			return err
		}
	}
	return nil
}

// checkInPlace fails unless every gradient libtorch holds is the reducer's bucket
// memory: backward accumulated into the bucket and nothing was copied (libtorch
// would have replaced the grad tensor had it not accumulated in place).
func (t *trainer) checkInPlace() error {
	for i := 0; i < t.model.NumParams(); i++ {
		g, err := t.reducer.GradTensor(i)
		if err != nil {
			return err
		}
		have, err := t.model.GradPointer(i)
		if err != nil {
			return err
		}
		if want := g.Data; have != want {
			return fmt.Errorf("parameter %d: libtorch's gradient is at %p, not in the reducer's bucket at %p", i, have, want)
		}
	}
	return nil
}

// decode splits records into the pixel and label buffers libtorch reads.
func (t *trainer) decode(records [][]byte) error {
	t.pixels, t.labels = t.pixels[:0], t.labels[:0]
	for _, r := range records {
		if len(r) != recordSize {
			return fmt.Errorf("record of %d bytes, want %d (1 label byte + 784 pixels)", len(r), recordSize)
		}
		t.labels = append(t.labels, r[0])
		t.pixels = append(t.pixels, r[1:]...)
	}
	return nil
}

// evaluate counts correct predictions over this rank's share of the test set.
func (t *trainer) evaluate(test *pybridge.Loader) (correct, counted int, err error) {
	return mnistdata.Evaluate(t.host, test, func(recs [][]byte) (int, error) {
		if err := t.decode(recs); err != nil {
			return 0, err
		}
		return t.model.Evaluate(t.pixels, t.labels)
	})
}

// median in milliseconds (0 for no samples).
func median(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[len(s)/2].Microseconds()) / 1000
}
