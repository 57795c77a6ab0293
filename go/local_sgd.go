package pybridge

/*
#include "pbgo.h"
*/
import "C"

import "runtime"

// AverageParams averages every slice of params over the group's ranks, in
// place, now: one allreduce of the slices flattened together, divided by the
// group size first (torch's model averaging). Every rank passes slices of the
// same lengths in the same order; every rank must call collectives in the same
// order.
func AverageParams[T Float](g *Group, params [][]T) error {
	return paramsCall("AverageParams", g, params, func(h *C.pb_group, n C.int32_t, d *C.pb_tensor, msg **C.char) C.int {
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
//	avg, _ := pybridge.NewAverager[float32](g, 8, warmup)
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
}

// NewAverager returns an averager over g that averages when the step counter
// (from 0) is at least warmupSteps and (step - warmupSteps) is a multiple of
// period (at least 1). It is not a collective; the averaging steps are.
func NewAverager[T Float](g *Group, period, warmupSteps int) (*Averager[T], error) {
	const op = "NewAverager"
	gh, err := g.handle(op)
	if err != nil {
		return nil, err
	}
	p, err := toInt32(op, "period", period)
	if err != nil {
		return nil, err
	}
	w, err := toInt32(op, "warmup steps", warmupSteps)
	if err != nil {
		return nil, err
	}
	a := &Averager[T]{}
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
func NewHierarchicalAverager[T Float](g *Group, levels []AverageLevel, warmupSteps int) (*Averager[T], error) {
	const op = "NewHierarchicalAverager"
	gh, err := g.handle(op)
	if err != nil {
		return nil, err
	}
	n, err := toInt32(op, "level count", len(levels))
	if err != nil {
		return nil, err
	}
	w, err := toInt32(op, "warmup steps", warmupSteps)
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
	a := &Averager[T]{}
	var msg *C.char
	if err := check(op, C.pbgo_averager_create_hierarchical(gh, n, &periods[0], &sizes[0], w, &a.h, &msg), msg); err != nil {
		return nil, err
	}
	return a, nil
}

// Step counts one training step and, when it is due, averages params over the
// group in place (a collective then: every rank calls Step equally often, with
// slices of the same lengths). It reports whether it averaged.
func (a *Averager[T]) Step(params [][]T) (averaged bool, err error) {
	const op = "Averager.Step"
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
	var msg *C.char
	err = check(op, C.pbgo_averager_step(h, n, describeSlices(&pin, params), &did, &msg), msg)
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
