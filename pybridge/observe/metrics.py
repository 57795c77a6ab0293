"""One rank's metrics: totals since start (what Prometheus scrapes) and, every `every`
steps, one row averaged over those steps (JSON lines and TensorBoard scalars).

Collectives: count, bytes, seconds per op, and per message-size class (powers of two) for
bandwidth against size; algbw and busbw as nccl-tests defines them (bandwidth.py). Steps:
time split into data wait, compute and exposed communication, the reducer's communication
time and the share of it hidden behind compute. Loader: records and wait. The program's
scalars (loss, accuracy) at their steps.
"""

import json
import os
import time

from . import bandwidth
from .tbevents import EventWriter

# A step's breakdown as the recorder hands it over (a tuple, in this order); a dict only
# when read (step_args).
STEP_FIELDS = ("step", "step_us", "data_us", "compute_us", "exposed_comm_us", "comm_us", "forward_us",
               "backward_us", "buckets", "bucket_bytes", "records", "hidden_share")
_STEP_FIELDS = ("step_us", "data_us", "compute_us", "exposed_comm_us", "comm_us", "forward_us", "backward_us")
_TIMES = tuple((f, STEP_FIELDS.index(f)) for f in _STEP_FIELDS)  # summed into totals
_STEP, _STEP_US, _RECORDS, _HIDDEN = (STEP_FIELDS.index(f) for f in ("step", "step_us", "records", "hidden_share"))


def step_args(values):
    """A step's breakdown as a dict (hidden_share left out when there was no communication)."""
    out = dict(zip(STEP_FIELDS, values))
    if out["hidden_share"] is None:
        del out["hidden_share"]
    return out


def _add(table, key, nbytes, seconds, ranks):
    """One call into table[key] = [count, bytes, seconds, ranks]."""
    c = table.get(key)
    if c is None:
        c = table[key] = [0, 0, 0.0, ranks]
    c[0] += 1
    c[1] += nbytes
    c[2] += seconds


class Metrics:
    def __init__(self, rank, world_size, out_dir, every):
        self.rank, self.world_size = rank, world_size
        self.every = max(int(every), 1)
        self.collectives = {}  # op -> [count, bytes, seconds]
        self.by_size = {}  # (op, size class) -> [count, bytes, seconds]
        self.totals = dict.fromkeys(_STEP_FIELDS, 0.0)
        self.steps = 0
        self._last = None  # the latest step's breakdown (µs), as step() got it
        self.buckets = [0, 0, 0.0]  # count, bytes, seconds from launch to done
        self.loader_records, self.loader_seconds = 0, 0.0
        self.scalars = {}  # name -> (step, value), the latest
        self._window = []
        self._scalars_since_row = False  # a scalar was logged after the latest row
        self._scalar_log = []  # (step, name, value) not yet in TensorBoard
        self.jsonl = self.tb = None
        if out_dir:
            os.makedirs(os.path.join(out_dir, "metrics"), exist_ok=True)
            self.jsonl = open(os.path.join(out_dir, "metrics", f"rank{rank}.jsonl"), "a", buffering=1 << 16)
            self.tb = EventWriter(os.path.join(out_dir, "tensorboard", f"rank{rank}"))

    # ---- recording ----------------------------------------------------------------------

    def collective(self, op, nbytes, seconds, ranks):
        _add(self.collectives, op, nbytes, seconds, ranks)
        _add(self.by_size, (op, bandwidth.size_bin(nbytes)), nbytes, seconds, ranks)

    def bucket(self, nbytes, seconds):
        b = self.buckets
        b[0] += 1
        b[1] += nbytes
        b[2] += seconds

    def loader(self, records, seconds):
        self.loader_records += records
        self.loader_seconds += seconds

    def scalar(self, name, value, step):
        value = float(value)
        self.scalars[name] = (step, value)
        self._scalars_since_row = True
        if self.tb is not None:
            self._scalar_log.append((step, name, value))

    def step(self, n, values):
        """Step n ended; `values`: its breakdown, a tuple in STEP_FIELDS' order (what the
        recorder hands over) or a dict of those fields."""
        if type(values) is dict:
            values = tuple(values.get(f, n if f == "step" else None if f == "hidden_share" else 0)
                           for f in STEP_FIELDS)
        self.steps = n
        self._last = values
        totals = self.totals
        for k, i in _TIMES:
            totals[k] += values[i]
        if self.jsonl is not None:
            self._window.append(values)
            if len(self._window) >= self.every:
                self._row()

    @property
    def last_step(self):
        """The latest step's breakdown (µs) as a dict, or None before the first."""
        return None if self._last is None else step_args(self._last)

    # ---- reading ------------------------------------------------------------------------

    def collective_table(self):
        """{op: {count, bytes, seconds, algbw_GBps, busbw_GBps}} since start."""
        out = {}
        for op, (count, nbytes, secs, ranks) in sorted(self.collectives.items()):
            out[op] = {"count": count, "bytes": nbytes, "seconds": round(secs, 6),
                       "algbw_GBps": round(bandwidth.algbw(nbytes, secs) / 1e9, 6),
                       "busbw_GBps": round(bandwidth.busbw(op, nbytes, secs, ranks) / 1e9, 6)}
        return out

    def size_table(self):
        """[(op, size class, count, bytes, seconds, busbw_GBps)] since start."""
        return [(op, size, c, nb, round(s, 6), round(bandwidth.busbw(op, nb, s, r) / 1e9, 6))
                for (op, size), (c, nb, s, r) in sorted(self.by_size.items())]

    def _row(self):
        self._scalars_since_row = False
        window, self._window = self._window, []
        k = len(window)
        mean = {f: sum(w[i] for w in window) / k / 1000.0 for f, i in _TIMES}
        hidden = [w[_HIDDEN] for w in window if w[_HIDDEN] is not None]
        records = sum(w[_RECORDS] for w in window)
        secs = sum(w[_STEP_US] for w in window) / 1e6
        mean = {f: round(v, 4) for f, v in mean.items()}
        row = {"rank": self.rank, "step": window[-1][_STEP], "time": round(time.time(), 3), "steps": k,
               "step_ms": mean["step_us"], "data_ms": mean["data_us"], "compute_ms": mean["compute_us"],
               "exposed_comm_ms": mean["exposed_comm_us"], "comm_ms": mean["comm_us"],
               "forward_ms": mean["forward_us"], "backward_ms": mean["backward_us"],
               "hidden_share": round(sum(hidden) / len(hidden), 4) if hidden else None,
               "records_per_s": round(records / secs, 1) if secs > 0 else 0.0,
               "scalars": {name: v for name, (_, v) in self.scalars.items()},
               "collectives": self.collective_table()}
        self.jsonl.write(json.dumps(row, separators=(",", ":")) + "\n")
        if self.tb is not None:
            step = row["step"]
            values = {"step/ms": row["step_ms"], "step/data_ms": row["data_ms"],
                      "step/compute_ms": row["compute_ms"], "step/exposed_comm_ms": row["exposed_comm_ms"],
                      "step/comm_ms": row["comm_ms"], "loader/records_per_s": row["records_per_s"]}
            if row["hidden_share"] is not None:
                values["step/hidden_share"] = row["hidden_share"]
            for op, c in row["collectives"].items():
                values[f"busbw_GBps/{op}"] = c["busbw_GBps"]
            self.tb.scalars(step, values)
            self._flush_scalars()

    def _flush_scalars(self):
        log, self._scalar_log = self._scalar_log, []
        by_step = {}
        for step, name, value in log:
            by_step.setdefault(step, {})[name] = value
        for step, values in by_step.items():
            self.tb.scalars(step, values)

    def flush(self):
        if self.jsonl is not None:
            if self._window:
                self._row()
            elif self._scalars_since_row:  # logged after the latest row (an epoch's accuracy): a row of its own
                self._scalars_since_row = False
                self.jsonl.write(json.dumps({"rank": self.rank, "step": self.steps, "time": round(time.time(), 3),
                                             "steps": 0, "scalars": {n: v for n, (_, v) in self.scalars.items()},
                                             "collectives": self.collective_table()}, separators=(",", ":")) + "\n")
            self.jsonl.flush()
        if self.tb is not None:
            self._flush_scalars()
            self.tb.flush()

    def close(self):
        self.flush()
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
