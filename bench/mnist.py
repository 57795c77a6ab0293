"""Training throughput of the MNIST trainers with 1 and 2 ranks (pybridge-launch), in one run.

    python bench/mnist.py [--epochs 2] [--batch-size 64] [--mnist-dir DIR | --download] [--target 0.97]

Prepares a data set in a temporary folder (synthetic 10000 + 2000 digits, or real MNIST with
--mnist-dir / MNIST_DIR, or --download to fetch it into build/mnist-raw once), runs each
trainer under `python -m pybridge.launch --nproc-per-node N` and reads its per-epoch
"samples/s" lines (training time only, global samples). Prints a table with the speed-up over
1 rank, the scaling efficiency (samples/s with N ranks divided by N x samples/s with 1 rank),
the first epoch whose test accuracy reaches --target and the wall time from launch to the end
of that epoch (evaluation included), and writes bench/results/mnist.json. Both rank counts run
with OMP_NUM_THREADS=1 (one core per rank), so the comparison is per core.

The Go trainer (examples/mnist/*.go) is built first into build/mnist.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, save, table  # noqa: E402

PREPARE = os.path.join(ROOT, "examples", "mnist", "prepare.py")
PY_TRAINER = os.path.join(ROOT, "examples", "mnist", "train.py")
GO_TRAINER = os.path.join(ROOT, "build", "mnist")
EPOCH = re.compile(r"^epoch (\d+)/(\d+)  loss (\S+)  test-acc (\S+)  samples/s (\d+)", re.M)
FINAL = re.compile(r"^final test accuracy: (\S+)$", re.M)


def prepare(out, mnist_dir=None, download=False, extra=()):
    """Write the data set into `out` with examples/mnist/prepare.py; says which kind it is."""
    prep = [sys.executable, PREPARE, "--out", out, *extra]
    prep += ["--mnist-dir", mnist_dir] if mnist_dir else ["--synthetic"]
    prep += ["--download"] if download else []
    p = subprocess.run(prep, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit(p.stdout)
    return "real MNIST" if mnist_dir else "synthetic digits"


def run_trainer(target, ranks, data, opts, extra=(), launch_args=(), threads="1", pythonpath=None):
    """Train with `ranks` ranks; `extra`: more trainer flags (--reduce, --metrics...);
    `launch_args`: more launcher flags; `threads`: OMP_NUM_THREADS (None: the launcher's);
    `pythonpath`: the tree whose pybridge runs (default this checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(PYTHONPATH=(pythonpath or ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYBRIDGE_LOG_PREFIX="0",  # the trainer's lines as it prints them, without "[rank0]:"
               **({"OMP_NUM_THREADS": threads} if threads else {}))
    cmd = [sys.executable, "-m", "pybridge.launch", "--nproc-per-node", str(ranks), *launch_args, target,
           "--data", data, "--epochs", str(opts.epochs), "--batch-size", str(opts.batch_size), *extra]
    t0 = time.monotonic()
    out, epoch_end = [], []  # epoch_end[i]: seconds from launch to epoch i+1's line
    with subprocess.Popen(cmd, cwd=pythonpath or ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as p:
        timer = threading.Timer(opts.timeout, p.kill)  # a hung run fails the bench, not blocks it
        timer.start()
        try:
            for line in p.stdout:  # read as it comes, to time each epoch's end
                out.append(line)
                if EPOCH.match(line):
                    epoch_end.append(time.monotonic() - t0)
        finally:
            timer.cancel()
    wall = time.monotonic() - t0
    text = "".join(out)
    if p.returncode != 0:
        why = f"did not finish within {opts.timeout:g} s" if wall >= opts.timeout else f"failed ({p.returncode})"
        raise SystemExit(f"{' '.join(cmd)} {why}:\n{text}")
    epochs = EPOCH.findall(text)
    final = FINAL.search(text)
    if not epochs or not final:
        raise SystemExit(f"unexpected trainer output:\n{text}")
    rates = [int(e[4]) for e in epochs]
    accs = [float(e[3]) for e in epochs]
    reached = next((i for i, a in enumerate(accs) if a >= opts.target), None)
    # The first epoch includes warm-up (first batches, allocator); use the best later epoch.
    rate = max(rates[1:]) if len(rates) > 1 else rates[0]
    return {"ranks": ranks, "samples_per_s": rate, "epoch_samples_per_s": rates,
            "epoch_test_accuracy": accs, "epoch_end_s": [round(t, 1) for t in epoch_end],
            "target": opts.target, "epochs_to_target": None if reached is None else reached + 1,
            "seconds_to_target": None if reached is None else round(epoch_end[reached], 1),
            "test_accuracy": float(final.group(1)), "epochs": len(epochs), "wall_s": round(wall, 1),
            "output": text}


def build_go(module, out, env=None):
    """`go build -o out` in the Go module folder `module` (under ROOT), offline."""
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": "-mod=mod",
           "PKG_CONFIG_PATH": os.path.join(ROOT, "build"), **(env or {})}
    go = os.path.join(os.path.dirname(sys.executable), "go")
    subprocess.run([go if os.path.exists(go) else "go", "build", "-o", out, "."],
                   cwd=os.path.join(ROOT, module), env=env, check=True, timeout=600)


def build_go_trainer():
    build_go(os.path.join("examples", "mnist"), GO_TRAINER)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch (default 64)")
    ap.add_argument("--mnist-dir", default=os.environ.get("MNIST_DIR"), help="real MNIST IDX files")
    ap.add_argument("--download", action="store_true",
                    help="real MNIST, downloaded by prepare.py into build/mnist-raw (kept for reuse)")
    ap.add_argument("--target", type=float, default=0.97, help="test accuracy to time (default 0.97)")
    ap.add_argument("--timeout", type=float, default=300)
    opts = ap.parse_args()
    if opts.download:
        opts.mnist_dir = opts.mnist_dir or os.path.join(ROOT, "build", "mnist-raw")

    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mnist")
        kind = prepare(data, opts.mnist_dir, opts.download)
        build_go_trainer()
        results = {"python": [run_trainer(PY_TRAINER, n, data, opts) for n in (1, 2)],
                   "go": [run_trainer(GO_TRAINER, n, data, opts) for n in (1, 2)]}
        for runs in results.values():
            for r in runs:
                r.pop("output")  # what the table needs is parsed already

    rows = []
    for name, label in (("go", "Go trainer"), ("python", "Python twin (torch)")):
        runs = results.get(name)
        base = runs[0]["samples_per_s"]
        for r in runs:
            speedup = r["samples_per_s"] / base
            r["speedup"] = round(speedup, 3)
            r["efficiency"] = round(speedup / r["ranks"], 3)
            to_target = ("not reached" if r["epochs_to_target"] is None else
                         f"epoch {r['epochs_to_target']}, {r['seconds_to_target']:.1f} s")
            rows.append([label, r["ranks"], f"{r['samples_per_s']:,}", f"{speedup:.2f}x",
                         f"{r['efficiency']:.0%}", f"{r['test_accuracy']:.4f}", to_target,
                         f"{r['wall_s']:.1f}"])
    print(f"MNIST MLP 784-128-10, {kind}, global batch {opts.batch_size}, {opts.epochs} epochs, "
          f"OMP_NUM_THREADS=1, {os.cpu_count()} CPUs")
    print(table(["trainer", "ranks", "samples/s", "speed-up", "scaling efficiency", "final test acc",
                 f"test acc >= {opts.target}", "wall s"], rows))
    path = save("mnist", {"data": kind, "batch_size": opts.batch_size, "epochs": opts.epochs,
                          "command": "python bench/mnist.py " + " ".join(sys.argv[1:]),
                          "results": results})
    print(f"wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
