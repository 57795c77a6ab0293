"""Federated rounds: asynchronous client assignment beside FLUTE's synchronous waves, on
gloo with a server and 3 workers, one of them 5x slower.

    python bench/federated.py [--quick] [--rounds N]      (make bench runs it)

Each round trains 24 clients whose local training is a sleep (0.1 s; 0.5 s on the slow
worker), so the 2-core machine is not what is measured; the model is 100k float32s,
sent to every worker at the start of every round. Rounds of the two modes alternate (each round in a
fresh federation, which mode goes first alternating too) in one launch of 4 ranks.
Reported per mode: the median round time, the clients each worker took, and the workers'
idle fraction: 1 - (time the workers held clients, from hand-out to result) / (3 x round
time). Then the server's overhead per dispatched client with no training at all: 240
clients of a 16-element model per round, the server's CPU time (all its threads) and the
wall time per client. Prints a table and writes bench/results/federated.json.

Then federated MNIST (examples/mnist/federated.py: 100 label-skewed clients of 2 digits,
10 per round, 5 local epochs, synthetic digits unless --mnist-dir) on a server and 3
workers: Python workers in async and in sync mode, and Go workers (federated_go.py) in
async mode, same seed and client draws. Their --metrics lines give the test accuracy per
round. Writes bench/results/federated-mnist.json and its chart (examples/mnist/plot.py's
two panels).

    python bench/federated.py [--no-mnist | --mnist-only] [--mnist-rounds N] [--mnist-dir DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, launch, save, table  # noqa: E402

WORLD = 4  # the server and 3 workers
SLOW_WORKER, SLOWDOWN = 1, 5
CLIENT_SECONDS = 0.1
CLIENTS = 24
MODEL = 100_000
OVERHEAD_CLIENTS, OVERHEAD_MODEL = 240, 16
MNIST_EXAMPLE = os.path.join(ROOT, "examples", "mnist")
# (label, script, extra flags): every run uses the same data, seed and client draws.
MNIST_RUNS = (("Python workers, async", "federated.py", []),
              ("Python workers, sync waves", "federated.py", ["--mode", "sync"]),
              ("Go workers, async", "federated_go.py", ["--go-worker", os.path.join(ROOT, "build", "mnist")]))


def plan(rounds):
    """The federations the ranks run, in order: (case, mode)."""
    cases = []
    for r in range(rounds):
        cases += [("sleep", m) for m in (("async", "sync") if r % 2 == 0 else ("sync", "async"))]
    return cases + [("overhead", "async")] * rounds


def ranks(out_path, rounds):
    import torch

    import pybridge
    from pybridge.federated import Server, Worker
    g = pybridge.init(backend="gloo", timeout=120)
    records = []
    for case, mode in plan(rounds):
        if g.rank != 0:
            delay = CLIENT_SECONDS * (SLOWDOWN if g.rank == SLOW_WORKER else 1) if case == "sleep" else 0

            def train(model, client, delay=delay):
                if delay:
                    time.sleep(delay)
                return model, 1
            Worker(g).serve(train)
            continue
        n, size = (CLIENTS, MODEL) if case == "sleep" else (OVERHEAD_CLIENTS, OVERHEAD_MODEL)
        model = torch.zeros(size)
        with Server(g, mode=mode, timeout=60) as server:
            cpu, t0 = time.process_time(), time.perf_counter()
            results = list(server.run_round(range(n), model))
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu
        assert sorted(r.client for r in results) == list(range(n))
        taken = {w: sum(r.worker == w for r in results) for w in range(1, WORLD)}
        records.append({"case": case, "mode": mode, "seconds": wall, "server_cpu_seconds": cpu,
                        "clients_per_worker": taken,
                        "idle_fraction": 1 - sum(r.seconds for r in results) / ((WORLD - 1) * wall)})
    if g.rank == 0:
        with open(out_path, "w") as f:
            json.dump(records, f)
    pybridge.finalize()


def report(records, rounds):
    rows, modes = [], {}
    for mode in ("async", "sync"):
        mine = [r for r in records if r["case"] == "sleep" and r["mode"] == mode]
        per_worker = {w: statistics.median(r["clients_per_worker"][str(w)] for r in mine) for w in range(1, WORLD)}
        modes[mode] = {"round_seconds_median": statistics.median(r["seconds"] for r in mine),
                       "round_seconds": [r["seconds"] for r in mine],
                       "idle_fraction_median": statistics.median(r["idle_fraction"] for r in mine),
                       "clients_per_worker_median": per_worker}
        m = modes[mode]
        slow = f"{per_worker[SLOW_WORKER]:g}"
        fast = "/".join(f"{per_worker[w]:g}" for w in range(1, WORLD) if w != SLOW_WORKER)
        rows.append([f"{mode}", f"{m['round_seconds_median']:.2f} s", f"{m['idle_fraction_median']:.0%}",
                     slow, fast])
    speedup = modes["sync"]["round_seconds_median"] / modes["async"]["round_seconds_median"]
    # The bound: every worker busy until the round's last client is done.
    ideal_round = CLIENTS / sum(1 / (CLIENT_SECONDS * (SLOWDOWN if w == SLOW_WORKER else 1))
                                for w in range(1, WORLD))
    waves_round = -(-CLIENTS // (WORLD - 1)) * CLIENT_SECONDS * SLOWDOWN
    over = [r for r in records if r["case"] == "overhead"]
    cpu_us = statistics.median(r["server_cpu_seconds"] / OVERHEAD_CLIENTS for r in over) * 1e6
    wall_us = statistics.median(r["seconds"] / OVERHEAD_CLIENTS for r in over) * 1e6
    print()
    print(f"{CLIENTS} clients per round of {CLIENT_SECONDS:g} s sleep ({CLIENT_SECONDS * SLOWDOWN:g} s on worker "
          f"{SLOW_WORKER}), {WORLD - 1} workers, gloo, model {MODEL} float32; median of {rounds} rounds per mode.")
    print(table(["mode", "round time", "worker idle", f"clients on slow worker {SLOW_WORKER}",
                 "clients on fast workers"], rows))
    print(f"\nasync is {speedup:.2f}x faster than sync waves (target >= 2x; bounds: sync "
          f"{waves_round:.1f} s, async {ideal_round:.2f} s, ratio {waves_round / ideal_round:.1f}x).")
    print(f"server overhead per dispatched client (no training, {OVERHEAD_CLIENTS} clients, "
          f"{OVERHEAD_MODEL}-element model): {cpu_us:.0f} us server CPU, {wall_us:.0f} us wall "
          f"(3 workers, median of {len(over)} rounds)")
    return {"modes": modes, "speedup": speedup, "ideal_speedup": waves_round / ideal_round,
            "overhead_us": {"server_cpu": cpu_us, "wall": wall_us},
            "setup": {"world": WORLD, "clients": CLIENTS, "client_seconds": CLIENT_SECONDS,
                      "slow_worker": SLOW_WORKER, "slowdown": SLOWDOWN, "model": MODEL,
                      "overhead_clients": OVERHEAD_CLIENTS, "rounds": rounds},
            "records": records}


def federated_mnist(rounds, local_epochs, mnist_dir, timeout):
    """Run MNIST_RUNS; returns (data kind, runs with their per-round metrics)."""
    import mnist as bench_mnist
    sys.path.insert(0, MNIST_EXAMPLE)
    from plot import read_metrics
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mnist")
        kind = bench_mnist.prepare(data, mnist_dir)
        bench_mnist.build_go_trainer()
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        for label, script, extra in MNIST_RUNS:
            print(f"federated MNIST, {label}, {rounds} rounds...", file=sys.stderr, flush=True)
            metrics = os.path.join(tmp, "metrics.jsonl")
            cmd = [sys.executable, "-m", "pybridge.launch", "--nproc-per-node", str(WORLD),
                   os.path.join(MNIST_EXAMPLE, script), "--data", data, "--rounds", str(rounds),
                   "--local-epochs", str(local_epochs), "--metrics", metrics, *extra]
            start = time.monotonic()
            try:
                p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise SystemExit(f"{' '.join(cmd)} did not finish within {timeout:g} s") from None
            if p.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}")
            rows = read_metrics(metrics)
            runs.append({"label": label, "wall_s": round(time.monotonic() - start, 1),
                         "rounds": [{f: row[f] for f in ("round", "loss", "test_accuracy", "seconds")}
                                    for row in rows]})
    return kind, runs


def mnist_table(runs):
    marks = [r for r in (10, 25, 50, 75, 100) if r <= len(runs[0]["rounds"])]
    headers = ["workers, mode"] + [f"acc r{m}" for m in marks] + ["median s/round", "wall s"]
    return table(headers, [[r["label"], *(f"{r['rounds'][m - 1]['test_accuracy']:.4f}" for m in marks),
                            f"{statistics.median(x['seconds'] for x in r['rounds']):.2f}", f"{r['wall_s']:.1f}"]
                           for r in runs])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round per mode (a smoke run; nothing saved)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per mode (default 5)")
    parser.add_argument("--no-mnist", action="store_true", help="skip federated MNIST")
    parser.add_argument("--mnist-only", action="store_true", help="only federated MNIST")
    parser.add_argument("--mnist-rounds", type=int, default=0, help="federated MNIST rounds (default 100, --quick 3)")
    parser.add_argument("--mnist-local-epochs", type=int, default=5, help="local epochs per client (default 5)")
    parser.add_argument("--mnist-dir", default=os.environ.get("MNIST_DIR"),
                        help="real MNIST IDX files (default: synthetic digits)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per MNIST run (default 900)")
    parser.add_argument("--ranks", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    if rounds < 1:
        parser.error(f"--rounds must be at least 1, not {rounds}")
    if args.no_mnist and args.mnist_only:
        parser.error("--no-mnist and --mnist-only exclude each other")
    mnist_rounds = args.mnist_rounds or (3 if args.quick else 100)
    if mnist_rounds < 1 or args.mnist_local_epochs < 1:
        parser.error("--mnist-rounds and --mnist-local-epochs must be at least 1")
    if args.ranks:
        return ranks(args.ranks, rounds)
    if not args.mnist_only:
        tmp = os.path.join(ROOT, "build", "bench-federated.json")
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
        launch([sys.executable, __file__, "--ranks", tmp, "--rounds", str(rounds)], WORLD, 600)
        with open(tmp) as f:
            records = json.load(f)
        payload = report(records, rounds)
        if not args.quick:
            print(f"\nwrote {save('federated', payload)}")
    if not args.no_mnist:
        kind, runs = federated_mnist(mnist_rounds, args.mnist_local_epochs, args.mnist_dir, args.timeout)
        print(f"\nFederated MNIST ({kind}): 100 clients of 2 digits, 10 per round, "
              f"{args.mnist_local_epochs} local epochs, {WORLD - 1} workers: test accuracy after round\n")
        print(mnist_table(runs))
        if not args.quick:
            path = save("federated-mnist", {"data": kind, "world": WORLD, "clients": 100, "per_round": 10,
                                            "local_epochs": args.mnist_local_epochs,
                                            "command": "python bench/federated.py " + " ".join(sys.argv[1:]),
                                            "runs": runs})
            print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
