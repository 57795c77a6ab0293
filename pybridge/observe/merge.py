"""Merge the ranks' trace files of one run into one trace: one process per rank, every
timestamp moved onto rank 0's clock (minus the offset each rank measured at init), the
earliest event at 0.

How well the clocks agree is said twice: by the offsets' own bound (half the best round
trip, clocksync.py), and by the run itself: every rank leaves a synchronous collective at
nearly the same moment (none can finish before the last arrives), so the spread of the
ranks' end times of one collective bounds the error from above (it also holds the
collective's own skew, so it is a pessimistic figure).
"""

import glob
import json
import os
import re
import statistics

from ..errors import InvalidArgument

_RANK_FILE = re.compile(r"rank(\d+)\.trace\.json$")
MERGED = "trace.json"


def rank_files(directory):
    """{rank: path} of the per-rank trace files in `directory`."""
    found = {}
    for path in glob.glob(os.path.join(directory, "rank*.trace.json")):
        m = _RANK_FILE.search(os.path.basename(path))
        if m:
            found[int(m.group(1))] = path
    return dict(sorted(found.items()))


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise InvalidArgument(f"cannot read trace file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InvalidArgument(f"trace file {path} is not JSON (cut short by a crash?): {exc}") from None
    if not isinstance(data, dict) or "pybridge" not in data.get("otherData", {}):
        raise InvalidArgument(f"{path} is not a pybridge trace file (no otherData.pybridge header)")
    return data


def merge(directory, out=None):
    """Merge `directory`'s rank files into `out` (default directory/trace.json). Returns a
    summary: ranks, events, output path, per-rank offsets and the clock agreement."""
    files = rank_files(directory)
    if not files:
        raise InvalidArgument(f"no trace files (rank<N>.trace.json) in {directory}: was the run started with "
                              "--trace DIR or PYBRIDGE_TRACE=DIR, and did its ranks reach init?")
    headers, events = {}, []
    for rank, path in files.items():
        data = load(path)
        h = data["otherData"]["pybridge"]
        headers[rank] = h
        shift = float(h.get("clock_offset_us", 0.0))
        for e in data["traceEvents"]:
            if "ts" in e:
                e["ts"] = e["ts"] - shift
                _shift_args(e, shift)
            events.append(e)
    origin = min((e["ts"] for e in events if "ts" in e), default=0.0)
    for e in events:
        if "ts" in e:
            e["ts"] = round(e["ts"] - origin, 3)
            _shift_args(e, origin)
    agreement = _agreement(events)
    summary = {"ranks": sorted(files), "events": len(events), "origin_us": origin,
               "offsets_us": {r: h.get("clock_offset_us", 0.0) for r, h in headers.items()},
               "uncertainty_us": max((h.get("clock_uncertainty_us", 0.0) for h in headers.values()), default=0.0),
               "synced": all(h.get("clock_synced", False) for h in headers.values()),
               "hosts": sorted({h.get("host", "?") for h in headers.values()}),
               **agreement}
    out = out or os.path.join(directory, MERGED)
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                   "otherData": {"pybridge": {"merged": summary, "ranks": headers}}}, f)
    os.replace(tmp, out)
    summary["path"] = out
    return summary


_MOMENTS = ("issued_us", "launched_us")  # args that are moments on the rank's clock, not durations


def _shift_args(e, by):
    a = e.get("args")
    if a:
        for k in _MOMENTS:
            if k in a:
                a[k] = round(a[k] - by, 3)


def _agreement(events):
    """The spread of the ranks' end times of each synchronous collective (µs): median and
    90th percentile over the collectives every rank recorded."""
    ends = {}
    ranks = set()
    for e in events:
        a = e.get("args")
        if e.get("ph") == "X" and e.get("cat") == "comm" and a and a.get("sync") and "seq" in a:
            ends.setdefault((a["group"], a["seq"]), {})[e["pid"]] = e["ts"] + e["dur"]
            ranks.add(e["pid"])
    spreads = sorted(max(v.values()) - min(v.values()) for v in ends.values() if len(v) == len(ranks) > 1)
    if not spreads:
        return {"end_spread_us": None}
    p90 = spreads[min(len(spreads) - 1, int(0.9 * len(spreads)))]
    return {"end_spread_us": {"median": round(statistics.median(spreads), 3), "p90": round(p90, 3),
                              "collectives": len(spreads)}}


def describe(summary):
    """One line for people: where the merged trace is and how well its clocks agree."""
    spread = summary.get("end_spread_us")
    agree = (f"synchronous collectives end within {spread['median']:.0f} µs of each other across ranks "
             f"(median of {spread['collectives']}, p90 {spread['p90']:.0f} µs)") if spread else \
        "no synchronous collective to compare clocks by"
    how = (f"clock offsets measured at init (within ±{summary['uncertainty_us']:.0f} µs)" if summary["synced"]
           else "clocks NOT aligned (recording started after init)")
    return (f"trace: {summary['path']} ({len(summary['ranks'])} ranks, {summary['events']} events); "
            f"{how}; {agree}")
