"""Collectives benchmark: 1-element allreduce latency and allreduce/broadcast bandwidth
from 1 KiB to 64 MiB, 2 ranks on gloo, three ways in one run:
raw torch.distributed from Python, pybridge from Python, pybridge from Go (C ABI).

    python bench/collectives.py [--quick] [--only latency|bandwidth|modes]      (make bench runs it)

The modes case (--only modes) times pybridge alone from Python in three modes of
docs/failures.md, launched in turns: the hang watchdog off (PYBRIDGE_WATCHDOG=0), the
default (watchdog on), and checked mode (PYBRIDGE_CHECKED=1): 1-element allreduce
latency and 16 MiB allreduce.

Each implementation runs as a program would, alone and continuously: the Python ranks
(torch.distributed and pybridge, alternating sample by sample) and the Go ranks are
launched in turn, Python first in odd runs and Go first in even ones: 3 x --runs times
each for the latency case, then --runs times each for the bandwidth cases.

Every call is timed, and each row is computed from the median call: latency takes 12
samples of 500 calls per launch (its rows add the 99th percentile call and the median
over samples of the mean call), bandwidth 4 samples of 40-500 calls per size. On a
shared machine 1-2% of calls stall for milliseconds, whichever program makes them, and
a mean moves with how many stalls it happens to catch; the median call does not.
Every rank allocates one buffer per case and reuses it, as a training loop does.
Prints a table of times and ratios and writes bench/results/collectives.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, human_bytes, launch, save, table  # noqa: E402

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB ... 64 MiB
GO_BIN = os.path.join(ROOT, "build", "bench_collectives_go")
KINDS = ("latency", "bandwidth", "modes")
MODES = {"watchdog off": {"PYBRIDGE_WATCHDOG": "0"}, "default": {},
         "checked": {"PYBRIDGE_CHECKED": "1"}}


def iterations(nbytes):
    """Calls per bandwidth sample: deterministic per size, so every rank runs the same
    number of collectives, and at least 40: single calls of one size spread by +-30%
    here, so a large size needs a few hundred calls over its launches for a median
    within a few percent."""
    return max(40, min(500, (256 << 20) // nbytes))


def plan(quick, only=None):
    """(kind, op, bytes, calls per sample, samples per launch) for each case."""
    sizes = SIZES[::2] if quick else SIZES
    if only == "modes":
        return [("latency", "allreduce", 4, 100, 3) if quick else ("latency", "allreduce", 4, 500, 12),
                ("bandwidth", "allreduce", 16 << 20, 10 if quick else 40, 1 if quick else 4)]
    cases = [("latency", "allreduce", 4, 100, 3) if quick else ("latency", "allreduce", 4, 500, 12)]
    for op in ("allreduce", "broadcast"):
        cases += [("bandwidth", op, n, max(2, iterations(n) // (4 if quick else 1)), 1 if quick else 4)
                  for n in sizes]
    return [c for c in cases if only is None or c[0] == only]


def worker(cases, out_path, impls=("torch", "pybridge-py")):
    """One rank: time raw torch.distributed and pybridge, alternating sample by sample."""
    import torch
    import torch.distributed as dist

    import pybridge

    pybridge.init(backend="gloo", timeout=120)
    raw = {"allreduce": lambda t: dist.all_reduce(t), "broadcast": lambda t: dist.broadcast(t, 0)}
    bridged = {"allreduce": lambda t: pybridge.all_reduce(t), "broadcast": lambda t: pybridge.broadcast(t, 0)}
    clock = time.perf_counter
    results, buffers = {}, {}  # one buffer per case, reused by every sample (as in the Go ranks)
    for sample in range(max(c[4] for c in cases)):
        for case, (kind, op, nbytes, iters, samples) in enumerate(cases):
            if sample >= samples:
                continue
            if case not in buffers:
                buffers[case] = torch.empty(nbytes // 4)
            t = buffers[case]
            for impl, fns in (("torch", raw), ("pybridge-py", bridged)):
                if impl not in impls:
                    continue
                t.fill_(1)
                fn = fns[op]
                for _ in range(max(1, iters // 10)):  # warm-up
                    fn(t)
                dist.barrier()
                calls = [0.0] * iters
                for i in range(iters):
                    start = clock()
                    fn(t)
                    calls[i] = clock() - start
                results.setdefault(f"{impl}|{op}|{nbytes}", []).append(calls)
    if pybridge.rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    pybridge.finalize()


def build_go():
    subprocess.run(["go", "build", "-o", GO_BIN, "."], check=True,
                   cwd=os.path.join(ROOT, "bench", "collectives_go"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and iterations (a smoke run)")
    parser.add_argument("--runs", type=int, default=4,
                        help="times each implementation's ranks are started for the bandwidth cases (default 4); "
                             "the latency case, whose launches are short, gets three times as many")
    parser.add_argument("--only", choices=KINDS, help="run only these cases")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, not {args.runs}")
    if args.worker:
        impls = ("pybridge-py",) if args.only == "modes" else ("torch", "pybridge-py")
        return worker(plan(args.quick, args.only), args.worker, impls)
    if args.only == "modes":
        return report_modes(plan(args.quick, "modes"), run_modes(args.runs, args.quick), args.quick)

    build_go()
    samples = {}
    for kind in ("latency", "bandwidth") if args.only is None else (args.only,):
        runs = args.runs * (3 if kind == "latency" else 1)
        launch_in_turns(plan(args.quick, kind), kind, runs, args.quick, samples)
    report(plan(args.quick, args.only), samples, args.quick, args.only)
    if args.only is None:
        report_modes(plan(args.quick, "modes"), run_modes(args.runs, args.quick), args.quick)


def run_modes(runs, quick):
    """Launch the pybridge Python ranks in each mode, `runs` times each, in turns."""
    tmp = os.path.join(ROOT, "build", "bench-collectives-modes.json")
    cmd = [sys.executable, __file__, "--worker", tmp, "--only", "modes"] + (["--quick"] if quick else [])
    samples = {mode: {} for mode in MODES}
    order = list(MODES)
    for run in range(runs):
        for mode in order if run % 2 == 0 else order[::-1]:
            print(f"modes run {run + 1}/{runs}: {mode}...", flush=True)
            launch(cmd, 2, 900, extra_env=MODES[mode])
            merge(samples[mode], tmp)
    return samples


def report_modes(cases, samples, quick):
    """Rows: latency (median, p99) and 16 MiB bandwidth per mode; ratios against the
    watchdog off, the mode with no bookkeeping at all."""
    rows, records = [], []
    for kind, op, nbytes, *_ in cases:
        calls = {m: [c for sample in samples[m][f"pybridge-py|{op}|{nbytes}"] for c in sample] for m in MODES}
        median = {m: statistics.median(calls[m]) for m in MODES}
        if kind == "latency":
            p99 = {m: statistics.quantiles(calls[m], n=100)[98] for m in MODES}
            for what, t in (("median", median), ("p99", p99)):
                rows.append([f"{op} 1 element, {what}", *(f"{t[m] * 1e6:.1f} us" for m in MODES),
                             *(f"{t[m] / t['watchdog off']:.3f}" for m in list(MODES)[1:])])
        else:
            rows.append([f"{op} {human_bytes(nbytes)}", *(f"{nbytes / median[m] / 1e9:.3f} GB/s" for m in MODES),
                         *(f"{median[m] / median['watchdog off']:.3f}" for m in list(MODES)[1:])])
        records.append({"kind": kind, "op": op, "bytes": nbytes, "calls": {m: len(calls[m]) for m in MODES},
                        "seconds_median": median})
    print()
    print("pybridge from Python, 2 ranks, gloo, loopback, by mode (docs/failures.md). Time ratio to")
    print("'watchdog off' (lower is better): default = watchdog on.")
    print(table(["case", *MODES, "ratio default", "ratio checked"], rows))
    if not quick:
        print(f"\nwrote {save('collectives_modes', {'results': records})}")


def launch_in_turns(cases, kind, runs, quick, samples):
    """Start the Python ranks and the Go ranks `runs` times each, alternating which
    goes first, and add rank 0's samples to `samples`."""
    tmp = os.path.join(ROOT, "build", "bench-collectives.json")
    flags = (["--quick"] if quick else []) + ["--only", kind]
    programs = [("Python ranks (torch.distributed and pybridge)", [sys.executable, __file__, "--worker", tmp] + flags),
                ("Go ranks (pybridge through the C ABI)", [GO_BIN, tmp, json.dumps(cases)])]
    for run in range(runs):
        for what, cmd in programs if run % 2 == 0 else programs[::-1]:
            print(f"{kind} run {run + 1}/{runs}: {what}...", flush=True)
            launch(cmd, 2, 900)
            merge(samples, tmp)


def merge(samples, path):
    with open(path) as f:
        for key, values in json.load(f).items():
            samples.setdefault(key, []).extend(values)


def report(cases, samples, quick, only=None):
    impls = ("torch", "pybridge-py", "pybridge-go", "pybridge-go-tensor")
    rows, records = [], []
    for kind, op, nbytes, *_ in cases:
        runs = {i: samples[f"{i}|{op}|{nbytes}"] for i in impls}
        calls = {i: [c for sample in runs[i] for c in sample] for i in impls}
        median = {i: statistics.median(calls[i]) for i in impls}
        if kind == "latency":
            stats = {"median": median,
                     # the median over samples of the sample's mean call, stalls included
                     "mean": {i: statistics.median(statistics.fmean(s) for s in runs[i]) for i in impls},
                     "p99": {i: statistics.quantiles(calls[i], n=100)[98] for i in impls}}
            for what, t in stats.items():
                ratio = {i: t[i] / t["torch"] for i in impls}  # time ratio: lower is better
                rows.append([f"{op} 1 element, {what}", *(f"{t[i] * 1e6:.1f} us" for i in impls),
                             *(f"{ratio[i]:.3f}" for i in impls[1:])])
            records.append({"kind": kind, "op": op, "bytes": nbytes, "calls": len(calls["torch"]),
                            **{f"seconds_{what}": t for what, t in stats.items()},
                            "ratio_py": median["pybridge-py"] / median["torch"],
                            "ratio_go": median["pybridge-go"] / median["torch"],
                            "ratio_go_tensor": median["pybridge-go-tensor"] / median["torch"]})
        else:
            ratio = {i: median["torch"] / median[i] for i in impls}  # bandwidth ratio: higher is better
            rows.append([f"{op} {human_bytes(nbytes)}", *(f"{nbytes / median[i] / 1e9:.3f} GB/s" for i in impls),
                         *(f"{ratio[i]:.3f}" for i in impls[1:])])
            records.append({"kind": kind, "op": op, "bytes": nbytes, "seconds_median": median,
                            "ratio_py": ratio["pybridge-py"], "ratio_go": ratio["pybridge-go"],
                            "ratio_go_tensor": ratio["pybridge-go-tensor"]})
    headers = ["case", "torch.distributed", "pybridge (Python)", "pybridge (Go)", "pybridge (Go, Tensor)",
               "ratio Py", "ratio Go", "ratio Go Tensor"]
    print()
    print("2 ranks, gloo, loopback. Latency rows: time per call, the median and 99th percentile (p99) of")
    print("every timed call and the median over samples of the mean call; ratio = pybridge / torch")
    print("(goal <= 1.05 on the median).")
    print("Bandwidth rows: bytes / median time per call, ratio = pybridge / torch (goal >= 0.97 at 16 MiB).")
    print(table(headers, rows))
    if only or quick:  # a partial or smoke run prints its table; bench/results keeps full runs only
        return
    path = save("collectives", {"results": records})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
