package main

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/pybridge/pybridge/examples/mnist/mnistdata"
	pybridge "github.com/pybridge/pybridge/go"
)

// --elastic: elastic training (docs/elastic.md) under `pybridge-launch --elastic`.
// The parameters, momentum, epoch, loader position and reducer counters are an
// ElasticState, committed in memory every --commit-every steps and at each
// epoch's end. When a rank dies, the survivors' current call returns
// ErrMembership and RunElastic resets them onto the smaller world, rolled back to
// the last commit; the loop below then goes on from the committed (epoch, step).
// Each rank keeps the per-rank batch of the first world (--batch-size divided by
// WORLD_SIZE), so the global batch shrinks and grows with the world.

func checkElastic(o options) error {
	switch {
	case o.federated:
		return errors.New("--elastic and --federated are two ways to run: choose one")
	case o.partition != "static":
		return errors.New("--elastic takes the static partition only (a dynamic one cannot be re-shared over a new world)")
	case o.reduce != "allreduce":
		return errors.New("--elastic goes with --reduce allreduce")
	case o.checkpoint != "" || o.resume || o.initWeights != "" || o.metrics != "":
		return errors.New("--elastic keeps its state in memory: --checkpoint, --resume, --init-weights and --metrics are not used")
	case o.commitEvery < 1:
		return errors.New("--commit-every must be positive")
	}
	return nil
}

func runElastic(opts options) error {
	g, err := pybridge.ElasticInit(pybridge.WithBackend("gloo"), pybridge.WithTimeout(30*time.Second))
	if err != nil {
		return err
	}
	defer func() { g.Close() }() // the newest world's group
	first := g.Size()            // a joiner's first world may be larger: the launcher's WORLD_SIZE rules
	if n, err := strconv.Atoi(os.Getenv("WORLD_SIZE")); err == nil && n > 0 {
		first = n
	}
	perRank, err := mnistdata.PerRank(opts.BatchSize, first)
	if err != nil {
		return err
	}
	t := &trainer{g: g, model: NewMLP(hidden, opts.Seed), opt: &SGD{LR: float32(opts.LR), Momentum: float32(opts.Momentum)}}
	params := t.model.Params()
	t.opt.ensureBufs(params)
	specs := pybridge.Params[float32](len(t.model.W1), len(t.model.B1), len(t.model.W2), len(t.model.B2))
	if t.reducer, err = pybridge.NewReducer(g, specs); err != nil {
		return err
	}
	defer t.reducer.Close()
	data, err := mnistdata.Open(g, opts.Data, perRank, opts.BatchSize, opts.Seed)
	if err != nil {
		return err
	}
	defer func() { data.Close() }()
	epoch := []int64{0}
	ck := pybridge.NewCheckpoint(g, "", pybridge.WithLoader(data.Train), pybridge.WithReducer(t.reducer))
	for i, name := range []string{"w1", "b1", "w2", "b2"} {
		if err := errors.Join(pybridge.AddTensor(ck, name, params[i]),
			pybridge.AddTensor(ck, "momentum-"+name, t.opt.bufs[i])); err != nil {
			return err
		}
	}
	if err := pybridge.AddTensor(ck, "epoch", epoch); err != nil {
		return err
	}
	st, err := pybridge.NewElasticState(ck)
	if err != nil {
		return err
	}
	defer st.Close()
	e := &elasticRun{opts: opts, t: t, data: data, st: st, epoch: epoch, perRank: perRank}
	g, err = pybridge.RunElastic(st, g, e.train)
	if err != nil {
		return err
	}
	return e.finish()
}

// elasticRun is the training loop RunElastic calls again after every reset.
type elasticRun struct {
	opts    options
	t       *trainer
	data    *mnistdata.Data
	st      *pybridge.ElasticState
	epoch   []int64 // registered in the state: rolled back with the rest
	perRank int
	step    int64
	acc     float64
}

func (e *elasticRun) train(g *pybridge.Group, step int64) error {
	o, t := e.opts, e.t
	ch, err := pybridge.LastElasticChange()
	if err != nil {
		return err
	}
	if g != t.g { // a new world: the test set is shared over its ranks
		t.g = g
		if e.data.Test, err = reopen(g, o.Data, e.data.Test); err != nil {
			return err
		}
		mnistdata.Say(g.Rank())("elastic: world %d -> %d ranks (lost ranks %v, %d joined); back to the commit of step %d, epoch %d",
			ch.OldSize, ch.NewSize, ch.Lost, ch.Joined, step, e.epoch[0])
	} else if step == 0 {
		mnistdata.Say(g.Rank())("%s", e.data.Header(g.Size(), o.BatchSize, o.LR, o.Momentum))
	}
	rank, world := g.Rank(), g.Size()
	e.acc = -1
	for int(e.epoch[0]) < o.Epochs && (o.Steps < 0 || step < int64(o.Steps)) {
		train := e.data.Train
		if err := train.SetEpoch(int(e.epoch[0])); err != nil { // a rolled-back epoch keeps its position
			return err
		}
		var lossSum float64
		done, start := 0, time.Now()
		for train.Next() {
			if o.Steps >= 0 && step >= int64(o.Steps) {
				continue
			}
			if step+1 == int64(o.failAt) && rank == o.failRank && ch.Generation == 1 {
				fmt.Fprintf(os.Stderr, "rank %d: SIGKILL before step %d (--fail-at)\n", rank, step+1)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
			loss, err := t.step(train.Batch())
			if err != nil {
				return err
			}
			lossSum += loss
			done++
			step++
			if step%int64(o.commitEvery) == 0 {
				if err := e.st.Commit(step); err != nil {
					return err
				}
			}
		}
		if err := train.Err(); err != nil {
			return err
		}
		correct, counted, err := t.evaluate(e.data.Test)
		if err != nil {
			return err
		}
		totals := []float64{lossSum, float64(done), float64(correct), float64(counted)}
		if err := pybridge.AllReduce(g, totals, pybridge.Sum); err != nil {
			return err
		}
		e.acc = totals[2] / max(totals[3], 1)
		pybridge.LogScalar("test_accuracy", e.acc)
		e.epoch[0]++
		rate := totals[1] * float64(e.perRank) / max(time.Since(start).Seconds(), 1e-9)
		mnistdata.Say(rank)("%s", mnistdata.EpochLine(int(e.epoch[0]), o.Epochs, totals[0]/max(totals[1], 1), e.acc, rate, rank, world))
		if err := e.st.Commit(step); err != nil { // made even when it returns ErrMembership
			return err
		}
	}
	e.step = step
	return nil
}

// finish evaluates when no epoch ran, writes --save-weights (rank 0) and prints
// every rank's weights digest: the replicas must be identical.
func (e *elasticRun) finish() error {
	t := e.t
	if e.acc < 0 {
		correct, counted, err := t.evaluate(e.data.Test)
		if err != nil {
			return err
		}
		totals := []float64{float64(correct), float64(counted)}
		if err := pybridge.AllReduce(t.g, totals, pybridge.Sum); err != nil {
			return err
		}
		e.acc = totals[0] / max(totals[1], 1)
	}
	rank := t.g.Rank()
	if rank == 0 && e.opts.SaveWeights != "" {
		if err := writeCheckpoint(e.opts.SaveWeights, int(e.epoch[0]), int(e.step), t.model, t.opt); err != nil {
			return err
		}
	}
	h := fnv.New64a()
	for _, p := range append(t.model.Params(), t.opt.bufs...) {
		for _, v := range p {
			b := math.Float32bits(v)
			h.Write([]byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)})
		}
	}
	fmt.Printf("elastic: rank %d of %d done at step %d, epoch %d, weights %016x\n", rank, t.g.Size(), e.step, e.epoch[0], h.Sum64())
	mnistdata.Say(rank)("final test accuracy: %.4f", e.acc)
	return nil
}

// reopen opens the test loader again over g (the old one is bound to a closed world).
func reopen(g *pybridge.Group, folder string, old *pybridge.Loader) (*pybridge.Loader, error) {
	old.Close()
	files, err := mnistdata.Shards(folder, "test-*.recordio")
	if err != nil {
		return nil, err
	}
	return pybridge.OpenLoader(g, files, mnistdata.EvalBatch)
}
