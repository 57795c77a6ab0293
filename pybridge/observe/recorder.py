"""One rank's recorder: the trace events and the metrics of what the library and the
program did, and the step accounting both share.

The library's own places call the `on_*` methods (only when `state.REC` is set); the
program's spans, instants, scalars and steps come through `observe/__init__.py` (Python)
and `capi/observe.py` (C and Go). Events are kept as tuples and turned into Chrome Trace
Event JSON when the file is written (`flush`), so recording one costs a tuple and an
append. Tracks (Chrome's tid) are fixed: the program's calls, steps, buckets, and one
track per process group's collectives.
"""

import collections
import json
import os
import socket
import threading

from . import bandwidth, clock
from .metrics import Metrics, step_args
from .tracks import BACKWARD, BUCKETS, FIRST_COLLECTIVES, NAMES, PROGRAM, STEPS
FORMAT = 1  # otherData.pybridge.format: bumped when the files change incompatibly
# Args kept as a tuple whose first item says which, made into a dict only when written
# (chrome_events): recording an event costs a tuple, not a dict.
_COLLECTIVE_ARGS, _BUCKET_ARGS, _STEP_ARGS = "collective", "bucket", "step"
_now = clock.now_us
FLIGHT_ENTRIES = 2000  # collectives kept for a hang dump (torch's TORCH_FR_BUFFER_SIZE, in spirit)


class _Step:
    """What the step in progress has spent so far (µs)."""

    __slots__ = ("start", "data", "records", "exposed", "comm", "forward", "bwd_first", "bwd_last",
                 "buckets", "bucket_bytes")

    def __init__(self, start):
        self.start = start
        self.data = self.exposed = self.comm = self.forward = 0.0
        self.records = self.buckets = self.bucket_bytes = 0
        self.bwd_first = self.bwd_last = None


_BUCKET_NAMES = [f"bucket {i}" for i in range(64)]


def _bucket_name(index):
    return _BUCKET_NAMES[index] if index < 64 else f"bucket {index}"


class _Bucket:
    __slots__ = ("index", "nbytes", "hook", "launched", "done", "fut")

    def __init__(self, index, nbytes, hook, launched, fut):
        self.index, self.nbytes, self.hook, self.launched, self.done = index, nbytes, hook, launched, None
        self.fut = fut


def _collective_args(name, dur, args):
    _, uid, seq, nbytes, ranks, issued, synchronous = args
    out = {"group": uid, "seq": seq, "bytes": nbytes, "ranks": ranks, "issued_us": round(issued, 3),
           "sync": synchronous}
    if nbytes:
        secs = dur / 1e6
        out["algbw_GBps"] = round(bandwidth.algbw(nbytes, secs) / 1e9, 6)
        out["busbw_GBps"] = round(bandwidth.busbw(name, nbytes, secs, ranks) / 1e9, 6)
    return out


def _bucket_args(args):
    _, index, nbytes, hook, launched = args
    return {"bucket": index, "bytes": nbytes, "hook": hook, "launched_us": round(launched, 4)}


def _args(name, dur, args):
    """An event's args as written: tuples by kind (see _COLLECTIVE_ARGS), dicts rounded."""
    if type(args) is tuple:
        kind = args[0]
        if kind is _COLLECTIVE_ARGS:
            return _collective_args(name, dur, args)
        if kind is _BUCKET_ARGS:
            return _bucket_args(args)
        args = step_args(args[1:])
    return {k: round(v, 4) if type(v) is float else v for k, v in args.items()}


class Recorder:
    """Records for one rank into `out_dir` (None: metrics only, for a Prometheus endpoint);
    `every`: steps per metrics row (JSON lines, TensorBoard); `keep_steps`: the trace keeps
    the events of the latest this many steps (0: all)."""

    def __init__(self, out_dir, *, rank, world_size, local_rank=0, every=50, keep_steps=0):
        self.dir = out_dir
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.tracing = bool(out_dir)
        self.events = []
        self.keep_steps = keep_steps
        self._step_ends = []  # len(events) after each step kept (keep_steps)
        self.dropped_steps = 0  # steps whose events were dropped to keep memory bounded
        self._lock = threading.Lock()
        self._tracks = {}  # group uid -> collectives track
        self._labels = {}  # collectives track -> its name
        self._open_spans = {}  # span id -> (name, cat, start, args)
        self._next_span = 0
        self._last_done = {}  # group uid -> when its latest collective finished
        self._buckets = []
        self._inflight = []  # (flight entry, future) of asynchronous collectives not yet seen done
        self._bucket_done = 0.0
        self._waiting = 0  # > 0 inside a wait whose time already counts as exposed
        self.explicit_steps = False
        self._pending = None  # when a reducer iteration ended that is not yet a step (end_step)
        self.steps = 0
        self.clock_offset_us = 0.0  # this rank's clock minus rank 0's (comm/clocksync.py)
        self.clock_uncertainty_us = 0.0
        self.clock_synced = False
        self.anchor = clock.wall_anchor()
        self.metrics = Metrics(rank, world_size, out_dir, every)
        self.step = _Step(clock.now_us())
        self.flight = collections.deque(maxlen=FLIGHT_ENTRIES)  # [group, seq, op, issued, done]
        self.torch_ops = None  # torchops.TorchOps when libtorch's operations are profiled too
        self.metrics_address = None  # (host, port) of the Prometheus endpoint, when observe.start serves one
        self.closed = False

    # ---- tracks and raw events -------------------------------------------------------

    def collectives_track(self, g):
        """Group g's collectives track (named once, when first used)."""
        tid = self._tracks.get(g.uid)
        if tid is None:
            tid = self._tracks[g.uid] = FIRST_COLLECTIVES + len(self._tracks)
            self._labels[tid] = f"collectives ({g.describe()})"
        return tid

    def complete(self, tid, name, cat, start, dur, args=None):
        if self.tracing:
            self.events.append(("X", tid, name, cat, start, dur, args))

    def instant(self, name, cat="user", args=None):
        if self.tracing:
            self.events.append(("i", PROGRAM, name, cat, clock.now_us(), 0.0, args))

    # ---- the program's spans ---------------------------------------------------------

    def begin(self, name, cat="user", args=None):
        """Start a span; returns its id for end(). Spans may end on another thread."""
        self._settle()
        t = clock.now_us()
        with self._lock:
            self._next_span += 1
            sid = self._next_span
            self._open_spans[sid] = (name, cat, t, args)
        return sid

    def end(self, sid):
        """End span `sid`; returns its duration in µs (KeyError: no such open span)."""
        t = clock.now_us()
        with self._lock:
            name, cat, start, args = self._open_spans.pop(sid)
        self._account(cat, t - start)
        self.complete(PROGRAM, name, cat, start, t - start, args)
        return t - start

    def _account(self, cat, dur):
        """A span of the program's track counts in the step's breakdown as its category says
        (communication once: not again inside a wait that already counts)."""
        s = self.step
        if cat == "data":
            s.data += dur
        elif cat == "comm" and not self._waiting:
            s.exposed += dur
        elif cat == "forward":
            s.forward += dur

    # ---- the library's events --------------------------------------------------------

    def on_issue(self, g, seq, op):
        """Collective `seq` of group g is issued now: kept in the flight ring (flight.py)
        until it is done and after. Returns its entry for on_collective."""
        if self._pending is not None:
            self._settle()
        entry = [g, seq, op, _now(), None]  # the wall clock's time is made from the anchor when dumped
        self.flight.append(entry)
        return entry

    def on_collective(self, entry, done, synchronous):
        """The collective of `entry` (on_issue) finished at `done` (µs)."""
        g, seq, op, issued = entry[0], entry[1], entry[2], entry[3]
        entry[4] = done
        uid = g.uid
        prev = self._last_done.get(uid, 0.0)
        self._last_done[uid] = max(prev, done)
        start = max(issued, prev)  # the backend runs a group's collectives one after another
        name = op.name
        self.metrics.collective(name, op.nbytes, (done - issued) / 1e6, g.size)
        if synchronous and not self._waiting:
            self.step.exposed += done - issued
        if self.tracing:
            # the args as a tuple: made into a dict (bandwidths too) only when written, off the hot path
            args = (_COLLECTIVE_ARGS, uid, seq, op.nbytes, g.size, issued, synchronous)
            self.events.append(("X", self._tracks.get(uid) or self.collectives_track(g), name, "comm", start,
                                max(done - start, 0.0), args))

    def poll(self):
        """Look at what is in flight: an asynchronous collective or a bucket found done is
        stamped done now. Completion is seen here, at the program's next call into the
        library (the first gradient marked ready and each bucket's last, each collective
        issued, each wait), not by a callback: a future's callback runs Python on the
        backend's thread, whose hand-over of the interpreter lock cost about 0.2 ms per
        collective (bench/observe.py)."""
        inflight, buckets = self._inflight, self._buckets
        now = None
        if inflight and inflight[0][1].done():  # they finish in order
            now = clock.now_us()
            left = []
            for item in inflight:
                if item[1].done():
                    self.on_collective(item[0], now, False)
                else:
                    left.append(item)
            self._inflight = left
        for b in buckets:
            if b.done is None and b.fut.done():
                b.done = now = now or clock.now_us()

    def on_async(self, entry, fut):
        """The collective of `entry` goes on asynchronously as `fut` (poll() sees it end)."""
        self._inflight.append((entry, fut))

    def on_grad_ready(self):
        if self._pending is not None:
            self._settle()
        if self._buckets or self._inflight:
            self.poll()
        s = self.step
        t = clock.now_us()
        if s.bwd_first is None:
            s.bwd_first = t
        s.bwd_last = t

    def on_bucket_launched(self, index, nbytes, hook, fut):
        self._buckets.append(_Bucket(index, nbytes, hook, clock.now_us(), fut))

    def on_bucket_value(self, index):
        """The reducer has bucket `index`'s value (it waited for it): done by now at the latest."""
        now = None
        for b in self._buckets:
            if b.index == index and b.done is None:
                b.done = now = now or clock.now_us()

    def on_buckets_finished(self):
        """The reducer has every bucket's value: each bucket's time counts as communication,
        and its collectives are over."""
        self.poll()
        buckets, self._buckets = self._buckets, []
        s = self.step
        now = clock.now_us()
        for b in buckets:
            done = b.done if b.done is not None else now
            start = max(b.launched, self._bucket_done)
            self._bucket_done = max(self._bucket_done, done)
            s.comm += max(done - start, 0.0)
            s.buckets += 1
            s.bucket_bytes += b.nbytes
            self.metrics.bucket(b.nbytes, (done - b.launched) / 1e6)
            if self.tracing:
                self.events.append(("X", BUCKETS, _bucket_name(b.index), "comm", start, max(done - start, 0.0),
                                    (_BUCKET_ARGS, b.index, b.nbytes, b.hook, b.launched)))

    def wait_begin(self):
        self._settle()
        self.poll()
        self._waiting += 1
        return clock.now_us()

    def wait_end(self, start, name="reducer.wait"):
        self._waiting -= 1
        t = clock.now_us()
        self._account("comm", t - start)
        self.complete(PROGRAM, name, "comm", start, t - start)

    def on_loader(self, start, records):
        self._settle()
        t = clock.now_us()
        self.step.data += t - start
        self.step.records += records
        self.metrics.loader(records, (t - start) / 1e6)
        self.complete(PROGRAM, "loader.next", "data", start, t - start, {"records": records})

    def on_forward(self, start):
        self._settle()
        t = clock.now_us()
        self.step.forward += t - start
        self.complete(PROGRAM, "forward", "forward", start, t - start)

    # ---- steps ------------------------------------------------------------------------

    def end_step(self, explicit):
        """A step ends: at the program's call (explicit), or else at each reducer iteration's
        end. Once the program has ended a step itself, only its calls end steps.

        An iteration's end is held back (`_pending`) until the program does anything else
        the recorder sees (`_settle`): a program that ends its steps itself right after the
        reducer's wait then ends its first step once, not twice."""
        now = clock.now_us()
        if explicit:
            self.explicit_steps = True
            self._pending = None
            self._close_step(now)
        elif not self.explicit_steps:
            self._settle()
            self._pending = now

    def _settle(self):
        """A reducer iteration's end held back becomes the end of a step."""
        if self._pending is not None:
            t, self._pending = self._pending, None
            self._close_step(t)

    def _close_step(self, t):
        s, self.step = self.step, _Step(t)
        self.steps += 1
        dur = t - s.start
        backward = (s.bwd_last - s.bwd_first) if s.bwd_first is not None else 0.0
        compute = max(dur - s.data - s.exposed, 0.0)
        hidden = (1.0 - min(s.exposed, s.comm) / s.comm) if s.comm > 0 else None
        values = (self.steps, dur, s.data, compute, s.exposed, s.comm, s.forward, backward, s.buckets,
                  s.bucket_bytes, s.records, hidden)  # metrics.STEP_FIELDS
        if self.tracing:
            self.events.append(("X", STEPS, "step", "step", s.start, dur, (_STEP_ARGS,) + values))
            if s.bwd_first is not None:
                self.events.append(("X", BACKWARD, "backward (grads ready)", "compute", s.bwd_first,
                                    backward, None))
            if self.keep_steps:
                self._trim()
        self.metrics.step(self.steps, values)

    def _trim(self):
        """Keep the latest `keep_steps` steps' events: once twice as many are held, the older
        half goes (amortized: one cut per keep_steps steps), so a long run's trace stays
        bounded in memory and on disk, as a flight recorder's ring does."""
        ends = self._step_ends
        ends.append(len(self.events))
        keep = self.keep_steps
        if len(ends) > 2 * keep:
            cut = ends[-keep - 1]
            del self.events[:cut]
            self.dropped_steps += len(ends) - keep
            self._step_ends = [e - cut for e in ends[-keep:]]

    def scalar(self, name, value, step=None):
        if step is None:  # the step just ended counts, held back or not
            step = self.steps + (self._pending is not None)
        self.metrics.scalar(name, value, step)
        if self.tracing:
            self.events.append(("C", PROGRAM, name, "scalar", clock.now_us(), 0.0, {name: value}))

    # ---- files ------------------------------------------------------------------------

    def trace_path(self):
        return os.path.join(self.dir, f"rank{self.rank}.trace.json")

    def header(self):
        mono, wall = self.anchor
        return {"format": FORMAT, "rank": self.rank, "world_size": self.world_size,
                "local_rank": self.local_rank, "host": socket.gethostname(), "pid": os.getpid(),
                "clock": "CLOCK_MONOTONIC, microseconds", "clock_offset_us": self.clock_offset_us,
                "clock_uncertainty_us": self.clock_uncertainty_us, "clock_synced": self.clock_synced,
                "monotonic_at_wall_us": [mono, wall], "steps": self.steps, "dropped_steps": self.dropped_steps,
                "keep_steps": self.keep_steps}

    def chrome_events(self):
        """This rank's events as Chrome Trace Event dicts (pid = rank)."""
        pid = self.rank
        out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}},
               {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
        labels = {**NAMES, **self._labels}
        used = set()
        for ph, tid, name, cat, ts, dur, args in list(self.events):
            used.add(tid)
            e = {"ph": ph, "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": round(ts, 3)}
            if ph == "X":
                e["dur"] = round(dur, 3)
            elif ph == "i":
                e["s"] = "t"
            if args:
                e["args"] = _args(name, dur, args)
            out.append(e)
        for tid in sorted(used):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": labels.get(tid) or f"track {tid}"}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        return out

    def flush(self, final=False):
        """Write the trace file (whole, replacing the last) and flush the metrics files.
        final: the rank is finishing (finalize, exit, a hang): libtorch's operations, if
        profiled, are collected now (the profiler stops)."""
        self._settle()
        self.poll()
        self.metrics.flush()
        if not self.tracing:
            return None
        events = self.chrome_events()
        if self.torch_ops is not None and (final or self.torch_ops.events is not None):
            events += self.torch_ops.collect(self.rank)
        path = self.trace_path()
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                       "otherData": {"pybridge": self.header()}}, f)
        os.replace(tmp, path)
        return path

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.flush(final=True)
        finally:
            self.metrics.close()
