package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"runtime"
)

// AverageParams averages every slice of params over the group's ranks, in
// place, now: one allreduce of the slices flattened together, divided by the
// group size first (torch's model averaging). Every rank passes slices of the
// same lengths in the same order; every rank must call collectives in the same
// order.
func AverageParams[T Float](g *Group, params [][]T) error {
	return averageParams(context.Background(), "AverageParams", g, params)
}

// AverageParamsContext is AverageParams under ctx (see Contexts): a ctx that ends
// while it waits aborts g.
func AverageParamsContext[T Float](ctx context.Context, g *Group, params [][]T) error {
	return averageParams(ctx, "AverageParamsContext", g, params)
}

func averageParams[T Float](ctx context.Context, name string, g *Group, params [][]T) error {
	return paramsCall(ctx, name, g, params, func(h *C.pb_group, n C.int32_t, d *C.pb_tensor, msg **C.char) C.int {
		return C.pbgo_average_params(h, n, d, msg)
	})
}

// Averager runs periodic model averaging (local SGD; torch's
// PeriodicModelAverager): each rank steps its own parameters and calls Step
// once per training step, after the optimizer's update; every period steps
// after the warm-up, Step averages the parameters over the group.
//
// Post-local SGD: reduce gradients with a Reducer for the first warmupSteps
// steps, then stop calling it and let the Averager bring the replicas together
// (docs/local-sgd.md):
//
//	avg, _ := pybridge.NewAverager[float32](g, 8, pybridge.WithWarmupSteps(warmup))
//	for step := 0; ; step++ {
//		// compute gradients into grads
//		if step < warmup { /* MarkReady each, red.Wait(0) */ }
//		// update params with grads
//		avg.Step(params)
//	}
//
// An Averager may be used from one goroutine at a time.
type Averager[T Float] struct {
	cHandle[*C.pb_averager]
	group *Group // what a ...Context call aborts
}

type averagerConfig struct {
	warmupSteps int
}

// AveragerOption configures NewAverager and NewHierarchicalAverager.
type AveragerOption func(*averagerConfig)

// WithWarmupSteps makes the averager start averaging after steps steps (torch's
// warmup_steps; default 0): the steps before it are post-local SGD's warm-up, when a
// Reducer averages the gradients instead.
func WithWarmupSteps(steps int) AveragerOption {
	return func(c *averagerConfig) { c.warmupSteps = steps }
}

// averagerArgs applies opts and converts the warm-up for the C ABI.
func averagerArgs(op string, opts []AveragerOption) (C.int32_t, error) {
	var c averagerConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return toInt32(op, "warmup steps", c.warmupSteps)
}

// NewAverager returns an averager over g that averages when the step counter
// (from 0) is at least the warm-up (WithWarmupSteps) and (step - warm-up) is a
// multiple of period (at least 1). It is not a collective; the averaging steps are.
func NewAverager[T Float](g *Group, period int, opts ...AveragerOption) (*Averager[T], error) {
	const op = "NewAverager"
	gh, err := g.handle(op)
	if err != nil {
		return nil, err
	}
	p, err := toInt32(op, "period", period)
	if err != nil {
		return nil, err
	}
	w, err := averagerArgs(op, opts)
	if err != nil {
		return nil, err
	}
	a := &Averager[T]{group: g}
	var msg *C.char
	if err := check(op, C.pbgo_averager_create(gh, p, w, &a.h, &msg), msg); err != nil {
		return nil, err
	}
	return a, nil
}

// AverageLevel is one level of NewHierarchicalAverager: average over blocks of
// GroupSize consecutive ranks every Period steps.
type AverageLevel struct {
	Period    int
	GroupSize int
}

// NewHierarchicalAverager returns an averager with several levels (torch's
// HierarchicalModelAverager), periods increasing, the last level's GroupSize
// the whole group's: after the warm-up, a step averages at the level of the
// largest period that divides the step. E.g. {{4, ranksPerNode}, {16, world}}
// averages within each node every 4 steps and over all nodes every 16. It is a
// collective over g (it creates the subgroups).
func NewHierarchicalAverager[T Float](g *Group, levels []AverageLevel, opts ...AveragerOption) (*Averager[T], error) {
	return newHierarchicalAverager[T](context.Background(), "NewHierarchicalAverager", g, levels, opts)
}

// NewHierarchicalAveragerContext is NewHierarchicalAverager under ctx (see
// Contexts): a ctx that ends while it waits for the other ranks aborts g.
func NewHierarchicalAveragerContext[T Float](ctx context.Context, g *Group, levels []AverageLevel,
	opts ...AveragerOption) (*Averager[T], error) {
	return newHierarchicalAverager[T](ctx, "NewHierarchicalAveragerContext", g, levels, opts)
}

func newHierarchicalAverager[T Float](ctx context.Context, op string, g *Group, levels []AverageLevel,
	opts []AveragerOption) (*Averager[T], error) {
	gh, err := g.handle(op)
	if err != nil {
		return nil, err
	}
	n, err := toInt32(op, "level count", len(levels))
	if err != nil {
		return nil, err
	}
	w, err := averagerArgs(op, opts)
	if err != nil {
		return nil, err
	}
	periods := make([]C.int32_t, len(levels)+1) // +1: never empty, so &x[0] is valid
	sizes := make([]C.int32_t, len(levels)+1)
	for i, l := range levels {
		if periods[i], err = toInt32(op, "period", l.Period); err != nil {
			return nil, err
		}
		if sizes[i], err = toInt32(op, "group size", l.GroupSize); err != nil {
			return nil, err
		}
	}
	a := &Averager[T]{group: g}
	var h *C.pb_averager
	err = g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_averager_create_hierarchical(gh, n, &periods[0], &sizes[0], w, &h, &msg), msg)
	})
	if err != nil {
		if h != nil { // made by a call whose context ended: its subgroups were aborted
			C.pbgo_averager_close(h, nil)
		}
		return nil, err
	}
	a.h = h
	return a, nil
}

// Step counts one training step and, when it is due, averages params over the
// group in place (a collective then: every rank calls Step equally often, with
// slices of the same lengths). It reports whether it averaged.
func (a *Averager[T]) Step(params [][]T) (averaged bool, err error) {
	return a.step(context.Background(), "Averager.Step", params)
}

// StepContext is Step under ctx (see Contexts): a ctx that ends while an averaging
// step waits aborts the averager's group.
func (a *Averager[T]) StepContext(ctx context.Context, params [][]T) (averaged bool, err error) {
	return a.step(ctx, "Averager.StepContext", params)
}

func (a *Averager[T]) step(ctx context.Context, op string, params [][]T) (averaged bool, err error) {
	if a == nil {
		return false, nilError(op, "Averager")
	}
	h, err := a.acquire(op, "averager is closed")
	if err != nil {
		return false, err
	}
	defer a.mu.Unlock()
	n, err := toInt32(op, "parameter count", len(params))
	if err != nil {
		return false, err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	var did C.int32_t
	descs := describeSlices(&pin, params)
	err = underContext(ctx, op, a.group, func() error {
		var msg *C.char
		return check(op, C.pbgo_averager_step(h, n, descs, &did, &msg), msg)
	})
	return did != 0, err
}

// Steps returns the steps counted so far (to keep in a checkpoint).
func (a *Averager[T]) Steps() (int64, error) {
	const op = "Averager.Steps"
	if a == nil {
		return 0, nilError(op, "Averager")
	}
	h, err := a.acquireShared(op, "averager is closed")
	if err != nil {
		return 0, err
	}
	defer a.mu.RUnlock()
	var out C.int64_t
	var msg *C.char
	err = check(op, C.pbgo_averager_get_step(h, &out, &msg), msg)
	return int64(out), err
}

// SetSteps continues the schedule at step (at least 0), as after a restart.
func (a *Averager[T]) SetSteps(step int64) error {
	const op = "Averager.SetSteps"
	if a == nil {
		return nilError(op, "Averager")
	}
	h, err := a.acquire(op, "averager is closed")
	if err != nil {
		return err
	}
	defer a.mu.Unlock()
	var msg *C.char
	return check(op, C.pbgo_averager_set_step(h, C.int64_t(step), &msg), msg)
}

// Close releases the averager (and a hierarchical one's subgroups). A second
// Close returns nil.
func (a *Averager[T]) Close() error {
	const op = "Averager.Close"
	if a == nil {
		return nilError(op, "Averager")
	}
	return a.close(op, func(h *C.pb_averager, msg **C.char) C.int { return C.pbgo_averager_close(h, msg) })
}
