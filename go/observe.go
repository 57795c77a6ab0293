package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Span categories: where a span's time counts in a step's breakdown (the trace's
// steps track and the metrics rows). CatData is waiting for data, CatComm exposed
// communication, CatForward the forward pass; the others count as compute.
const (
	CatUser       = "user"
	CatCompute    = "compute"
	CatForward    = "forward"
	CatData       = "data"
	CatComm       = "comm"
	CatCheckpoint = "checkpoint"
	CatElastic    = "elastic"
)

// observing caches whether this process records, so that a span, an instant or a
// scalar costs one atomic load and no cgo call when it does not. Recording starts
// at a world's creation (Init, ElasticInit, ElasticState.Reset) or at StartObserve,
// which refresh it, and goes on until the process exits.
var observing atomic.Bool

// observeErr is the first error a call without an error result (StartSpan,
// Span.End, Instant, LogScalar) met; FlushObserve returns and clears it.
var observeErr struct {
	sync.Mutex
	err error
}

func keepObserveErr(err error) {
	if err == nil {
		return
	}
	observeErr.Lock()
	if observeErr.err == nil {
		observeErr.err = err
	}
	observeErr.Unlock()
}

// refreshObserving asks the library whether it records now. It is called where
// recording may have started, never on a path that would start the library.
func refreshObserving() {
	var on C.int
	if C.pbgo_observe_enabled(&on, nil) == statusOK {
		observing.Store(on != 0)
	}
}

// StartObserve records this process: Chrome trace and metrics files into traceDir
// (created if missing; "" for none): traceDir/rank<R>.trace.json,
// traceDir/metrics/rank<R>.jsonl and traceDir/tensorboard/rank<R>/; and/or a
// Prometheus endpoint on loopback port metricsPort + the local rank (0: any free
// port; negative: none). Call it before Init: recording starts there, with this
// rank's clock measured against rank 0's so that the ranks' traces merge on one
// time line. Called after Init, it records from now on, clocks not aligned.
// Setting PYBRIDGE_TRACE=DIR (or PYBRIDGE_METRICS_PORT) in the environment does the
// same without a call. The files are written at Group.Close, at FlushObserve and
// when the process exits.
//
// It fails with ErrInvalidArgument when there is neither a directory nor a port, or
// the port is above 65535.
func StartObserve(traceDir string, metricsPort int) error {
	const op = "StartObserve"
	if traceDir == "" && metricsPort < 0 {
		return newError(statusInvalidArgument, op, "nothing to record into: traceDir is empty and metricsPort "+
			"is negative; give a trace directory, a metrics port (0: any free port) or both")
	}
	port, err := toInt32(op, "metrics port", metricsPort)
	if err != nil {
		return err
	}
	dir := cStringOrNil(traceDir)
	defer C.free(unsafe.Pointer(dir))
	var msg *C.char
	if err := check(op, C.pbgo_observe_start(dir, C.int(port), &msg), msg); err != nil {
		return err
	}
	refreshObserving()
	return nil
}

// Observing reports whether this process records, as of the latest Init,
// ElasticInit, ElasticState.Reset or StartObserve. While it is false the calls
// below return at once, without calling the library.
func Observing() bool { return observing.Load() }

// FlushObserve writes the trace and metrics files now. It returns the first error
// a call of this file without an error result (StartSpan, Span.End, Instant,
// LogScalar, LogScalarAt) met since the last FlushObserve, such as
// ErrInvalidArgument for an unknown category or a span ended twice, or else the
// flush's own error (ErrIO: a file could not be written). Not recording, it writes
// nothing.
func FlushObserve() error {
	const op = "FlushObserve"
	var err error
	if observing.Load() {
		var msg *C.char
		err = check(op, C.pbgo_observe_flush(&msg), msg)
	}
	observeErr.Lock()
	kept := observeErr.err
	observeErr.err = nil
	observeErr.Unlock()
	if kept != nil {
		return kept
	}
	return err
}

// Span is one of the program's spans on the trace's program track, from StartSpan
// to End. The zero Span (what StartSpan returns when not recording) ends as a
// no-op. A span may end on another goroutine than the one that started it.
type Span struct {
	id int64
}

// StartSpan begins a span of category CatUser.
func StartSpan(name string) Span { return StartSpanCat(name, CatUser) }

// StartSpanCat begins a span of the given category (CatUser, CatCompute,
// CatForward, CatData, CatComm, ...); End it when what it measures is done:
//
//	sp := pybridge.StartSpanCat("forward", pybridge.CatForward)
//	out := model.Forward(x)
//	sp.End()
//
// Not recording, it returns the zero Span at the cost of one atomic load. An
// empty name or an unknown category is not recorded; FlushObserve reports it.
func StartSpanCat(name, category string) Span {
	if !observing.Load() {
		return Span{}
	}
	const op = "StartSpan"
	cname, ccat := C.CString(name), C.CString(category)
	defer C.free(unsafe.Pointer(cname))
	defer C.free(unsafe.Pointer(ccat))
	var id C.int64_t
	var msg *C.char
	if err := check(op, C.pbgo_span_begin(cname, ccat, &id, &msg), msg); err != nil {
		keepObserveErr(err)
		return Span{}
	}
	return Span{id: int64(id)}
}

// End ends the span. Ending the zero Span does nothing; ending a span twice is an
// error that FlushObserve reports.
func (s Span) End() {
	if s.id == 0 {
		return
	}
	var msg *C.char
	keepObserveErr(check("Span.End", C.pbgo_span_end(C.int64_t(s.id), &msg), msg))
}

// WithSpan runs fn(ctx) inside a span named name (CatUser) and returns fn's error.
// The span ends when fn returns, panics included.
func WithSpan(ctx context.Context, name string, fn func(context.Context) error) error {
	sp := StartSpan(name)
	defer sp.End()
	return fn(ctx)
}

// Instant marks a moment on the program's track (category CatUser).
func Instant(name string) {
	if !observing.Load() {
		return
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var msg *C.char
	keepObserveErr(check("Instant", C.pbgo_instant(cname, nil, &msg), msg))
}

// LogScalar logs the program's scalar (a loss, an accuracy) at the current step:
// a counter in the trace, the metrics rows, TensorBoard and Prometheus.
func LogScalar(name string, v float64) { logScalar("LogScalar", name, v, -1) }

// LogScalarAt logs the program's scalar at the given step (a negative step is the
// current one, as LogScalar).
func LogScalarAt(name string, v float64, step int64) { logScalar("LogScalarAt", name, v, step) }

func logScalar(op, name string, v float64, step int64) {
	if !observing.Load() {
		return
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var msg *C.char
	keepObserveErr(check(op, C.pbgo_log_scalar(cname, C.double(v), C.int64_t(step), &msg), msg))
}

// StepEnd ends the current step and returns the number of steps ended so far.
// Without it each Reducer iteration (Reducer.Wait) ends a step; after the first
// StepEnd only StepEnd does (the iterations before it stay counted; a Wait just
// before the first StepEnd, with nothing recorded in between, ends the same
// step, not one more). Not recording, it returns 0 and nil.
func StepEnd() (int64, error) {
	if !observing.Load() {
		return 0, nil
	}
	var n C.int64_t
	var msg *C.char
	if err := check("StepEnd", C.pbgo_step_end(&n, &msg), msg); err != nil {
		return 0, err
	}
	return int64(n), nil
}
