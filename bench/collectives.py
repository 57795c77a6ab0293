"""Collectives benchmark: 1-element allreduce latency and allreduce/broadcast bandwidth
from 1 KiB to 64 MiB, 2 ranks on gloo, three ways in one run:
raw torch.distributed from Python, pybridge from Python, pybridge from Go (C ABI).

    python bench/collectives.py [--quick] [--only latency|bandwidth]      (make bench runs it)

The Python ranks (which time torch.distributed and pybridge) and the Go ranks are all
started once and take turns sample by sample: every sample of every case is timed for
torch, then pybridge from Python, then pybridge from Go, while the other ranks wait on a
pipe without using the CPU. On a shared machine the noise comes in bursts of seconds;
interleaving this finely makes each burst hit all three alike, and each figure is the
median over many short samples (32 of 500 calls for latency). Ranks that have just waited
run slower for a few hundred milliseconds (on the 2-core VM this was written on, 1-element
latencies were ~20% high after a 50-call warm-up and back to the one-program-at-a-time
figure after 2000), so every sample starts with a warm-up that long. Prints a table of
times and ratios and writes bench/results/collectives.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, Ranks, human_bytes, save, table  # noqa: E402

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB ... 64 MiB
GO_BIN = os.path.join(ROOT, "build", "bench_collectives_go")
IMPLS = ("torch", "pybridge-py", "pybridge-go")


def iterations(nbytes):
    """Deterministic per size, so every rank runs the same number of collectives."""
    return max(3, min(2000, (48 << 20) // nbytes))


def plan(quick, only=None):
    """(kind, op, bytes, calls per sample, samples, warm-up calls per sample) per case."""
    sizes = SIZES[::2] if quick else SIZES
    cases = [("latency", "allreduce", 4, 100, 4, 100) if quick else ("latency", "allreduce", 4, 500, 32, 2000)]
    for op in ("allreduce", "broadcast"):
        for n in sizes:
            calls = max(2, iterations(n) // (4 if quick else 1))
            cases.append(("bandwidth", op, n, calls, 2 if quick else 8, calls))
    return [c for c in cases if only is None or c[0] == only]


def worker(cases):
    """One Python rank: on each command "IMPL CASE" from stdin, time one sample of that
    case with raw torch.distributed or pybridge and print "sample SECONDS"."""
    import torch
    import torch.distributed as dist

    import pybridge

    pybridge.init(backend="gloo", timeout=120)
    calls = {("torch", "allreduce"): lambda t: dist.all_reduce(t),
             ("torch", "broadcast"): lambda t: dist.broadcast(t, 0),
             ("pybridge-py", "allreduce"): lambda t: pybridge.all_reduce(t),
             ("pybridge-py", "broadcast"): lambda t: pybridge.broadcast(t, 0)}
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        impl, index = line.split()
        _, op, nbytes, iters, _, warmup = cases[int(index)]
        fn, t = calls[impl, op], torch.ones(nbytes // 4)
        for _ in range(warmup):
            fn(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn(t)
        print(f"sample {(time.perf_counter() - start) / iters!r}", flush=True)
    pybridge.finalize()


def build_go():
    subprocess.run(["go", "build", "-o", GO_BIN, "."], check=True,
                   cwd=os.path.join(ROOT, "bench", "collectives_go"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes, samples and iterations (a smoke run)")
    parser.add_argument("--only", choices=("latency", "bandwidth"), help="run only these cases")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = plan(args.quick, args.only)
    if args.worker:
        return worker(json.loads(args.worker))

    build_go()
    spec = json.dumps(cases)
    samples = {}
    rounds = max(c[4] for c in cases)
    with Ranks([sys.executable, __file__, "--worker", spec], 2, 900) as py, Ranks([GO_BIN, spec], 2, 900) as go:
        for r in range(rounds):
            print(f"round {r + 1}/{rounds}: a sample of each case from torch, pybridge-py, pybridge-go", flush=True)
            for index, (_, op, nbytes, _, n, _) in enumerate(cases):
                if r < n:
                    for impl in IMPLS:
                        ranks = go if impl == "pybridge-go" else py
                        samples.setdefault(f"{impl}|{op}|{nbytes}", []).append(ranks.sample(f"{impl} {index}"))
    report(cases, samples, args.quick, args.only)


def report(cases, samples, quick, only=None):
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows, records = [], []
    for kind, op, nbytes, *_ in cases:
        t = {impl: med[f"{impl}|{op}|{nbytes}"] for impl in IMPLS}
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
