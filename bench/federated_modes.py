"""Federated MNIST: time to reach a target test accuracy in each server mode, in one run.

    python bench/federated_modes.py            (full: about 5 minutes on 2 cores)
    python bench/federated_modes.py --quick    (a smoke run, < 20 s; nothing saved)

examples/mnist/federated.py's task (100 label-skewed clients of 2 digits, 10 per round,
local SGD) on a server and 3 workers, whose clients take simulated extra time (a sleep
after training, so that the shared 2-core machine is not what is measured) in two speed
profiles: workers 1x, 1x and 4x (--client-seconds x 1, 1, 4), and long-tailed (every task
--client-seconds x a Pareto(1.5) draw, capped at 20x, seeded per worker). Modes: sync
waves (FLUTE on gloo: the baseline), per-round async, and FedBuff (the model steps every
--buffer-size results, late results weighted by polynomial staleness (1 + tau)^-0.5, no
round waits for a straggler). Each (profile, mode) is one federation of the same ranks
(one launch), stopped at --target or after --rounds rounds (in FedBuff a round is the
clients handed out between two test evaluations). Time to target is the server's wall
time from the federation's start to the evaluation that reached it. Prints a table and
writes bench/results/federated-modes.json and its chart.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, launch, save, table  # noqa: E402

WORLD = 4  # the server and 3 workers
MODES = ("sync", "async", "fedbuff")
PROFILES = {"1x, 1x, 4x": ["--speeds", "1,1,4"], "long tail": ["--long-tail"]}
FULL = {"rounds": 60, "target": 0.7, "client_seconds": 0.2, "local_epochs": 5, "train": 10000, "test": 2000,
        "buffer_size": 3, "warm_up": True}
QUICK = {"rounds": 1, "target": 0.2, "client_seconds": 0.02, "local_epochs": 1, "train": 2000, "test": 300,
         "buffer_size": 3, "warm_up": False}


def plan():
    return [(profile, mode) for profile in PROFILES for mode in MODES]


def case_args(data, preset, profile, mode, metrics):
    sys.path.insert(0, os.path.join(ROOT, "examples", "mnist"))
    import federated
    args = ["--data", data, "--mode", mode, "--rounds", str(preset["rounds"]), "--target", str(preset["target"]),
            "--client-seconds", str(preset["client_seconds"]), "--local-epochs", str(preset["local_epochs"]),
            "--no-client-eval", "--metrics", metrics, *PROFILES[profile]]
    if mode == "fedbuff":
        args += ["--buffer-size", str(preset["buffer_size"]), "--staleness", "polynomial:0.5"]
    return federated, federated.parse_args(args)


def ranks(data, preset, out_dir):
    """Every case on this rank (a launched process, or tests/ranks.py's), after one round
    not measured: the first training in a process pays for imports and first calls."""
    import torch

    import pybridge
    torch.set_num_threads(1)  # one core per rank, also where torch was imported before OMP_NUM_THREADS was set
    g = pybridge.init(backend="gloo", timeout=120)
    if preset["warm_up"]:
        federated, opts = case_args(data, {**preset, "rounds": 1}, "1x, 1x, 4x", "async",
                                    os.path.join(out_dir, "warm-up.jsonl"))
        (federated.serve if g.rank == 0 else federated.work)(opts, g)
    for i, (profile, mode) in enumerate(plan()):
        federated, opts = case_args(data, preset, profile, mode, os.path.join(out_dir, f"case{i}.jsonl"))
        (federated.serve if g.rank == 0 else federated.work)(opts, g)
    pybridge.finalize()


def results(out_dir, preset):
    runs = []
    for i, (profile, mode) in enumerate(plan()):
        with open(os.path.join(out_dir, f"case{i}.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        hit = next((r for r in rows if r["test_accuracy"] >= preset["target"]), None)
        runs.append({"profile": profile, "mode": mode, "rounds": rows,
                     "seconds_to_target": hit and hit["elapsed"], "rounds_to_target": hit and hit["round"],
                     "final_accuracy": rows[-1]["test_accuracy"], "model_steps": rows[-1]["version"]})
    return runs


def report(runs, preset):
    rows = []
    for run in runs:
        base = next(r for r in runs if r["profile"] == run["profile"] and r["mode"] == "sync")["seconds_to_target"]
        t = run["seconds_to_target"]
        rows.append([run["profile"], {"sync": "sync waves", "async": "per-round async"}.get(run["mode"], run["mode"]),
                     "not reached" if t is None else f"{t:.1f} s",
                     "-" if t is None else str(run["rounds_to_target"]),
                     "-" if t is None or base is None else f"{base / t:.2f}x",
                     f"{run['final_accuracy']:.4f}", str(run["model_steps"])])
    print(f"\nTime to test accuracy {preset['target']} (federated MNIST, 100 clients, 10 per round, "
          f"{WORLD - 1} workers, {preset['client_seconds']:g} s per client x the profile's factor):\n")
    text = table(["speeds", "mode", "time to target", "rounds", "vs sync waves", "last accuracy", "model steps"], rows)
    print(text)
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run (< 20 s, nothing saved)")
    p.add_argument("--mnist-dir", default=os.environ.get("MNIST_DIR"), help="real MNIST IDX files")
    p.add_argument("--timeout", type=float, default=1200, help="seconds for the whole run (default 1200)")
    p.add_argument("--ranks", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    preset = QUICK if args.quick else FULL
    if args.ranks:
        return ranks(args.ranks[0], preset, args.ranks[1])
    import mnist as bench_mnist
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mnist")
        kind = bench_mnist.prepare(data, args.mnist_dir, extra=["--train-count", str(preset["train"]),
                                                                 "--test-count", str(preset["test"])])
        env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        cmd = [sys.executable, __file__, "--ranks", data, tmp] + (["--quick"] if args.quick else [])
        launch(cmd, WORLD, args.timeout, extra_env=env)
        runs = results(tmp, preset)
    report(runs, preset)
    if not args.quick:
        path = save("federated-modes", {"data": kind, "world": WORLD, "clients": 100, "per_round": 10,
                                        "preset": preset, "command": "python bench/federated_modes.py",
                                        "runs": runs})
        print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
