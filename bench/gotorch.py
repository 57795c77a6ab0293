"""The GoTorch-style trainer (Go + libtorch + pybridge) beside the Python twin under torch DDP.

    python bench/gotorch.py [--epochs 3] [--batch-size 64] [--ranks 2] [--repeats 3] [--bucket-cap-mb 0.004]

Same model (the MNIST MLP 784-128-10), data (synthetic digits, 10000 + 2000), global batch,
ranks, seed and bucket cap for every row, in one run, each trainer under pybridge-launch with
OMP_NUM_THREADS=1 (one core per rank):

  Python + torch DDP              examples/mnist/train.py --ddp torch: the baseline
  Python + pybridge DDP           examples/mnist/train.py
  Go + libtorch, attached (copy)  examples/gotorch: parameters by handle, pybridge.AttachReducer;
                                  libtorch's backward reduces the gradients (copied in and back)
  ... attached (bucket view)      the same with --grad-as-bucket-view (nothing copied)
  ... no overlap                  the gradients bound by handle and reduced after backward
  ... previous shim               examples/gotorch as of SHIM_COMMIT, before the attach API: its
                                  C++ shim set bucket views with from_blob and called
                                  pb_reducer_mark_ready from its own autograd hooks (built from
                                  git history; skipped where the history is not there)

Step time: global batch / samples per second of the training time (best epoch after the
first), the median over --repeats runs, interleaved. The share of the reduction hidden
behind backward comes from the trainers' --timing medians (rank 0): with no overlap the
whole reduction is waited for after backward (`full`); what any other row exposes is its
forward+backward+wait minus the no-overlap forward+backward (an attached reducer finishes
the reduction inside backward; hooks that start it early also slow backward down, which
counts). hidden = 1 - exposed / full. The
default bucket cap (0.004 MiB) splits the model into two buckets, [b2, w2] and [b1, w1], so
that there is something to overlap (with one bucket nothing can start before backward ends,
in torch DDP too). Writes bench/results/gotorch.json.

What bounds it here: 2 cores and 2 ranks with one compute thread each, so gloo's
communication thread and the next layer's backward take turns on the same cores, and the
backward left after the first bucket is ready (the first layer's, ~0.1 ms) is short beside
the reduction (~1.5 ms): little can be hidden, and hiding buys no step time. On a GPU,
backward runs on the device while NCCL works on its own stream, and a model with many
buckets should hide most of the reduction, as torch DDP does; bench/gpu.py and the GPU check
measure that where a GPU is lent.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, progress, save, table  # noqa: E402
from mnist import PY_TRAINER, build_go, prepare, run_trainer  # noqa: E402

GOTORCH = os.path.join(ROOT, "build", "gotorch")
SHIM = os.path.join(ROOT, "build", "gotorch-shim")
SHIM_COMMIT = "11f061e"  # the last examples/gotorch before the attach API (issue 31)
TIMING = re.compile(r"^timing: forward\+backward (\S+) ms  wait (\S+) ms  step (\S+) ms", re.M)


def build_gotorch():
    from pybridge.cbuild.cli import torch_flags
    cflags, libs = torch_flags()
    build_go(os.path.join("examples", "gotorch"), GOTORCH, {"CGO_CXXFLAGS": cflags, "CGO_LDFLAGS": libs})


def build_shim():
    """The previous examples/gotorch (and the Go package of its day), from git history: True
    when built. It links today's libpybridge.so, whose ABI is a superset of that day's."""
    from pybridge.cbuild.cli import torch_flags
    tree = os.path.join(ROOT, "build", "gotorch-shim-src")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", SHIM_COMMIT, "examples/gotorch", "examples/mnist", "go"],
                             capture_output=True)
    if archive.returncode != 0:
        progress(f"no git history for {SHIM_COMMIT} here: the previous-shim row is left out")
        return False
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    cflags, libs = torch_flags()
    build_go(os.path.join(tree, "examples", "gotorch"), SHIM, {"CGO_CXXFLAGS": cflags, "CGO_LDFLAGS": libs})
    return True


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
    attached = "Go + libtorch, attached (copy)"
    nooverlap = "Go + libtorch, no overlap"
    shim = "Go + libtorch, previous shim"
    rows = [("Python + torch DDP", PY_TRAINER, ["--ddp", "torch", *cap]),
            ("Python + pybridge DDP", PY_TRAINER, cap),
            (attached, GOTORCH, [*cap, "--timing"]),
            ("Go + libtorch, attached (bucket view)", GOTORCH, [*cap, "--timing", "--grad-as-bucket-view"]),
            (nooverlap, GOTORCH, [*cap, "--timing", "--no-overlap"]),
            (shim, SHIM, [*cap, "--timing", "--check-in-place"])]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mnist")
        prepare(data)
        progress("building examples/gotorch (compiles the libtorch shim)")
        build_gotorch()
        progress(f"building the previous examples/gotorch ({SHIM_COMMIT}) from git history")
        if not build_shim():
            rows = [r for r in rows if r[0] != shim]
        runs = {name: [] for name, _, _ in rows}
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
    timing = {name: [statistics.median(r["timing_ms"][k] for r in runs[name]) for k in range(3)]
              for name, _, _ in rows if any("timing_ms" in r for r in runs[name])}
    full = timing[nooverlap][1]  # the whole reduction, waited for after backward
    hidden = {}
    for name, (fb, wait, _) in timing.items():
        if name == nooverlap or full <= 0:
            continue
        exposed = fb + wait - timing[nooverlap][0]  # what the reduction and its hooks added to the step
        hidden[name] = max(0.0, min(1.0, 1 - exposed / full))
    print(f"MNIST MLP 784-128-10, synthetic digits, {opts.ranks} ranks, global batch {opts.batch_size}, "
          f"{opts.epochs} epochs, bucket cap {opts.bucket_cap_mb} MiB, OMP_NUM_THREADS=1, "
          f"median of {opts.repeats} runs, {os.cpu_count()} CPUs")
    print(table(["trainer", "step ms", "vs Python + torch DDP", "final test acc"], out))
    for name, share in hidden.items():
        fb, wait, _ = timing[name]
        print(f"reduction hidden behind backward, {name}: {share:.0%} (forward+backward {fb:.3f} ms, "
              f"wait {wait:.3f} ms; no overlap: {timing[nooverlap][0]:.3f} ms + {full:.3f} ms)")
    path = save("gotorch", {"ranks": opts.ranks, "batch_size": opts.batch_size, "epochs": opts.epochs,
                            "bucket_cap_mb": opts.bucket_cap_mb, "repeats": opts.repeats,
                            "command": "python bench/gotorch.py " + " ".join(sys.argv[1:]),
                            "summary": summary, "hidden_share": hidden, "timing_ms": timing, "runs": runs})
    print(f"wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
