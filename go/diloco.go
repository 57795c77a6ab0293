package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"runtime"
)

// Quantization is how DiLoCo's pseudo-gradients travel (docs/diloco.md): an
// all-to-all of each rank's chunks, a float32 sum per chunk owner, an
// all-gather of the means.
type Quantization int32

// Quantizations (PB_QUANT_* of pybridge.h). The block formats carry a float32
// scale per WithBlockSize elements.
const (
	QuantFP32 Quantization = C.PB_QUANT_FP32 // exact: 4 bytes an element
	QuantBF16 Quantization = C.PB_QUANT_BF16 // 2 bytes an element
	QuantFP8  Quantization = C.PB_QUANT_FP8  // e4m3 per block: 1 byte + 4/block
	QuantInt8 Quantization = C.PB_QUANT_INT8 // symmetric per block: 1 byte + 4/block
	QuantInt4 Quantization = C.PB_QUANT_INT4 // symmetric per block, two a byte: 1/2 byte + 4/block
)

// DiLoCo trains across slow links (DiLoCo and Streaming DiLoCo; docs/diloco.md):
// each rank steps its own replica with its own inner optimizer and calls Step
// after each inner step. Every syncEvery steps a fragment of the model syncs:
// its pseudo-gradient (its weights at the last sync minus its weights now) is
// averaged over the group, an outer optimizer (SGD with Nesterov momentum, lr
// 0.7, momentum 0.9 by default: the paper's) steps the last-sync weights with
// it, and those become the fragment's weights on every rank (mixed with the
// local ones by WithAlpha). The schedule, the average and the outer step are
// the Python core's, the same for Python, C and Go.
//
//	d, err := pybridge.NewDiLoCo(g, params, 100, pybridge.WithQuantization(pybridge.QuantInt8))
//	for step := 0; step < steps; step++ {
//		// the inner step: compute gradients and update params
//		if _, err := d.Step(params); err != nil { ... }
//	}
//
// A DiLoCo may be used from one goroutine at a time.
type DiLoCo[T Float] struct {
	cHandle[*C.pb_diloco]
	group *Group // what a ...Context call aborts
}

// dilocoConfig is what the options fill: the C options struct, and the first value an
// option could not take (the constructor returns it as ErrInvalidArgument).
type dilocoConfig struct {
	o   C.pb_diloco_options
	bad string
}

// DiLoCoOption configures NewDiLoCo. The library checks every value: a bad one
// makes NewDiLoCo fail with ErrInvalidArgument naming it.
type DiLoCoOption func(*dilocoConfig)

// WithFragments makes it Streaming DiLoCo: the parameter slices, in order, are
// cut into f runs of about equal size (f at most the slice count, dividing
// syncEvery; default 1), and one fragment syncs every syncEvery / f steps, in
// turn, so each sync sends 1/f of the model.
func WithFragments(f int) DiLoCoOption {
	return func(c *dilocoConfig) { c.o.fragments = optionInt32(&c.bad, "WithFragments", "fragments", f) }
}

// WithDelay lets each sync travel while the next tau inner steps run (Streaming
// DiLoCo's overlap): its result is applied tau steps after its
// pseudo-gradient was taken; 0 <= tau < syncEvery / fragments (default 0).
func WithDelay(tau int) DiLoCoOption {
	return func(c *dilocoConfig) { c.o.delay = optionInt32(&c.bad, "WithDelay", "delay", tau) }
}

// WithAlpha mixes the synced weights with the local ones: after a sync a
// fragment's weights are (1 - alpha) global + alpha local, alpha in [0, 1]
// (default 0: the global weights).
func WithAlpha(alpha float64) DiLoCoOption {
	return func(c *dilocoConfig) { c.o.alpha = C.double(alpha) }
}

// WithOuterSGD sets the outer optimizer, SGD with learning rate lr > 0 and
// momentum in [0, 1), Nesterov's if nesterov (which needs momentum > 0).
// Default: lr 0.7, momentum 0.9, Nesterov.
func WithOuterSGD(lr, momentum float64, nesterov bool) DiLoCoOption {
	return func(c *dilocoConfig) {
		c.o.outer_lr, c.o.outer_momentum, c.o.outer_nesterov = C.double(lr), C.double(momentum), 0
		if nesterov {
			c.o.outer_nesterov = 1
		}
	}
}

// WithQuantization chooses how pseudo-gradients travel (default QuantFP32).
func WithQuantization(q Quantization) DiLoCoOption {
	return func(c *dilocoConfig) { c.o.quantization = C.int32_t(q) }
}

// WithBlockSize sets the elements per scale of QuantFP8, QuantInt8 and
// QuantInt4 (at least 1; default 128).
func WithBlockSize(n int) DiLoCoOption {
	return func(c *dilocoConfig) { c.o.block_size = optionInt32(&c.bad, "WithBlockSize", "block size", n) }
}

// WithErrorFeedback keeps what each rank's quantization lost and adds it to
// its next pseudo-gradient of that fragment (a lossy quantization only).
func WithErrorFeedback() DiLoCoOption {
	return func(c *dilocoConfig) { c.o.error_feedback = 1 }
}

// NewDiLoCo returns a DiLoCo over g for the model params (their values, equal
// on every rank: broadcast them first, e.g. BroadcastParams), syncing each
// fragment every syncEvery (at least 1) inner steps. The slices are read during
// the call only; Step takes them again. It is a collective over g: every rank
// passes the same slice lengths, syncEvery and options, and where they (or the
// weights) differ every rank gets ErrInvalidArgument naming what differs.
func NewDiLoCo[T Float](g *Group, params [][]T, syncEvery int, opts ...DiLoCoOption) (*DiLoCo[T], error) {
	return newDiLoCo(context.Background(), "NewDiLoCo", g, params, syncEvery, opts)
}

// NewDiLoCoContext is NewDiLoCo under ctx (see Contexts): a ctx that ends while
// it waits for the other ranks aborts g.
func NewDiLoCoContext[T Float](ctx context.Context, g *Group, params [][]T, syncEvery int,
	opts ...DiLoCoOption) (*DiLoCo[T], error) {
	return newDiLoCo(ctx, "NewDiLoCoContext", g, params, syncEvery, opts)
}

func newDiLoCo[T Float](ctx context.Context, op string, g *Group, params [][]T, syncEvery int,
	opts []DiLoCoOption) (*DiLoCo[T], error) {
	gh, err := g.handle(op)
	if err != nil {
		return nil, err
	}
	c := &dilocoConfig{}
	C.pb_diloco_options_init(&c.o)
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	if c.bad != "" {
		return nil, newError(statusInvalidArgument, op, "%s", c.bad)
	}
	h1, err := toInt32(op, "syncEvery", syncEvery)
	if err != nil {
		return nil, err
	}
	n, err := toInt32(op, "parameter count", len(params))
	if err != nil {
		return nil, err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	descs := describeSlices(&pin, params)
	var h *C.pb_diloco
	err = g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_diloco_create(gh, n, descs, h1, &c.o, &h, &msg), msg)
	})
	if err != nil {
		if h != nil { // made by a call whose context ended: its group was aborted
			C.pbgo_diloco_close(h, nil)
		}
		return nil, err
	}
	d := &DiLoCo[T]{group: g}
	d.h = h
	return d, nil
}

// Step counts one inner step (call it after the inner optimizer's update of
// params, the slices given to NewDiLoCo, of the same lengths), then starts,
// finishes and applies the syncs the schedule puts here, writing the synced
// weights into params. It reports whether a sync was applied. A collective at
// sync steps: every rank calls Step equally often.
func (d *DiLoCo[T]) Step(params [][]T) (synced bool, err error) {
	return d.step(context.Background(), "DiLoCo.Step", params)
}

// StepContext is Step under ctx (see Contexts): a ctx that ends while a sync
// waits aborts the DiLoCo's group.
func (d *DiLoCo[T]) StepContext(ctx context.Context, params [][]T) (synced bool, err error) {
	return d.step(ctx, "DiLoCo.StepContext", params)
}

func (d *DiLoCo[T]) step(ctx context.Context, op string, params [][]T) (bool, error) {
	if d == nil {
		return false, nilError(op, "DiLoCo")
	}
	h, err := d.acquire(op, "DiLoCo is closed")
	if err != nil {
		return false, err
	}
	defer d.mu.Unlock()
	n, err := toInt32(op, "parameter count", len(params))
	if err != nil {
		return false, err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	descs := describeSlices(&pin, params)
	var did C.int32_t
	err = underContext(ctx, op, d.group, func() error {
		var msg *C.char
		return check(op, C.pbgo_diloco_step(h, n, descs, &did, &msg), msg)
	})
	return did != 0, err
}

// DiLoCoCounts is what a DiLoCo did so far.
type DiLoCoCounts struct {
	Steps     int64 // inner steps counted
	Syncs     int64 // syncs applied
	BytesSent int64 // bytes this rank sent for them
}

// Counts returns what the DiLoCo did so far.
func (d *DiLoCo[T]) Counts() (DiLoCoCounts, error) {
	const op = "DiLoCo.Counts"
	if d == nil {
		return DiLoCoCounts{}, nilError(op, "DiLoCo")
	}
	h, err := d.acquireShared(op, "DiLoCo is closed")
	if err != nil {
		return DiLoCoCounts{}, err
	}
	defer d.mu.RUnlock()
	var steps, syncs, sent C.int64_t
	var msg *C.char
	err = check(op, C.pbgo_diloco_counts(h, &steps, &syncs, &sent, &msg), msg)
	return DiLoCoCounts{int64(steps), int64(syncs), int64(sent)}, err
}

// Close stops the DiLoCo's sync thread and frees its group (a sync under way is
// dropped). A second Close returns nil.
func (d *DiLoCo[T]) Close() error {
	const op = "DiLoCo.Close"
	if d == nil {
		return nilError(op, "DiLoCo")
	}
	return d.close(op, func(h *C.pb_diloco, msg **C.char) C.int { return C.pbgo_diloco_close(h, msg) })
}
