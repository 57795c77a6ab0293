// Command mnist trains a 784-128-10 MLP on MNIST RecordIO shards, data-parallel
// over pybridge: the Go twin of train.py, with the same flags, checkpoint file
// and output. Run it under the launcher, e.g.
//
//	pybridge-launch --nproc-per-node 2 ./mnist --data data/mnist --epochs 5
//
// Each rank reads its static share of the training shards through the RecordIO
// loader (or, with --partition dynamic, claims chunks as it goes, so ranks run
// different numbers of steps and each joins the reducer when its loader has no
// more: Reducer.Join), computes gradients in plain Go straight into the reducer's
// buckets (last layer first, each marked ready as soon as it is complete, so its
// allreduce overlaps the rest of the backward pass), and steps SGD with momentum.
// With -federated it is instead a worker of federated_go.py's federated server
// (federated.go); with -elastic it trains elastically under pybridge-launch
// --elastic, the survivors of a lost rank going on from the last commit
// (elastic.go).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/pybridge/pybridge/examples/mnist/mnistdata"
	pybridge "github.com/pybridge/pybridge/go"
)

const (
	hidden    = 128
	evalBatch = mnistdata.EvalBatch
)

type options struct {
	mnistdata.Training
	checkpoint, initWeights, metrics, reduce, partition string
	syncEvery, localEpochs, slowRank, slowMS            int
	commitEvery, failAt, failRank                       int
	resume, federated, elastic                          bool
	proxMu                                              float64
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("mnist", flag.ContinueOnError)
	o.Register(fs)
	fs.StringVar(&o.checkpoint, "checkpoint", "", "rank 0 writes this file after every epoch")
	fs.BoolVar(&o.resume, "resume", false, "continue from --checkpoint if it exists")
	fs.StringVar(&o.initWeights, "init-weights", "", "start from these parameters (checkpoint format)")
	fs.StringVar(&o.metrics, "metrics", "", "rank 0 writes one JSON line per epoch here (plot with plot.py)")
	fs.StringVar(&o.reduce, "reduce", "allreduce", "gradient reduction: allreduce, gossip-cube or gossip-dissemination")
	fs.IntVar(&o.syncEvery, "sync-every", 0, "gossip: average the parameters over all ranks every N steps (0: only before evaluating)")
	fs.BoolVar(&o.federated, "federated", false, "run as a federated worker of federated_go.py's server (--batch-size is then the local batch)")
	fs.IntVar(&o.localEpochs, "local-epochs", 1, "federated: passes over a client's data per task")
	fs.StringVar(&o.partition, "partition", "static", "training data: static (equal shares) or dynamic (ranks claim chunks as they go; uneven steps, joined by Reducer.Join)")
	fs.IntVar(&o.slowRank, "slow-rank", -1, "this rank sleeps --slow-ms before each training step (-1: none)")
	fs.IntVar(&o.slowMS, "slow-ms", 0, "milliseconds --slow-rank sleeps before each step")
	fs.Float64Var(&o.proxMu, "prox-mu", 0, "federated: FedProx's mu (0: plain local SGD)")
	fs.BoolVar(&o.elastic, "elastic", false, "elastic training under pybridge-launch --elastic: survivors of a lost rank go on from the last commit (elastic.go)")
	fs.IntVar(&o.commitEvery, "commit-every", 10, "elastic: commit the state in memory every N steps (and at each epoch's end)")
	fs.IntVar(&o.failAt, "fail-at", 0, "elastic, for tests: --fail-rank of the first world SIGKILLs itself before this step (0: never)")
	fs.IntVar(&o.failRank, "fail-rank", -1, "elastic, for tests: the rank --fail-at kills")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := o.Check(); err != nil {
		return o, err
	}
	if _, ok := reductions[o.reduce]; !ok {
		return o, fmt.Errorf("--reduce %q: choose allreduce, gossip-cube or gossip-dissemination", o.reduce)
	}
	if o.partition != "static" && o.partition != "dynamic" {
		return o, fmt.Errorf("--partition %q: choose static or dynamic", o.partition)
	}
	if o.partition == "dynamic" && o.reduce != "allreduce" {
		return o, errors.New("--partition dynamic goes with --reduce allreduce (gossip has no join)")
	}
	if o.slowMS < 0 {
		return o, errors.New("--slow-ms must be >= 0")
	}
	if o.localEpochs < 1 {
		return o, errors.New("--local-epochs must be positive")
	}
	if err := pybridge.FedProxGrad[float32](nil, nil, nil, o.proxMu); err != nil { // the library's rule for mu
		return o, fmt.Errorf("--prox-mu: %w", err)
	}
	if o.syncEvery < 0 {
		return o, errors.New("--sync-every must be >= 0")
	}
	if o.resume && o.checkpoint == "" {
		return o, errors.New("--resume needs --checkpoint")
	}
	if o.elastic {
		return o, checkElastic(o)
	}
	if o.failAt != 0 || o.failRank != -1 {
		return o, errors.New("--fail-at and --fail-rank go with --elastic")
	}
	return o, nil
}

func main() {
	opts, err := parseFlags(os.Args[1:])
	if err == flag.ErrHelp {
		return
	}
	if err == nil && opts.federated {
		err = runFederatedWorker(opts)
	} else if err == nil && opts.elastic {
		err = runElastic(opts)
	} else if err == nil {
		err = run(opts)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mnist:", err)
		os.Exit(1)
	}
}

// reductions maps --reduce to a gossip topology, or -1 for the allreduce.
var reductions = map[string]pybridge.GossipTopology{
	"allreduce": -1, "gossip-cube": pybridge.GossipCube, "gossip-dissemination": pybridge.GossipDissemination,
}

// averageParams replaces every rank's parameters by their average over the ranks.
func averageParams(g *pybridge.Group, params [][]float32) error {
	for _, p := range params {
		if err := pybridge.AllReduce(g, p, pybridge.Avg); err != nil {
			return err
		}
	}
	return nil
}

// trainer holds one rank's state.
type trainer struct {
	g       *pybridge.Group
	model   *MLP
	opt     *SGD
	reducer *pybridge.Reducer
	say     func(format string, a ...any)
}

func run(opts options) error {
	g, err := pybridge.Init(pybridge.WithBackend("gloo"))
	if err != nil {
		return err
	}
	defer g.Close()
	rank, world := g.Rank(), g.Size()
	say := mnistdata.Say(rank)
	perRank, err := mnistdata.PerRank(opts.BatchSize, world)
	if err != nil {
		return err
	}

	t := &trainer{g: g, model: NewMLP(hidden, opts.Seed), say: say,
		opt: &SGD{LR: float32(opts.LR), Momentum: float32(opts.Momentum)}}
	if opts.initWeights != "" && rank == 0 {
		ck, err := readCheckpoint(opts.initWeights)
		if err != nil {
			return err
		}
		ck.loadInto(t.model, nil)
	}
	epoch, step := 0, 0
	if opts.resume {
		if epoch, step, err = t.resume(opts.checkpoint); err != nil {
			return err
		}
	}
	// Rank 0's parameters (and momentum) are everyone's starting point.
	if err := pybridge.BroadcastParams(g, t.model.Params(), 0); err != nil {
		return err
	}
	if t.opt.bufs != nil {
		if err := pybridge.BroadcastParams(g, t.opt.bufs, 0); err != nil {
			return err
		}
	}
	specs := pybridge.Params[float32](len(t.model.W1), len(t.model.B1), len(t.model.W2), len(t.model.B2))
	var reduceOpts []pybridge.ReducerOption
	if topo := reductions[opts.reduce]; topo >= 0 {
		reduceOpts = append(reduceOpts, pybridge.WithGossip(topo, 1, opts.Seed, opts.syncEvery))
	}
	part := pybridge.StaticPartition
	if opts.partition == "dynamic" {
		part = pybridge.DynamicPartition
		reduceOpts = append(reduceOpts, pybridge.WithJoin()) // uneven steps: see the end of the epoch
	}
	if t.reducer, err = pybridge.NewReducer(g, specs, reduceOpts...); err != nil {
		return err
	}
	defer t.reducer.Close()

	data, err := mnistdata.OpenPartition(g, opts.Data, perRank, opts.BatchSize, opts.Seed, part)
	if err != nil {
		return err
	}
	defer data.Close()
	train, test := data.Train, data.Test
	say("%s", data.Header(world, opts.BatchSize, opts.LR, opts.Momentum))

	metrics, err := newMetricsLog(opts.metrics, rank)
	if err != nil {
		return err
	}
	defer metrics.Close()
	runStart := time.Now()
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
			maybeFail(step, rank)
			if rank == opts.slowRank {
				time.Sleep(time.Duration(opts.slowMS) * time.Millisecond)
			}
			loss, err := t.step(train.Batch())
			if err != nil {
				return err
			}
			lossSum += loss
			done++
			step++
			if opts.syncEvery > 0 && reductions[opts.reduce] >= 0 && step%opts.syncEvery == 0 {
				if err := averageParams(g, t.model.Params()); err != nil { // the sync step: replicas meet
					return err
				}
			}
		}
		if err := train.Err(); err != nil {
			return err
		}
		if data.Dynamic { // this rank has no more batches: shadow the others until all are done
			shadowed, err := t.join()
			if err != nil {
				return err
			}
			step += shadowed // the group's step count, the same on every rank again
		}
		elapsed := time.Since(start).Seconds()
		if reductions[opts.reduce] >= 0 { // gossip replicas drift: evaluate their average
			if err := averageParams(g, t.model.Params()); err != nil {
				return err
			}
		}
		correct, counted, err := t.evaluate(test)
		if err != nil {
			return err
		}
		totals := make([]float64, 4+world) // loss, steps, correct, counted, then each rank's steps
		totals[0], totals[1], totals[2], totals[3], totals[4+rank] = lossSum, float64(done), float64(correct), float64(counted), float64(done)
		if err := pybridge.AllReduce(g, totals, pybridge.Sum); err != nil {
			return err
		}
		if data.Dynamic {
			say("steps per rank: %v", totals[4:])
		}
		acc = totals[2] / max(totals[3], 1)
		pybridge.LogScalar("test_accuracy", acc)
		epoch++
		if rank == 0 && opts.checkpoint != "" {
			if err := writeCheckpoint(opts.checkpoint, epoch, step, t.model, t.opt); err != nil {
				return err
			}
		}
		loss, rate := totals[0]/max(totals[1], 1), totals[1]*float64(perRank)/max(elapsed, 1e-9)
		say("%s", mnistdata.EpochLine(epoch, opts.Epochs, loss, acc, rate, rank, world))
		if err := metrics.Write(epochMetrics{Epoch: epoch, Step: step, Loss: loss, TestAccuracy: acc,
			SamplesPerSecond: rate, Seconds: time.Since(runStart).Seconds(), Ranks: world}); err != nil {
			return err
		}
	}
	if acc < 0 { // nothing left to train (a finished run was resumed): just evaluate
		correct, counted, err := t.evaluate(test)
		if err != nil {
			return err
		}
		totals := []float64{float64(correct), float64(counted)}
		if err := pybridge.AllReduce(g, totals, pybridge.Sum); err != nil {
			return err
		}
		acc = totals[0] / max(totals[1], 1)
	}
	if rank == 0 && opts.SaveWeights != "" {
		if err := writeCheckpoint(opts.SaveWeights, epoch, step, t.model, t.opt); err != nil {
			return err
		}
	}
	say("final test accuracy: %.4f", acc)
	return nil
}

// step runs forward and backward on one batch, with the gradients written straight
// into the reducer's buckets and each marked ready as soon as it is complete, then
// waits for the averaged gradients and updates the parameters. It returns the loss,
// which it also logs (a traced run: PYBRIDGE_TRACE=DIR; the forward, backward and
// optimizer spans are on the trace's program track, beside the reducer's buckets).
func (t *trainer) step(b *pybridge.Batch) (float64, error) {
	x, labels, err := decodeBatch(b.Records())
	if err != nil {
		return 0, err
	}
	grads := make(Grads, 4)
	for i := range grads {
		if grads[i], err = t.reducer.Grad(i); err != nil {
			return 0, err
		}
	}
	span := pybridge.StartSpanCat("forward", pybridge.CatForward)
	act, loss, _ := t.model.forward(x, labels)
	span.End()
	span = pybridge.StartSpanCat("backward", pybridge.CatCompute)
	err = t.model.backward(act, grads, t.reducer.MarkReady)
	span.End()
	if err != nil {
		return 0, err
	}
	if err := t.reducer.Wait(0); err != nil { // ends the step (the trace's steps track)
		return 0, err
	}
	for i := range grads { // the buckets may have been rebuilt by Wait
		if grads[i], err = t.reducer.Grad(i); err != nil {
			return 0, err
		}
	}
	span = pybridge.StartSpanCat("optimizer", pybridge.CatCompute)
	t.opt.Step(t.model.Params(), grads)
	span.End()
	pybridge.LogScalar("loss", loss) // this rank's loss, at the step Wait just ended
	return loss, nil
}

// join is the end of a dynamic epoch: shadow the ranks still training until all
// have joined, then take the parameters and momentum of the rank that trained
// longest (the join's root; torch's join syncs the module, momentum is ours to
// sync). Returns the steps this rank shadowed.
func (t *trainer) join() (int, error) {
	res, err := t.reducer.Join()
	if err != nil {
		return 0, err
	}
	t.opt.ensureBufs(t.model.Params()) // a rank that has not stepped yet: room for the root's momentum
	if err := pybridge.BroadcastParams(t.g, t.model.Params(), res.Root); err != nil {
		return 0, err
	}
	return int(res.Shadowed), pybridge.BroadcastParams(t.g, t.opt.bufs, res.Root)
}

// evaluate counts correct predictions over this rank's share of the test set.
func (t *trainer) evaluate(test *pybridge.Loader) (correct, counted int, err error) {
	return mnistdata.Evaluate(t.g, test, func(recs [][]byte) (int, error) {
		x, labels, err := decodeBatch(recs)
		if err != nil {
			return 0, err
		}
		_, _, c := t.model.forward(x, labels)
		return c, nil
	})
}

// resume loads the checkpoint on rank 0 (if it exists) and tells every rank where to start.
func (t *trainer) resume(path string) (epoch, step int, err error) {
	state := []int64{0, 0, 0} // found, epoch, step
	if t.g.Rank() == 0 {
		ck, err := readCheckpoint(path)
		switch {
		case err == nil:
			ck.loadInto(t.model, t.opt)
			state = []int64{1, int64(ck.epoch), int64(ck.step)}
		case errors.Is(err, os.ErrNotExist):
		default:
			return 0, 0, err
		}
	}
	if err := pybridge.Broadcast(t.g, state, 0); err != nil {
		return 0, 0, err
	}
	if state[0] == 1 {
		if t.opt.bufs == nil { // other ranks: room for rank 0's momentum
			t.opt.bufs = [][]float32{make([]float32, len(t.model.W1)), make([]float32, len(t.model.B1)),
				make([]float32, len(t.model.W2)), make([]float32, len(t.model.B2))}
		}
		t.say("resumed from %s after epoch %d (step %d)", path, state[1], state[2])
	} else {
		t.say("no checkpoint at %s: starting from scratch", path)
	}
	return int(state[1]), int(state[2]), nil
}

// maybeFail lets tests kill a rank mid-epoch (same variables as train.py).
func maybeFail(step, rank int) {
	at, ok := os.LookupEnv("PYBRIDGE_TEST_FAIL_AT_STEP")
	if !ok || strconv.Itoa(step) != at {
		return
	}
	failRank := os.Getenv("PYBRIDGE_TEST_FAIL_RANK")
	if failRank == "" {
		failRank = "1"
	}
	if strconv.Itoa(rank) != failRank {
		return
	}
	if marker := os.Getenv("PYBRIDGE_TEST_FAIL_MARKER"); marker != "" {
		if _, err := os.Stat(marker); err == nil {
			return
		}
		os.WriteFile(marker, nil, 0o644)
	}
	fmt.Fprintf(os.Stderr, "rank %d: failing on purpose before step %d (PYBRIDGE_TEST_FAIL_AT_STEP)\n", rank, step)
	code := 17
	if c, err := strconv.Atoi(os.Getenv("PYBRIDGE_TEST_FAIL_CODE")); err == nil {
		code = c
	}
	os.Exit(code)
}
