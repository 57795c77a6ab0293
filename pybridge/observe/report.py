"""The report over a traced run directory (`pybridge report DIR`, docs/observability.md):
where each rank's step time goes, the bandwidth the collectives reached, and which rank
holds the others back, and why.

`analyze(DIR)` merges the ranks' traces when `DIR/trace.json` is missing or older than a
rank file (merge.py puts every rank on rank 0's clock, which the straggler analysis needs)
and returns a plain, JSON-ready dict; `tables()` and `text()` turn it into tables for people.
Nothing here needs torch or matplotlib (charts.py draws).

The figures:
- per rank, the means of its steps' accounting (recorder.py `end_step`): compute, exposed
  communication and data wait in ms and as a share of the step; the mean share of the
  reducer's communication hidden behind compute; records per second;
- bus bandwidth per collective and message-size class (a power of two): the bytes of all
  the calls of the class over their summed durations, times nccl-tests' bus factor
  (bandwidth.py); and per bucket size of the reducer (as an all_reduce);
- stragglers: of each collective every rank of its group recorded (key: group, seq), the
  rank that issued it last kept the others waiting for the difference to the earliest
  rank; scores over windows of steps (a rank's median compute + data time against the
  fastest rank's, and against its own best window), and a verdict with its cause.
"""

import json
import os
import statistics

from ..errors import InvalidArgument
from . import bandwidth, merge, tracks
CAUSES = {"data": ("data_ms", "waiting for data"), "compute": ("compute_ms", "computing"),
          "communication": ("exposed_comm_ms", "in exposed communication")}
MIN_LATENESS_MS = 1.0  # a straggler must keep the others waiting at least this long ...
LATENESS_SHARE = 0.10  # ... and at least this share of the median step


# ---- loading --------------------------------------------------------------------------

def merged_trace(directory):
    """The path of `directory`'s merged trace, merging the rank files first when the merged
    file is missing or older than one of them. Raises InvalidArgument for a missing
    directory, no trace files or a corrupt one."""
    if not os.path.isdir(directory):
        raise InvalidArgument(f"{directory}: no such directory (give the directory a traced run wrote: "
                              "--trace DIR or PYBRIDGE_TRACE=DIR)")
    out = os.path.join(directory, merge.MERGED)
    files = merge.rank_files(directory)
    if not files and os.path.isfile(out):
        return out  # a merged trace on its own (the rank files were not kept)
    newest = max((os.path.getmtime(p) for p in files.values()), default=None)
    if newest is None or not os.path.isfile(out) or os.path.getmtime(out) < newest:
        try:
            merge.merge(directory)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            if isinstance(exc, InvalidArgument):
                raise
            raise InvalidArgument(f"a trace file in {directory} is corrupt (its events lack "
                                  f"{exc!s} or have the wrong type)") from None
        except OSError as exc:
            raise InvalidArgument(f"cannot write the merged trace into {directory}: {exc.strerror or exc}") from None
    return out


def load_merged(path):
    """(events, {rank: header}) of a merged trace file."""
    data = merge.load(path)
    events = data.get("traceEvents")
    info = data["otherData"]["pybridge"]
    if not isinstance(events, list) or not isinstance(info, dict):
        raise InvalidArgument(f"{path} is corrupt: no traceEvents list")
    headers = {int(r): h for r, h in (info.get("ranks") or {}).items()}
    return events, headers, info.get("merged") or {}


def _num(e, key, path):
    v = e.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidArgument(f"{path} is corrupt: event {e.get('name')!r} has {key}={v!r}, expected a number")
    return float(v)


def _split(events, path):
    """The events the report reads, checked: steps, buckets and collectives per rank."""
    steps, buckets, colls = {}, [], []
    for e in events:
        if not isinstance(e, dict):
            raise InvalidArgument(f"{path} is corrupt: an event is {type(e).__name__}, not an object")
        if e.get("ph") != "X":
            continue
        tid, args = e.get("tid"), e.get("args") or {}
        if not isinstance(args, dict):
            raise InvalidArgument(f"{path} is corrupt: event {e.get('name')!r} has args that are not an object")
        if tid == tracks.STEPS and e.get("name") == "step":
            step = {k: float(v) for k, v in args.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            for k in ("step", "step_us", "compute_us", "data_us", "exposed_comm_us"):
                if k not in step:
                    raise InvalidArgument(f"{path} is corrupt: a step event of rank {e.get('pid')} has no {k}")
            step["ts"], step["dur"] = _num(e, "ts", path), _num(e, "dur", path)
            steps.setdefault(e.get("pid"), []).append(step)
        elif tid == tracks.BUCKETS and e.get("cat") == "comm":
            buckets.append((e.get("pid"), int(_num(args, "bytes", path)), str(args.get("hook", "?")),
                            _num(e, "dur", path)))
        elif isinstance(tid, int) and tid >= tracks.FIRST_COLLECTIVES and e.get("cat") == "comm" and "seq" in args:
            colls.append({"rank": e.get("pid"), "op": e.get("name"), "group": args.get("group"),
                          "seq": args.get("seq"), "bytes": int(_num(args, "bytes", path)),
                          "ranks": int(_num(args, "ranks", path)), "issued_us": _num(args, "issued_us", path),
                          "ts": _num(e, "ts", path), "dur": _num(e, "dur", path)})
    for s in steps.values():
        s.sort(key=lambda x: x["step"])
    return steps, buckets, colls


# ---- the figures ------------------------------------------------------------------------

def _mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def _pct(part, whole):
    return 100.0 * part / whole if whole > 0 else 0.0


def per_rank(steps, ranks):
    rows = []
    for r in ranks:
        mine = steps.get(r, [])
        step = _mean([s["step_us"] for s in mine]) / 1e3
        comp = _mean([s["compute_us"] for s in mine]) / 1e3
        exp = _mean([s["exposed_comm_us"] for s in mine]) / 1e3
        data = _mean([s["data_us"] for s in mine]) / 1e3
        hidden = [s["hidden_share"] for s in mine if "hidden_share" in s]
        records = sum(s.get("records", 0.0) for s in mine)
        total_s = sum(s["step_us"] for s in mine) / 1e6
        rows.append({"rank": r, "steps": len(mine), "step_ms": step,
                     "step_median_ms": statistics.median([s["step_us"] for s in mine]) / 1e3 if mine else 0.0,
                     "compute_ms": comp, "compute_pct": _pct(comp, step),
                     "exposed_comm_ms": exp, "exposed_comm_pct": _pct(exp, step),
                     "data_ms": data, "data_pct": _pct(data, step),
                     "comm_ms": _mean([s.get("comm_us", 0.0) for s in mine]) / 1e3,
                     "hidden_share": _mean(hidden) if hidden else None,
                     "records": int(records), "records_per_s": records / total_s if records and total_s > 0 else None})
    return rows


def _last_arrivals(colls):
    """(group, seq) -> the moment the last rank of the group issued it, for the collectives
    every rank of their group recorded."""
    by_key = {}
    for c in colls:
        by_key.setdefault((str(c["group"]), c["seq"]), []).append(c)
    return {k: max(c["issued_us"] for c in calls) for k, calls in by_key.items() if len(calls) == calls[0]["ranks"]}


def bandwidth_table(colls):
    """Bus bandwidth per (op, ranks, size class) as nccl-tests defines it: the bytes of all
    the calls over their summed durations, times the op's bus factor. All ranks' calls count.
    A call's duration starts when the last rank of the group arrived (where every rank
    recorded it), as nccl-tests times a collective after a barrier: time spent waiting for a
    late rank is the straggler's, not the link's."""
    last = _last_arrivals(colls)
    acc = {}
    for c in colls:
        if c["bytes"] <= 0 or bandwidth.bus_factor(c["op"], c["ranks"]) == 0.0:
            continue  # a barrier moves no payload
        key = (c["op"], c["ranks"], bandwidth.size_bin(c["bytes"]))
        a = acc.setdefault(key, [0, 0, 0.0])
        a[0] += 1
        a[1] += c["bytes"]
        end = c["ts"] + c["dur"]
        start = max(c["ts"], last.get((str(c["group"]), c["seq"]), c["ts"]))
        a[2] += max(end - start, 0.0) / 1e6
    rows = []
    for (op, ranks, size), (count, nbytes, secs) in sorted(acc.items()):
        alg = bandwidth.algbw(nbytes, secs)
        rows.append({"op": op, "ranks": ranks, "size_class": size, "calls": count, "bytes": nbytes,
                     "seconds": secs, "mean_ms": secs / count * 1e3, "algbw_GBps": alg / 1e9,
                     "busbw_GBps": alg * bandwidth.bus_factor(op, ranks) / 1e9})
    return rows


def bucket_table(buckets, world):
    """Per bucket size and hook: the reducer's time per bucket (launch, or the previous
    bucket's end, to done) and its bandwidth as an all_reduce of the bucket's bytes."""
    acc = {}
    for _, nbytes, hook, dur in buckets:
        a = acc.setdefault((nbytes, hook), [0, 0.0])
        a[0] += 1
        a[1] += dur / 1e6
    rows = []
    for (nbytes, hook), (count, secs) in sorted(acc.items()):
        alg = bandwidth.algbw(nbytes * count, secs)
        rows.append({"bytes": nbytes, "hook": hook, "count": count, "mean_ms": secs / count * 1e3,
                     "algbw_GBps": alg / 1e9, "busbw_GBps": alg * bandwidth.bus_factor("all_reduce", world) / 1e9})
    return rows


def _windows(steps, ranks, window):
    """Medians of compute + data (ms) per rank over windows of `window` steps that every
    rank took; a trailing window shorter than half a window joins the one before."""
    common = None
    for r in ranks:
        nums = {int(s["step"]) for s in steps.get(r, [])}
        common = nums if common is None else common & nums
    common = sorted(common or ())
    chunks = [common[i:i + window] for i in range(0, len(common), window)]
    if len(chunks) > 1 and len(chunks[-1]) < (window + 1) // 2:
        tail = chunks.pop()
        chunks[-1] = chunks[-1] + tail
    own = {r: {int(s["step"]): (s["compute_us"] + s["data_us"]) / 1e3 for s in steps.get(r, [])} for r in ranks}
    return [{"steps": [c[0], c[-1]], "median_ms": {r: statistics.median(own[r][n] for n in c) for r in ranks}}
            for c in chunks]


def scores(steps, ranks, window):
    """Straggler scores in [0, 1] (1: not slow), in the spirit of NVIDIA's resiliency
    extension: relative = the fastest rank's median compute + data time over a window /
    this rank's; individual = this rank's best window median / its latest window median."""
    wins = _windows(steps, ranks, window)
    out = {r: {"relative_latest": None, "relative_min": None, "individual": None} for r in ranks}
    if not wins:
        return out, wins
    for w in wins:
        fastest = min(w["median_ms"].values())
        w["relative"] = {r: (fastest / m if m > 0 else 1.0) for r, m in w["median_ms"].items()}
    for r in ranks:
        rel = [w["relative"][r] for w in wins]
        latest = wins[-1]["median_ms"][r]
        best = min(w["median_ms"][r] for w in wins)
        out[r] = {"relative_latest": rel[-1], "relative_min": min(rel),
                  "individual": best / latest if latest > 0 else 1.0}
    return out, wins


def arrivals(colls, ranks):
    """Per rank: how often it issued a collective last of its group, and how long the
    earliest rank waited for it then. Only collectives all ranks of the group recorded;
    one that every rank issued at the same moment has no last rank."""
    by_key = {}
    for c in colls:
        by_key.setdefault((str(c["group"]), c["seq"]), {})[c["rank"]] = c
    stats = {r: {"last": 0, "lateness_ms": []} for r in ranks}
    compared = 0
    for calls in by_key.values():
        size = next(iter(calls.values()))["ranks"]
        if len(calls) < max(size, 2) or len(calls) != size:
            continue  # not every rank of the group recorded it (or a one-rank group)
        compared += 1
        issued = {r: c["issued_us"] for r, c in calls.items()}
        last = max(issued, key=lambda r: (issued[r], r))
        late = issued[last] - min(issued.values())
        if late <= 0:
            continue  # all issued at once: nobody was last
        s = stats.setdefault(last, {"last": 0, "lateness_ms": []})
        s["last"] += 1
        s["lateness_ms"].append(late / 1e3)
    return compared, stats


def _whole(what, x, least):
    if isinstance(x, bool) or not isinstance(x, int) or x < least:
        raise InvalidArgument(f"{what} must be a whole number >= {least}, got {x!r}")


def analyze(directory, window=20, skip=0):
    """The report of the run traced into `directory`, as a JSON-ready dict. `window`: steps
    per straggler-score window; `skip`: steps left out at the start (the first step holds
    the start-up: from init to the end of the first iteration)."""
    _whole("the straggler window (steps)", window, 1)
    _whole("the steps to skip", skip, 0)
    path = merged_trace(directory)
    events, headers, summary = load_merged(path)
    steps, buckets, colls = _split(events, path)
    first = {r: s[0] for r, s in steps.items() if s}
    steps = {r: [x for x in s if x["step"] > skip] for r, s in steps.items()}
    ranks = sorted(set(headers) | {r for r in steps if isinstance(r, int)})
    if not ranks:
        raise InvalidArgument(f"{path} holds no rank's events")
    world = max([int(h.get("world_size", 0) or 0) for h in headers.values()] + [len(ranks)])
    rows = per_rank(steps, ranks)
    all_steps = [s["step_us"] / 1e3 for r in ranks for s in steps.get(r, [])]
    median_step = statistics.median(all_steps) if all_steps else 0.0
    threshold = max(MIN_LATENESS_MS, LATENESS_SHARE * median_step)
    compared, arr = arrivals(colls, ranks)
    sc, wins = scores(steps, ranks, window)
    strag_rows = []
    for r in ranks:
        late = arr.get(r, {"last": 0, "lateness_ms": []})
        lat = late["lateness_ms"]
        strag_rows.append({"rank": r, "last": late["last"], "last_share": late["last"] / compared if compared else 0.0,
                           "lateness_total_ms": sum(lat), "lateness_mean_ms": _mean(lat),
                           "lateness_median_ms": statistics.median(lat) if lat else 0.0,
                           "relative_score_latest": sc[r]["relative_latest"], "relative_score_min": sc[r]["relative_min"],
                           "individual_score": sc[r]["individual"]})
    slow_start = None  # the first step, when it is far longer than the rest (start-up)
    if not skip and all_steps and first:
        r0, s0 = max(first.items(), key=lambda kv: kv[1]["step_us"])
        if s0["step"] == 1 and len(steps.get(r0, ())) > 2 and s0["step_us"] / 1e3 > 5 * median_step:
            slow_start = {"rank": r0, "step_ms": s0["step_us"] / 1e3, "times_median": s0["step_us"] / 1e3 / median_step}
    rep = {"directory": os.path.abspath(directory), "trace": path, "ranks": ranks, "world_size": world,
           "skipped_steps": skip, "slow_first_step": slow_start,
           "hosts": sorted({str(h.get("host", "?")) for h in headers.values()}),
           "clock": {"synced": summary.get("synced"), "uncertainty_us": summary.get("uncertainty_us"),
                     "end_spread_us": summary.get("end_spread_us")},
           "per_rank": rows, "bandwidth": bandwidth_table(colls), "buckets": bucket_table(buckets, world),
           "stragglers": {"collectives": compared, "window": window, "windows": wins,
                          "median_step_ms": median_step, "threshold_ms": threshold, "per_rank": strag_rows}}
    rep["verdict"] = verdict(rep)
    return rep


def verdict(rep):
    """Which rank holds the others back and why, or that none does."""
    st = rep["stragglers"]
    rows = st["per_rank"]
    out = {"straggler": None, "cause": None, "excess_ms": None, "text": ""}
    if len(rep["ranks"]) < 2:
        out["text"] = "no straggler: one rank only"
        return out
    if not st["collectives"]:
        out["text"] = "no straggler can be named: no collective was recorded by every rank of its group"
        return out
    worst = max(rows, key=lambda x: (x["last"], x["lateness_total_ms"]))
    share, late = worst["last_share"], worst["lateness_median_ms"]
    others_max = max((x["last"] for x in rows if x is not worst), default=0)
    if share <= 0.5 or worst["last"] <= others_max or late <= st["threshold_ms"]:
        why = (f"it is late by {late:.2f} ms (median), below the {st['threshold_ms']:.2f} ms that matters"
               if share > 0.5 else "no rank is last at more than half of them")
        out["text"] = (f"no straggler: the rank most often last is rank {worst['rank']}, at {100 * share:.0f}% of "
                       f"{st['collectives']} collectives; {why}")
        return out
    slow = worst["rank"]
    by_rank = {x["rank"]: x for x in rep["per_rank"]}
    others = [by_rank[r] for r in rep["ranks"] if r != slow]
    excess = {cause: by_rank[slow][key] - statistics.median(o[key] for o in others)
              for cause, (key, _) in CAUSES.items()}
    cause = max(excess, key=excess.get)
    head = (f"rank {slow} is the straggler: last to arrive at {100 * share:.0f}% of collectives "
            f"({worst['last']} of {st['collectives']}), {worst['lateness_mean_ms']:.1f} ms late on average")
    if excess[cause] <= 0:
        cause = None
        tail = "no single cause: it spends no more time per step on data, compute or communication than the others"
    else:
        tail = (f"it spends {excess[cause]:.1f} ms more per step {CAUSES[cause][1]} than the other ranks (median)")
    out.update(straggler=slow, cause=cause, excess_ms=excess, text=f"{head}: {tail}")
    return out


# ---- for people --------------------------------------------------------------------------

def _ranks(n):
    return f"{n} rank" if n == 1 else f"{n} ranks"


def _f(x, digits=2, none="-"):
    return none if x is None else f"{x:.{digits}f}"


def _bw(x):
    """GB/s with as many digits as a small figure needs."""
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.2f}" if x >= 1 else f"{x:.3g}"


def size_label(n):
    """Bytes for people: 4 KiB, 1.5 MiB, 512 B."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def tables(rep):
    """The report's tables: [(title, headers, rows of strings, note)], for text and HTML."""
    out = []
    rows = [[str(x["rank"]), str(x["steps"]), _f(x["step_ms"]), _f(x["step_median_ms"]),
             _f(x["compute_ms"]), _f(x["compute_pct"], 1), _f(x["exposed_comm_ms"]), _f(x["exposed_comm_pct"], 1),
             _f(x["data_ms"]), _f(x["data_pct"], 1),
             "-" if x["hidden_share"] is None else f"{100 * x['hidden_share']:.0f}%",
             _f(x["records_per_s"], 1)] for x in rep["per_rank"]]
    out.append(("Step time per rank (means per step)",
                ["rank", "steps", "step ms", "median ms", "compute ms", "%", "exposed comm ms", "%", "data ms", "%",
                 "comm hidden", "records/s"], rows,
                "compute = step - exposed communication - data wait; comm hidden: the mean share of the "
                "reducer's communication that overlapped compute"))
    rows = [[x["op"], str(x["ranks"]), size_label(x["size_class"]), str(x["calls"]), _f(x["mean_ms"], 3),
             _bw(x["algbw_GBps"]), _bw(x["busbw_GBps"])] for x in rep["bandwidth"]]
    out.append(("Collective bandwidth per message size (all ranks' calls)",
                ["op", "ranks", "size <=", "calls", "mean ms", "algbw GB/s", "busbw GB/s"], rows,
                "algbw = bytes / time, summed over the class's calls; busbw = algbw x the bus factor "
                "(nccl-tests: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1)"))
    rows = [[size_label(x["bytes"]), x["hook"], str(x["count"]), _f(x["mean_ms"], 3), _bw(x["algbw_GBps"]),
             _bw(x["busbw_GBps"])] for x in rep["buckets"]]
    out.append(("Reducer buckets per size", ["bucket", "hook", "count", "mean ms", "algbw GB/s", "busbw GB/s"], rows,
                f"busbw as an all_reduce of the bucket's bytes on {_ranks(rep['world_size'])}"))
    st = rep["stragglers"]
    rows = [[str(x["rank"]), str(x["last"]), f"{100 * x['last_share']:.0f}%", _f(x["lateness_total_ms"]),
             _f(x["lateness_mean_ms"]), _f(x["relative_score_latest"], 3), _f(x["relative_score_min"], 3),
             _f(x["individual_score"], 3)] for x in st["per_rank"]]
    out.append((f"Stragglers ({st['collectives']} collectives seen by every rank of their group; "
                f"windows of {st['window']} steps)",
                ["rank", "last", "last %", "late total ms", "late mean ms", "rel. score", "rel. min", "indiv. score"],
                rows, "late: how long the earliest rank waited for this one, at the collectives it was last to "
                "issue; scores in [0, 1], 1 = not slow (relative: the fastest rank's median compute + data / "
                "this rank's; individual: its best window / its latest)"))
    return out


def render_table(headers, rows):
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    left = {i for i, h in enumerate(headers) if h in ("op", "hook")}

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def headline(rep):
    steps = [x["steps"] for x in rep["per_rank"]]
    clock = rep["clock"]
    if clock.get("synced"):
        clk = f"clocks aligned at init within ±{clock.get('uncertainty_us') or 0:.0f} µs"
    else:
        clk = "clocks NOT aligned (recording started after init)"
    lo, hi = min(steps, default=0), max(steps, default=0)
    counted = f"{lo} steps" if lo == hi else f"{lo}-{hi} steps"
    if rep.get("skipped_steps"):
        counted += f" (after the first {rep['skipped_steps']})"
    return (f"{rep['directory']}: {_ranks(len(rep['ranks']))} on {', '.join(rep['hosts'])}, "
            f"{counted} per rank; {clk}")


def text(rep):
    """The tables and the verdict, as plain text."""
    parts = [headline(rep)]
    slow = rep.get("slow_first_step")
    if slow:
        parts.append(f"note: step 1 of rank {slow['rank']} took {slow['step_ms']:.1f} ms, "
                     f"{slow['times_median']:.0f}x the median step (start-up); --skip-steps 1 leaves it out")
    for title, headers, rows, note in tables(rep):
        parts.append(f"\n{title}\n" + (render_table(headers, rows) if rows else "(none recorded)") + f"\n  {note}")
    parts.append(f"\nVerdict: {rep['verdict']['text']}")
    return "\n".join(parts) + "\n"


def write_json(rep, path):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(rep, f, indent=1)
    os.replace(tmp, path)
    return path
