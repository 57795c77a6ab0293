package pybridge

/*
#include "pbgo_federated.h"
*/
import "C"

import (
	"math"
	"unsafe"
)

// Server strategies, FedBuff / FedAsync and central differential privacy for a
// FedServer (docs/federated.md "Modes" and "Strategies"): functional options
// that fill one pb_fed_options, set by NewFedServer through
// pb_fed_server_configure. The arithmetic is the Python core's.

// Buffered asynchronous modes (WithFedMode): no rounds for the workers; the
// model steps every WithBufferSize training results (FedBuff) or at every
// result (FedAsyncUpdates), each weighted by its staleness. A round is the
// clients of one StartRound: Next reports ok false as soon as they are all
// handed out and a worker is idle; clients still out stay out and their
// results come with later rounds. Aggregate copies the current model out and
// returns the clients stepped since its last call; its lr, if > 0, becomes
// the server learning rate of the steps to come.
const (
	FedBuff         FedMode = C.PB_FED_FEDBUFF  // FedBuff (Nguyen et al. 2022): a step every K results
	FedAsyncUpdates FedMode = C.PB_FED_FEDASYNC // FedAsync (Xie et al. 2019): a step at every result
)

// FedStrategy is the server optimizer applied to each step's pseudo-gradient.
type FedStrategy int32

// Server optimizers (Reddi et al. 2021; PB_FED_STRATEGY_* of pybridge.h).
const (
	FedAvgSGD  FedStrategy = C.PB_FED_STRATEGY_FEDAVG // x -= eta * g (FedAvg; FedAvgM with WithServerMomentum)
	FedAdagrad FedStrategy = C.PB_FED_STRATEGY_FEDADAGRAD
	FedAdam    FedStrategy = C.PB_FED_STRATEGY_FEDADAM
	FedYogi    FedStrategy = C.PB_FED_STRATEGY_FEDYOGI
)

// Staleness is the weight function of an update tau model versions old.
type Staleness int32

// Staleness functions (PB_FED_STALENESS_* of pybridge.h).
const (
	StalenessConstant   Staleness = C.PB_FED_STALENESS_CONSTANT   // 1
	StalenessPolynomial Staleness = C.PB_FED_STALENESS_POLYNOMIAL // (1 + tau)^-a
	StalenessHinge      Staleness = C.PB_FED_STALENESS_HINGE      // 1 if tau <= b, else 1 / (a (tau - b) + 1)
)

// options returns c's pb_fed_options, filled with the defaults on first use.
func (c *fedConfig) options() *C.pb_fed_options {
	if c.agg == nil {
		c.agg = new(C.pb_fed_options)
		C.pb_fed_options_init(c.agg)
	}
	return c.agg
}

// WithServerOptimizer chooses the server optimizer and its learning rate eta
// (0: 1 for FedAvgSGD, 0.01 for the adaptive ones) for the buffered modes'
// steps; in the round modes each Aggregate's lr is its step's.
func WithServerOptimizer(s FedStrategy, eta float64) FedOption {
	return func(c *fedConfig) {
		o := c.options()
		o.strategy, o.eta = C.int32_t(s), C.double(eta)
		c.strategyName = nil
	}
}

// WithAdaptiveMoments sets FedAdagrad's, FedAdam's and FedYogi's beta1, beta2
// and tau (defaults 0.9, 0.99, 1e-3).
func WithAdaptiveMoments(beta1, beta2, tau float64) FedOption {
	return func(c *fedConfig) {
		o := c.options()
		o.beta1, o.beta2, o.tau = C.double(beta1), C.double(beta2), C.double(tau)
	}
}

// WithServerMomentum gives FedAvgSGD server momentum in [0, 1) (FedAvgM).
func WithServerMomentum(m float64) FedOption {
	return func(c *fedConfig) { c.options().momentum = C.double(m) }
}

// WithBufferSize sets FedBuff's K, the training results per model step
// (default 10).
func WithBufferSize(k int) FedOption {
	return func(c *fedConfig) { c.options().buffer_size = C.int32_t(k) }
}

// WithStaleness chooses the buffered modes' staleness function; a or b < 0
// take its defaults (polynomial a 0.5; hinge a 10, b 4).
func WithStaleness(f Staleness, a, b float64) FedOption {
	return func(c *fedConfig) {
		o := c.options()
		o.staleness, o.staleness_a, o.staleness_b = C.int32_t(f), C.double(a), C.double(b)
	}
}

// WithMaxStaleness refuses, in the buffered modes, updates computed on a model
// more than versions steps old (they are pulled but not aggregated).
func WithMaxStaleness(versions int) FedOption {
	return func(c *fedConfig) { c.options().max_staleness = C.int64_t(versions) }
}

// WithCentralDP clips each client's update to L2 norm clipNorm, weights a
// step's n clients equally and adds Gaussian noise of standard deviation
// noiseMultiplier * clipNorm / n, drawn from a generator seeded with seed.
func WithCentralDP(clipNorm, noiseMultiplier float64, seed int64) FedOption {
	return func(c *fedConfig) {
		o := c.options()
		o.dp_clip_norm, o.dp_noise_multiplier, o.dp_seed = C.double(clipNorm), C.double(noiseMultiplier), C.int64_t(seed)
	}
}

// configure sets the options given on the new server h; on an error it
// closes h (which ends the federation for the workers).
func (c *fedConfig) configure(op string, h *C.pb_fed_server) error {
	if c.agg == nil {
		return nil
	}
	if c.strategyName != nil { // C memory for the call only
		c.agg.strategy_name = C.CString(*c.strategyName)
		defer func() { C.free(unsafe.Pointer(c.agg.strategy_name)); c.agg.strategy_name = nil }()
	}
	var msg *C.char
	if err := check(op, C.pbgo_fed_server_configure(h, c.agg, &msg), msg); err != nil {
		C.pbgo_fed_server_close(h, nil)
		return err
	}
	return nil
}

// FedStep describes the server's last model step.
type FedStep struct {
	Version         int     // the model version the step made (the round, in round modes)
	Clients         int     // updates in the step
	Clipped         int     // of which central DP clipped
	Samples         int     // their samples
	MaxStaleness    int     // the oldest update's staleness, in versions
	LR              float64 // the server learning rate used
	ClipNorm        float64 // central DP's clip norm (0: no DP)
	NoiseMultiplier float64
	NoiseStd        float64 // the noise's standard deviation this step
}

// LastStep returns the server's last model step (ok false before any) and the
// number of updates refused so far as too stale.
func (s *FedServer[T]) LastStep() (step FedStep, ok bool, refused int, err error) {
	const op = "FedServer.LastStep"
	h, err := s.lock(op)
	if err != nil {
		return step, false, 0, err
	}
	defer s.mu.Unlock()
	var st C.pb_fed_step
	var has C.int32_t
	var ref C.int64_t
	var msg *C.char
	if err := check(op, C.pbgo_fed_server_last_step(h, &st, &has, &ref, &msg), msg); err != nil {
		return step, false, 0, err
	}
	return FedStep{
		Version: int(st.version), Clients: int(st.clients), Clipped: int(st.clipped), Samples: int(st.samples),
		MaxStaleness: int(st.max_staleness), LR: float64(st.lr), ClipNorm: float64(st.clip_norm),
		NoiseMultiplier: float64(st.noise_multiplier), NoiseStd: float64(st.noise_std),
	}, has != 0, int(ref), nil
}

// FedProxGrad adds FedProx's proximal gradient mu * (weights - global) to
// grad, for a worker minimising its loss + mu/2 ||weights - global||^2 (global:
// the task's model). mu must be finite and >= 0, and all three must have one
// length; otherwise grad is left as it was.
//
// The rule and messages are pybridge/federated/fedprox.py's add_proximal_grad
// (mu checked first, then the lengths); this stays a Go loop because it runs on
// the worker's Go slices every step, where a library call would cost more than
// the arithmetic. tests/data/fedprox.json holds the cases the Python and the
// Go test both run.
func FedProxGrad[T ~float32 | ~float64](grad, weights, global []T, mu float64) error {
	const op = "FedProxGrad"
	if math.IsNaN(mu) || math.IsInf(mu, 0) || mu < 0 {
		return newError(statusInvalidArgument, op, "FedProx's mu must be a finite number >= 0, got %v", mu)
	}
	if len(weights) != len(global) {
		return newError(statusInvalidArgument, op,
			"FedProx's global tensor must match its parameter: weights has %d elements, global %d",
			len(weights), len(global))
	}
	if len(grad) != len(weights) {
		return newError(statusInvalidArgument, op, "FedProx's grad must match the weights: grad has %d elements, "+
			"weights %d", len(grad), len(weights))
	}
	m := T(mu)
	for i := range grad {
		grad[i] += m * (weights[i] - global[i])
	}
	return nil
}
