package pybridge

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Why this file exists: a goroutine that spends nearly all its time in
// back-to-back blocking cgo calls (a training loop issuing collectives) never
// passes through the Go scheduler, so its P's scheduling tick stops moving.
// Once that tick is 10 ms old, sysmon treats the goroutine as one that must be
// preempted. The runtime this was measured with (go1.27) does not preempt a
// goroutine in a syscall (older ones did, once the call returned), so instead
// sysmon takes its P away during every following cgo call, polls every 20 us
// to do so, hands the P to another thread (waking it) and is woken again when
// the call returns. Measured on a 1-element AllReduce (2 ranks, gloo, 2 cores):
// a P retake on every call, two extra thread wake-ups and about 140 us per
// call, 1.5x the time of the same call from C or Python.
//
// Yielding every few milliseconds advances the tick, so sysmon never sees the
// goroutine as overdue and leaves its P alone; the cost is one Gosched per
// interval, not per call.

// yieldEvery is half the runtime's 10 ms preemption threshold, so that a yield
// falls in every such window unless a single call lasts milliseconds itself
// (then one retake per call costs little). On a goroutine locked to its
// thread a yield costs two thread switches, hence not much more often.
const yieldEvery = 5 * time.Millisecond

var (
	clockStart = time.Now()
	lastYield  atomic.Int64 // monotonic nanoseconds since clockStart
)

// paceCgo is called after every library call (by check). It yields the
// processor when no call has done so for yieldEvery.
func paceCgo() {
	if yieldDue(int64(time.Since(clockStart))) {
		runtime.Gosched()
	}
}

// yieldDue reports whether a yield is due at now (nanoseconds since
// clockStart) and, if so, records it, so that of concurrent callers one yields.
func yieldDue(now int64) bool {
	last := lastYield.Load()
	return now-last >= int64(yieldEvery) && lastYield.CompareAndSwap(last, now)
}
