"""Collectives benchmark: 1-element allreduce latency and allreduce/broadcast bandwidth
from 1 KiB to 64 MiB, 2 ranks on gloo, three ways in one run:
raw torch.distributed from Python, pybridge from Python, pybridge from Go (C ABI).

    python bench/collectives.py [--quick] [--only latency|bandwidth]      (make bench runs it)

Each implementation runs as a program would, alone and continuously: the Python ranks
(torch.distributed and pybridge, alternating sample by sample) and the Go ranks are
launched in turn, --runs times each, Python first in odd runs and Go first in even ones.
Each figure is the median over all samples; latency takes 12 samples of 500 calls per
launch, since on a shared machine noise comes in bursts and a median over many short
samples is steadier than one over a few long ones. Prints a table of times and ratios
and writes bench/results/collectives.json.
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


def iterations(nbytes):
    """Deterministic per size, so every rank runs the same number of collectives."""
    return max(3, min(2000, (48 << 20) // nbytes))


def plan(quick, only=None):
    """(kind, op, bytes, calls per sample, samples per launch) for each case."""
    sizes = SIZES[::2] if quick else SIZES
    cases = [("latency", "allreduce", 4, 100, 3) if quick else ("latency", "allreduce", 4, 500, 12)]
    for op in ("allreduce", "broadcast"):
        cases += [("bandwidth", op, n, max(2, iterations(n) // (4 if quick else 1)), 1 if quick else 2)
                  for n in sizes]
    return [c for c in cases if only is None or c[0] == only]


def worker(cases, out_path):
    """One rank: time raw torch.distributed and pybridge, alternating sample by sample."""
    import torch
    import torch.distributed as dist

    import pybridge

    pybridge.init(backend="gloo", timeout=120)
    raw = {"allreduce": lambda t: dist.all_reduce(t), "broadcast": lambda t: dist.broadcast(t, 0)}
    bridged = {"allreduce": lambda t: pybridge.all_reduce(t), "broadcast": lambda t: pybridge.broadcast(t, 0)}
    results = {}
    for sample in range(max(c[4] for c in cases)):
        for kind, op, nbytes, iters, samples in cases:
            if sample >= samples:
                continue
            t = torch.ones(nbytes // 4)
            for impl, fns in (("torch", raw), ("pybridge-py", bridged)):
                fn = fns[op]
                for _ in range(max(1, iters // 10)):  # warm-up
                    fn(t)
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    fn(t)
                elapsed = (time.perf_counter() - start) / iters
                results.setdefault(f"{impl}|{op}|{nbytes}", []).append(elapsed)
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
    parser.add_argument("--runs", type=int, default=4, help="times each implementation's ranks are started (default 4)")
    parser.add_argument("--only", choices=("latency", "bandwidth"), help="run only these cases")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = plan(args.quick, args.only)
    if args.worker:
        return worker(cases, args.worker)

    build_go()
    spec = json.dumps(cases)
    samples = {}
    tmp = os.path.join(ROOT, "build", "bench-collectives.json")
    flags = (["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
    programs = [("Python ranks (torch.distributed and pybridge)", [sys.executable, __file__, "--worker", tmp] + flags),
                ("Go ranks (pybridge through the C ABI)", [GO_BIN, tmp, spec])]
    for run in range(args.runs):
        for what, cmd in programs if run % 2 == 0 else programs[::-1]:
            print(f"run {run + 1}/{args.runs}: {what}...", flush=True)
            launch(cmd, 2, 900)
            merge(samples, tmp)
    report(cases, samples, args.quick, args.only)


def merge(samples, path):
    with open(path) as f:
        for key, values in json.load(f).items():
            samples.setdefault(key, []).extend(values)


def report(cases, samples, quick, only=None):
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows, records = [], []
    for kind, op, nbytes, *_ in cases:
        t = {impl: med[f"{impl}|{op}|{nbytes}"] for impl in ("torch", "pybridge-py", "pybridge-go")}
        if kind == "latency":
            what = f"{op} 1 element"
            cells = [f"{t[i] * 1e6:.1f} us" for i in t]
            ratio = lambda i: t[i] / t["torch"]  # time ratio: lower is better, 1.05 is the goal
        else:
            what = f"{op} {human_bytes(nbytes)}"
            cells = [f"{nbytes / t[i] / 1e9:.3f} GB/s" for i in t]
            ratio = lambda i: t["torch"] / t[i]  # bandwidth ratio: higher is better, 0.97 is the goal
        rows.append([what, *cells, f"{ratio('pybridge-py'):.3f}", f"{ratio('pybridge-go'):.3f}"])
        records.append({"kind": kind, "op": op, "bytes": nbytes, "seconds": t,
                        "ratio_py": ratio("pybridge-py"), "ratio_go": ratio("pybridge-go")})
    headers = ["case", "torch.distributed", "pybridge (Python)", "pybridge (Go)", "ratio Py", "ratio Go"]
    print()
    print("2 ranks, gloo, loopback. Latency rows: time per call, ratio = pybridge / torch (goal <= 1.05).")
    print("Bandwidth rows: bytes / time per call, ratio = pybridge / torch (goal >= 0.97 at 16 MiB).")
    print(table(headers, rows))
    if only:  # a partial run prints its table; bench/results keeps full runs only
        return
    path = save("collectives", {"quick": quick, "results": records})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
