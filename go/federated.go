package pybridge

/*
#include "pbgo_federated.h"
*/
import "C"

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"time"
	"unsafe"
)

// Federated training (docs/federated.md): rank 0 of a group runs a FedServer,
// every other rank a FedWorker that holds the clients' data. Each round the
// server sends the model and hands out client ids; a worker trains one client
// at a time and returns its weights, and gets its next client at once. The
// server pulls results in completion order and aggregates them with FedAvg.
// The logic is the Python core's; these are thin wrappers over the C ABI.
// Server and workers interoperate with Python and C peers.
//
// A worker's loop, driven by the Go program:
//
//	w, err := pybridge.NewFedWorker[float32](g)
//	defer w.Close()
//	for {
//		task, ok, err := w.Next()
//		if err != nil || !ok {
//			break // !ok: the server ended the federation
//		}
//		weights, samples := train(task.Model, task.Client) // your code
//		err = w.Submit(weights, samples)                  // or w.Fail("why")
//	}

// FedMode is how a FedServer hands out clients.
type FedMode int32

// Federated server modes (PB_FED_* of pybridge.h).
const (
	FedAsync FedMode = C.PB_FED_ASYNC // a worker gets its next client as soon as it returns one
	FedSync  FedMode = C.PB_FED_SYNC  // waves of one client per worker (FLUTE on gloo)
)

// FedCommand is what a task asks of a worker.
type FedCommand int32

// Federated task commands (PB_FED_* of pybridge.h).
const (
	FedTrain    FedCommand = C.PB_FED_TRAIN    // train the client; the result is its weights
	FedEvaluate FedCommand = C.PB_FED_EVALUATE // evaluate the client; the result is metrics
)

func (c FedCommand) String() string {
	switch c {
	case FedTrain:
		return "train"
	case FedEvaluate:
		return "evaluate"
	}
	return "FedCommand(" + strconv.Itoa(int(c)) + ")"
}

type fedConfig struct {
	mode          FedMode
	timeout       time.Duration
	requeue       bool
	maxNorm       float64
	maxSamples    int64
	maxSamplesSet bool
	agg           *C.pb_fed_options // strategies, FedBuff, DP (federated_strategy.go); nil: the defaults
	strategyName  *string           // WithServerOptimizerName (registry.go); nil: agg.strategy chooses
}

// FedOption configures NewFedServer.
type FedOption func(*fedConfig)

// WithFedMode chooses FedAsync (the default) or FedSync.
func WithFedMode(m FedMode) FedOption { return func(c *fedConfig) { c.mode = m } }

// WithClientTimeout bounds how long a worker may hold a client (default: the
// group's timeout).
func WithClientTimeout(d time.Duration) FedOption { return func(c *fedConfig) { c.timeout = d } }

// WithRequeue hands the client of a worker lost while holding it (dead, or past
// the client timeout) to the remaining workers, so that the round completes.
func WithRequeue() FedOption { return func(c *fedConfig) { c.requeue = true } }

// WithMaxNorm refuses training updates (pseudo-gradients) whose L2 norm is
// above maxNorm (default: no bound). Updates with NaN or Inf elements are always
// refused: Next returns a *FedWorkerError wrapping ErrCorrupt that names the
// worker, the client and the round (with WithRequeue the client is handed out
// once more first).
func WithMaxNorm(maxNorm float64) FedOption { return func(c *fedConfig) { c.maxNorm = maxNorm } }

// WithMaxSamples bounds the sample count a result may claim (default 2^31):
// a worker whose result claims more is retired, named by rank, client and round
// (with WithRequeue its client goes to the other workers), so that no single
// update outweighs the round. Set it to the largest client's dataset size.
// ErrInvalidArgument from NewFedServer when maxSamples < 1.
func WithMaxSamples(maxSamples int64) FedOption {
	return func(c *fedConfig) { c.maxSamples = maxSamples; c.maxSamplesSet = true }
}

// FedWorkerError is the server's error for a worker that died, timed out or
// reported a failure while holding a client. It wraps the library's *Error, so
// errors.Is(err, ErrComm) or errors.Is(err, ErrTimeout) hold.
type FedWorkerError struct {
	Worker int // the worker's rank in the federated group
	Client int // the client it held, or -1
	Round  int // the round it happened in
	Err    error
}

func (e *FedWorkerError) Error() string { return e.Err.Error() }

// Unwrap returns the library's *Error.
func (e *FedWorkerError) Unwrap() error { return e.Err }

// FedResult describes one client's result, pulled by FedServer.Next.
type FedResult struct {
	Command FedCommand
	Round   int // the server's round, 1 for the first
	Client  int
	Worker  int // the worker's rank in the federated group
	Samples int // examples the worker trained or evaluated on
	Len     int // elements in the payload (FedServer.Payload)
	DType   DType
	Elapsed time.Duration // from handing the client out to the result's arrival
}

// FedServer is rank 0 of a federated group; T is the model's element type.
// Use it from one goroutine.
type FedServer[T Float] struct {
	cHandle[*C.pb_fed_server]
	group *Group // what a ...Context call aborts
}

// NewFedServer creates the server on rank 0 of g. It is a collective with the
// workers' NewFedWorker. ErrInvalidArgument on any other rank.
func NewFedServer[T Float](g *Group, opts ...FedOption) (*FedServer[T], error) {
	return newFedServer[T](context.Background(), "NewFedServer", g, opts)
}

// NewFedServerContext is NewFedServer under ctx (see Contexts): a ctx that ends
// while it waits for the workers aborts g.
func NewFedServerContext[T Float](ctx context.Context, g *Group, opts ...FedOption) (*FedServer[T], error) {
	return newFedServer[T](ctx, "NewFedServerContext", g, opts)
}

func newFedServer[T Float](ctx context.Context, op string, g *Group, opts []FedOption) (*FedServer[T], error) {
	gh, err := g.handle(op)
	if err != nil {
		return nil, err
	}
	c := fedConfig{}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	secs := 0.0 // the group's timeout
	if c.timeout > 0 {
		secs = c.timeout.Seconds()
	}
	var h *C.pb_fed_server
	err = g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_fed_server_new(gh, C.int32_t(c.mode), C.double(secs), cbool(c.requeue), &h, &msg), msg)
	})
	if err != nil {
		if h != nil {
			C.pbgo_fed_server_close(h, nil)
		}
		return nil, err
	}
	var msg *C.char
	if c.maxNorm != 0 {
		if err := check(op, C.pbgo_fed_server_set_max_norm(h, C.double(c.maxNorm), &msg), msg); err != nil {
			C.pbgo_fed_server_close(h, nil)
			return nil, err
		}
	}
	if c.maxSamplesSet {
		if err := check(op, C.pbgo_fed_server_set_max_samples(h, C.int64_t(c.maxSamples), &msg), msg); err != nil {
			C.pbgo_fed_server_close(h, nil)
			return nil, err
		}
	}
	if err := c.configure(op, h); err != nil { // federated_strategy.go
		return nil, err
	}
	s := &FedServer[T]{group: g}
	s.h = h
	return s, nil
}

// lock returns the handle with s.mu held (the caller unlocks): calls on a server
// run one at a time.
func (s *FedServer[T]) lock(op string) (*C.pb_fed_server, error) {
	if s == nil {
		return nil, nilError(op, "FedServer")
	}
	return s.acquire(op, "federated server is closed")
}

// SetAffinity hands client only to workers (their ranks), those that hold its
// data, from the next assignment on; no workers lifts it. A round whose
// remaining clients can go only to lost workers fails with ErrComm.
func (s *FedServer[T]) SetAffinity(client int, workers []int) error {
	const op = "FedServer.SetAffinity"
	h, err := s.lock(op)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	var msg *C.char
	return check(op, C.pbgo_fed_server_set_affinity(h, C.int64_t(client), cArray[C.int32_t](workers),
		C.int32_t(len(workers)), &msg), msg)
}

// StartRound sends model to the workers and hands out clients (ids >= 0, each
// once, at least one) to train. Pull the results with Next, then Aggregate. A
// round may be left before all its results are pulled (over-selection): its
// clients still out are not waited for and their late results are dropped.
func (s *FedServer[T]) StartRound(clients []int, model []T) error {
	return s.start(context.Background(), "FedServer.StartRound", clients, model, FedTrain)
}

// StartRoundContext is StartRound under ctx (see Contexts): a ctx that ends while
// it sends the model to the workers aborts the server's group.
func (s *FedServer[T]) StartRoundContext(ctx context.Context, clients []int, model []T) error {
	return s.start(ctx, "FedServer.StartRoundContext", clients, model, FedTrain)
}

// StartEvaluation is StartRound for evaluation: the results carry the
// workers' metrics (read them with Payload) and are not aggregated.
func (s *FedServer[T]) StartEvaluation(clients []int, model []T) error {
	return s.start(context.Background(), "FedServer.StartEvaluation", clients, model, FedEvaluate)
}

// StartEvaluationContext is StartEvaluation under ctx, as StartRoundContext.
func (s *FedServer[T]) StartEvaluationContext(ctx context.Context, clients []int, model []T) error {
	return s.start(ctx, "FedServer.StartEvaluationContext", clients, model, FedEvaluate)
}

func (s *FedServer[T]) start(ctx context.Context, op string, clients []int, model []T, cmd FedCommand) error {
	h, err := s.lock(op)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	data, n := dataOf(model)
	ids := cArray[C.int64_t](clients)
	return underContext(ctx, op, s.group, func() error {
		var msg *C.char
		return check(op, C.pbgo_fed_server_start_round_slice(h, ids, C.int64_t(len(clients)), data, n,
			dtypeOf[T](), C.int32_t(cmd), &msg), msg)
	})
}

// Next waits for the round's next result, in completion order; ok is false
// when every client of the round is done. A worker that died, timed out or
// failed its client gives a *FedWorkerError and ends the round: ErrComm, or
// ErrTimeout past the client timeout (WithRequeue hands a dead or timed-out
// worker's client to the others instead). A refused update (NaN or Inf, or past
// WithMaxNorm) gives a *FedWorkerError wrapping ErrCorrupt.
func (s *FedServer[T]) Next() (r FedResult, ok bool, err error) {
	return s.next(context.Background(), "FedServer.Next")
}

// NextContext is Next under ctx (see Contexts): a ctx that ends while it waits for
// a result aborts the server's group (the federation is then over: Close it).
func (s *FedServer[T]) NextContext(ctx context.Context) (r FedResult, ok bool, err error) {
	return s.next(ctx, "FedServer.NextContext")
}

func (s *FedServer[T]) next(ctx context.Context, op string) (r FedResult, ok bool, err error) {
	h, err := s.lock(op)
	if err != nil {
		return r, false, err
	}
	defer s.mu.Unlock()
	var res C.pb_fed_result
	var has C.int32_t
	res.worker = -1
	if err := underContext(ctx, op, s.group, func() error {
		var msg *C.char
		return check(op, C.pbgo_fed_server_next_result(h, &res, &has, &msg), msg)
	}); err != nil {
		if res.worker >= 0 && !errors.Is(err, ErrCanceled) {
			return r, false, &FedWorkerError{Worker: int(res.worker), Client: int(res.client), Round: int(res.round),
				Err: err}
		}
		return r, false, err
	}
	if has == 0 {
		return r, false, nil
	}
	return FedResult{
		Command: FedCommand(res.command), Round: int(res.round), Client: int(res.client),
		Worker: int(res.worker), Samples: int(res.samples), Len: int(res.length), DType: DType(res.dtype),
		Elapsed: time.Duration(float64(res.seconds) * float64(time.Second)),
	}, true, nil
}

// Payload copies the last result's payload into dst: len(dst) must be its Len
// and its DType T's. For a training result it is the pseudo-gradient (round
// model - trained weights), already added to the round's FedAvg.
func (s *FedServer[T]) Payload(dst []T) error {
	const op = "FedServer.Payload"
	h, err := s.lock(op)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	data, n := dataOf(dst)
	var msg *C.char
	return check(op, C.pbgo_fed_server_result_payload_slice(h, data, n, dtypeOf[T](), &msg), msg)
}

// ResultMetric returns the last result's metric name as its worker sent it
// (SubmitMetrics); ok is false when the result has none of that name.
func (s *FedServer[T]) ResultMetric(name string) (value float64, ok bool, err error) {
	return s.metric("FedServer.ResultMetric", name, false)
}

// RoundMetric returns the current round's sample-weighted mean of metric name
// over the results pulled so far; ok is false when none of them sent it.
func (s *FedServer[T]) RoundMetric(name string) (value float64, ok bool, err error) {
	return s.metric("FedServer.RoundMetric", name, true)
}

func (s *FedServer[T]) metric(op, name string, round bool) (float64, bool, error) {
	h, err := s.lock(op)
	if err != nil {
		return 0, false, err
	}
	defer s.mu.Unlock()
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var value C.double
	var found C.int32_t
	var msg *C.char
	var st C.int
	if round {
		st = C.pbgo_fed_server_round_metric(h, cname, &value, &found, &msg)
	} else {
		st = C.pbgo_fed_server_result_metric(h, cname, &value, &found, &msg)
	}
	if err := check(op, st, msg); err != nil {
		return 0, false, err
	}
	return float64(value), found != 0, nil
}

// Aggregate applies FedAvg to the training results pulled this round and
// writes the new model into model (the round's length): the sample-weighted
// mean of the pseudo-gradients, stepped with learning rate lr (1.0 is plain
// FedAvg). It returns the number of clients aggregated.
func (s *FedServer[T]) Aggregate(lr float64, model []T) (int, error) {
	return s.aggregate(context.Background(), "FedServer.Aggregate", lr, model)
}

// AggregateContext is Aggregate under ctx (see Contexts): a ctx already done
// aggregates nothing. Aggregate waits on no worker (the results were pulled by
// Next), so it is not interrupted once started.
func (s *FedServer[T]) AggregateContext(ctx context.Context, lr float64, model []T) (int, error) {
	return s.aggregate(ctx, "FedServer.AggregateContext", lr, model)
}

func (s *FedServer[T]) aggregate(ctx context.Context, op string, lr float64, model []T) (int, error) {
	h, err := s.lock(op)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	data, n := dataOf(model)
	var clients C.int32_t
	err = underContext(ctx, op, nil, func() error {
		var msg *C.char
		return check(op, C.pbgo_fed_server_aggregate_slice(h, C.double(lr), data, n, dtypeOf[T](), &clients, &msg), msg)
	})
	return int(clients), err
}

// Close terminates the workers (after the clients still out are back) and
// releases the server; closing again returns nil.
func (s *FedServer[T]) Close() error {
	const op = "FedServer.Close"
	if s == nil {
		return nilError(op, "FedServer")
	}
	return s.close(op, func(h *C.pb_fed_server, msg **C.char) C.int { return C.pbgo_fed_server_close(h, msg) })
}

// FedTask is a client to train or evaluate on the round's model.
type FedTask[T Float] struct {
	Command FedCommand
	Round   int
	Client  int
	Model   []T // this task's own copy of the model: train it in place if you like
}

// FedWorker is a worker of a federated group (any rank but 0); T is the
// model's element type. Use it from one goroutine.
type FedWorker[T Float] struct {
	cHandle[*C.pb_fed_worker]
	group *Group // what a ...Context call aborts
}

// NewFedWorker creates a worker on a rank other than 0 of g. It is a
// collective with the server's NewFedServer. ErrInvalidArgument on rank 0.
func NewFedWorker[T Float](g *Group) (*FedWorker[T], error) {
	return newFedWorker[T](context.Background(), "NewFedWorker", g)
}

// NewFedWorkerContext is NewFedWorker under ctx (see Contexts): a ctx that ends
// while it waits for the server aborts g.
func NewFedWorkerContext[T Float](ctx context.Context, g *Group) (*FedWorker[T], error) {
	return newFedWorker[T](ctx, "NewFedWorkerContext", g)
}

func newFedWorker[T Float](ctx context.Context, op string, g *Group) (*FedWorker[T], error) {
	gh, err := g.handle(op)
	if err != nil {
		return nil, err
	}
	var h *C.pb_fed_worker
	err = g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_fed_worker_new(gh, &h, &msg), msg)
	})
	if err != nil {
		if h != nil {
			C.pbgo_fed_worker_close(h, nil)
		}
		return nil, err
	}
	w := &FedWorker[T]{group: g}
	w.h = h
	return w, nil
}

// lock returns the handle with w.mu held (the caller unlocks), as FedServer's.
func (w *FedWorker[T]) lock(op string) (*C.pb_fed_worker, error) {
	if w == nil {
		return nil, nilError(op, "FedWorker")
	}
	return w.acquire(op, "federated worker is closed")
}

// Next blocks until the server hands out a client; ok is false once the
// server has ended the federation. Answer each task (Submit or Fail) before
// the next call. A model whose element type is not T is refused (the task is
// failed, so the server hears of it) with ErrInvalidArgument. A server that died
// gives ErrComm naming rank 0, not a wait.
func (w *FedWorker[T]) Next() (task *FedTask[T], ok bool, err error) {
	return w.next(context.Background(), "FedWorker.Next")
}

// NextContext is Next under ctx (see Contexts): a ctx that ends while it waits for
// the server aborts the worker's group (this worker is then lost to the server:
// Close it).
func (w *FedWorker[T]) NextContext(ctx context.Context) (task *FedTask[T], ok bool, err error) {
	return w.next(ctx, "FedWorker.NextContext")
}

func (w *FedWorker[T]) next(ctx context.Context, op string) (task *FedTask[T], ok bool, err error) {
	h, err := w.lock(op)
	if err != nil {
		return nil, false, err
	}
	defer w.mu.Unlock()
	var t C.pb_fed_task
	var has C.int32_t
	if err := underContext(ctx, op, w.group, func() error {
		var msg *C.char
		return check(op, C.pbgo_fed_worker_next_task(h, &t, &has, &msg), msg)
	}); err != nil || has == 0 {
		return nil, false, err
	}
	var msg *C.char
	if t.dtype != dtypeOf[T]() {
		err := newError(statusInvalidArgument, op, "the server's model is %v; this worker takes %v",
			DType(t.dtype), DType(dtypeOf[T]()))
		text := C.CString(err.Error())
		defer C.free(unsafe.Pointer(text))
		C.pbgo_fed_worker_fail(h, text, nil)
		return nil, false, err
	}
	model := make([]T, int(t.length))
	data, n := dataOf(model)
	if err := check(op, C.pbgo_fed_worker_task_model_slice(h, data, n, t.dtype, &msg), msg); err != nil {
		return nil, false, err
	}
	return &FedTask[T]{Command: FedCommand(t.command), Round: int(t.round), Client: int(t.client), Model: model}, true, nil
}

// Submit answers the open task. Training: result is the client's trained
// weights (the model's length) and samples the examples trained on; the server
// receives the pseudo-gradient. Evaluation: result holds any metrics.
func (w *FedWorker[T]) Submit(result []T, samples int) error {
	return w.submit(context.Background(), "FedWorker.Submit", result, samples)
}

// SubmitContext is Submit under ctx (see Contexts): a ctx already done sends
// nothing. Submit waits for no answer, so a send once started is not interrupted
// (it waits only while the server does not read, bounded by the link's timeout).
func (w *FedWorker[T]) SubmitContext(ctx context.Context, result []T, samples int) error {
	return w.submit(ctx, "FedWorker.SubmitContext", result, samples)
}

func (w *FedWorker[T]) submit(ctx context.Context, op string, result []T, samples int) error {
	h, err := w.lock(op)
	if err != nil {
		return err
	}
	defer w.mu.Unlock()
	data, n := dataOf(result)
	return underContext(ctx, op, nil, func() error {
		var msg *C.char
		return check(op, C.pbgo_fed_worker_submit_slice(h, data, n, dtypeOf[T](), C.int64_t(samples), &msg), msg)
	})
}

// SubmitMetrics is Submit with per-client metrics (loss, accuracy, ...; at most
// 32, names of letters, digits and _ . : / -), which the server returns with the
// result and averages over the round weighted by samples (FedServer.ResultMetric,
// FedServer.RoundMetric).
func (w *FedWorker[T]) SubmitMetrics(result []T, samples int, metrics map[string]float64) error {
	return w.submitMetrics(context.Background(), "FedWorker.SubmitMetrics", result, samples, metrics)
}

// SubmitMetricsContext is SubmitMetrics under ctx, as SubmitContext.
func (w *FedWorker[T]) SubmitMetricsContext(ctx context.Context, result []T, samples int,
	metrics map[string]float64) error {
	return w.submitMetrics(ctx, "FedWorker.SubmitMetricsContext", result, samples, metrics)
}

func (w *FedWorker[T]) submitMetrics(ctx context.Context, op string, result []T, samples int,
	metrics map[string]float64) error {
	h, err := w.lock(op)
	if err != nil {
		return err
	}
	defer w.mu.Unlock()
	keys := make([]string, 0, len(metrics))
	for k := range metrics {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the same order on every call
	values := make([]C.double, len(keys))
	var names **C.char
	if len(keys) > 0 {
		names = (**C.char)(C.malloc(C.size_t(len(keys)) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
		defer C.free(unsafe.Pointer(names))
		cnames := unsafe.Slice(names, len(keys))
		for i, k := range keys {
			cnames[i] = C.CString(k)
			defer C.free(unsafe.Pointer(cnames[i]))
			values[i] = C.double(metrics[k])
		}
	}
	var vp *C.double
	if len(values) > 0 {
		vp = &values[0]
	}
	data, n := dataOf(result)
	return underContext(ctx, op, nil, func() error {
		var msg *C.char
		return check(op, C.pbgo_fed_worker_submit_metrics_slice(h, data, n, dtypeOf[T](), C.int64_t(samples),
			C.int32_t(len(keys)), names, vp, &msg), msg)
	})
}

// Fail tells the server that the open task could not be done; message is
// part of the server's error.
func (w *FedWorker[T]) Fail(message string) error {
	return w.fail(context.Background(), "FedWorker.Fail", message)
}

// FailContext is Fail under ctx, as SubmitContext.
func (w *FedWorker[T]) FailContext(ctx context.Context, message string) error {
	return w.fail(ctx, "FedWorker.FailContext", message)
}

func (w *FedWorker[T]) fail(ctx context.Context, op string, message string) error {
	h, err := w.lock(op)
	if err != nil {
		return err
	}
	defer w.mu.Unlock()
	text := C.CString(message)
	defer C.free(unsafe.Pointer(text))
	return underContext(ctx, op, nil, func() error {
		var msg *C.char
		return check(op, C.pbgo_fed_worker_fail(h, text, &msg), msg)
	})
}

// Close releases the worker (leaving early if the server has not ended the
// federation: the server then sees it as lost); closing again returns nil.
func (w *FedWorker[T]) Close() error {
	const op = "FedWorker.Close"
	if w == nil {
		return nilError(op, "FedWorker")
	}
	return w.close(op, func(h *C.pb_fed_worker, msg **C.char) C.int { return C.pbgo_fed_worker_close(h, msg) })
}

// SampleClients draws perRound distinct client ids of 0 .. numClients-1 for
// round of a run seeded seed, sorted: the same draw for a given (seed, round)
// on every run and from Python, C and Go (the core's sample_clients).
func SampleClients(numClients, perRound int, seed int64, round int) ([]int, error) {
	const op = "SampleClients"
	if perRound < 1 || perRound > numClients {
		return nil, newError(statusInvalidArgument, op, "perRound must be in [1, numClients = %d], got %d",
			numClients, perRound)
	}
	out := make([]C.int64_t, perRound)
	var msg *C.char
	st := C.pbgo_fed_sample_clients(C.int64_t(numClients), C.int64_t(perRound), C.int64_t(seed), C.int64_t(round),
		&out[0], &msg)
	if err := check(op, st, msg); err != nil {
		return nil, err
	}
	ids := make([]int, perRound)
	for i, c := range out {
		ids[i] = int(c)
	}
	return ids, nil
}
