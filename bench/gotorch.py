"""The GoTorch-style trainer (Go + libtorch + pybridge) beside the Python twin under torch DDP.

    python bench/gotorch.py [--epochs 3] [--batch-size 64] [--ranks 2] [--repeats 3] [--bucket-cap-mb 0.004]

Same model (the MNIST MLP 784-128-10), data (synthetic digits, 10000 + 2000), global batch,
ranks, seed and bucket cap for every row, in one run, each trainer under pybridge-launch with
OMP_NUM_THREADS=1 (one core per rank):

  Python + torch DDP        examples/mnist/train.py --ddp torch: the baseline
  Python + pybridge DDP     examples/mnist/train.py
  Go + libtorch + pybridge  examples/gotorch: forward and backward in libtorch (no Python),
                            gradients accumulated into the buckets, marked ready by autograd hooks
  ... --no-overlap          the same, every gradient marked after backward

Step time: global batch / samples per second of the training time (best epoch after the
first), the median over --repeats runs, interleaved. The share of the reduction hidden behind
backward is 1 - wait(hooks) / wait(no overlap), from the Go trainer's --timing medians: with
no overlap the whole reduction is waited for after backward; with hooks only what backward
did not cover. The default bucket cap (0.004 MiB) splits the model into two buckets, [b2, w2]
and [b1, w1], so that there is something to overlap (with one bucket nothing can start before
backward ends, in torch DDP too). Writes bench/results/gotorch.json.
"""

import argparse
import os
import re
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, progress, save, table  # noqa: E402
from mnist import PY_TRAINER, build_go, prepare, run_trainer  # noqa: E402

GOTORCH = os.path.join(ROOT, "build", "gotorch")
TIMING = re.compile(r"^timing: forward\+backward (\S+) ms  wait (\S+) ms  step (\S+) ms", re.M)


def build_gotorch():
    from pybridge.cbuild.cli import torch_flags
    cflags, libs = torch_flags()
    build_go(os.path.join("examples", "gotorch"), GOTORCH, {"CGO_CXXFLAGS": cflags, "CGO_LDFLAGS": libs})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch (default 64)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.004)
    ap.add_argument("--timeout", type=float, default=300)
    opts = ap.parse_args()
    opts.target = 2.0  # run_trainer's accuracy target: not used here
    cap = ["--bucket-cap-mb", str(opts.bucket_cap_mb)]
    rows = [("Python + torch DDP", PY_TRAINER, ["--ddp", "torch", *cap]),
            ("Python + pybridge DDP", PY_TRAINER, cap),
            ("Go + libtorch + pybridge", GOTORCH, [*cap, "--timing"]),
            ("Go + libtorch + pybridge, no overlap", GOTORCH, [*cap, "--timing", "--no-overlap"])]
    runs = {name: [] for name, _, _ in rows}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mnist")
        prepare(data)
        progress("building examples/gotorch (compiles the libtorch shim)")
        build_gotorch()
        for rep in range(opts.repeats):
            for name, target, extra in rows:
                progress(f"repeat {rep + 1}/{opts.repeats}: {name}")
                r = run_trainer(target, opts.ranks, data, opts, extra)
                m = TIMING.search(r.pop("output", "") or "")
                runs[name].append(r | ({"timing_ms": [float(v) for v in m.groups()]} if m else {}))

    def step_ms(r):
        return 1000.0 * opts.batch_size / r["samples_per_s"]

    base = statistics.median(step_ms(r) for r in runs[rows[0][0]])
    summary, out = {}, []
    for name, _, _ in rows:
        ms = statistics.median(step_ms(r) for r in runs[name])
        acc = statistics.median(r["test_accuracy"] for r in runs[name])
        summary[name] = {"step_ms": round(ms, 3), "vs_torch_ddp": round(ms / base, 3), "test_accuracy": acc}
        out.append([name, f"{ms:.3f}", f"{ms / base:.2f}x", f"{acc:.4f}"])
    waits = {name: statistics.median(r["timing_ms"][1] for r in runs[name] if "timing_ms" in r)
             for name, _, _ in rows[2:] if any("timing_ms" in r for r in runs[name])}
    hidden = None
    if len(waits) == 2:
        exposed, full = waits[rows[2][0]], waits[rows[3][0]]
        hidden = max(0.0, 1 - exposed / full) if full > 0 else None
    print(f"MNIST MLP 784-128-10, synthetic digits, {opts.ranks} ranks, global batch {opts.batch_size}, "
          f"{opts.epochs} epochs, bucket cap {opts.bucket_cap_mb} MiB, OMP_NUM_THREADS=1, "
          f"median of {opts.repeats} runs, {os.cpu_count()} CPUs")
    print(table(["trainer", "step ms", "vs Python + torch DDP", "final test acc"], out))
    if hidden is not None:
        print(f"reduction hidden behind backward (Go): {hidden:.0%} (wait {waits[rows[2][0]]:.3f} ms with hooks, "
              f"{waits[rows[3][0]]:.3f} ms after backward)")
    path = save("gotorch", {"ranks": opts.ranks, "batch_size": opts.batch_size, "epochs": opts.epochs,
                            "bucket_cap_mb": opts.bucket_cap_mb, "repeats": opts.repeats,
                            "command": "python bench/gotorch.py " + " ".join(sys.argv[1:]),
                            "summary": summary, "hidden_share": hidden, "waits_ms": waits, "runs": runs})
    print(f"wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
