"""CPU binding (pybridge-launch --cpu-bind) against the unbound launch, on the MNIST Python
trainer with 2 ranks, in one run.

    python bench/cpubind.py [--epochs 2] [--batch-size 64] [--ranks 2]

Cases: unbound with torchrun's OMP_NUM_THREADS=1 (the baseline, the launcher's rule before
--cpu-bind), unbound with every rank running as many threads as the node has CPUs
(oversubscribed: what a user who raises OMP_NUM_THREADS without binding gets), and
--cpu-bind cores (each rank pinned to its share, as many threads as CPUs in it; the
default on CPUs a scheduler allocated). Prints samples/s (best epoch after the first) and writes bench/results/cpubind.json.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import progress, save, table  # noqa: E402
from mnist import PY_TRAINER, prepare, run_trainer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch (default 64)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--target", type=float, default=0.97)
    ap.add_argument("--timeout", type=float, default=600)
    opts = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    cases = [("unbound, OMP_NUM_THREADS=1 (baseline)", ["--cpu-bind", "none"], "1"),
             (f"unbound, OMP_NUM_THREADS={cpus} each", ["--cpu-bind", "none"], str(cpus)),
             ("--cpu-bind cores", ["--cpu-bind", "cores"], None)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mnist")
        kind = prepare(data)
        for name, launch_args, threads in cases:
            progress(f"cpubind: {name}")
            r = run_trainer(PY_TRAINER, opts.ranks, data, opts, launch_args=launch_args, threads=threads)
            r.pop("output")
            results.append({"case": name, **r})
    base = results[0]["samples_per_s"]
    rows = [[r["case"], f"{r['samples_per_s']:,}", f"{r['samples_per_s'] / base:.2f}x", f"{r['wall_s']:.1f}"]
            for r in results]
    print(f"MNIST MLP 784-128-10 (Python trainer), {kind}, {opts.ranks} ranks, global batch "
          f"{opts.batch_size}, {opts.epochs} epochs, {cpus} CPUs allowed")
    print(table(["launch", "samples/s", "vs baseline", "wall s"], rows))
    save("cpubind", {"ranks": opts.ranks, "cpus": cpus, "results": results})


if __name__ == "__main__":
    main()
