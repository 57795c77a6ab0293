"""GossipGraD against allreduce: step time and bytes sent per rank per step, at 4 and 8 ranks
over gloo, on bench/reducer.py's models, in one run.

    python bench/gossip.py [--quick] [--worlds 4,8] [--models a,b] [--rounds N] [--iters N]
                           [--no-mnist | --mnist-only] [--mnist-epochs N] [--mnist-dir DIR]

Methods: pybridge's DDP wrapper with the gossip hook (cube, dissemination; one rank per
node, rotating topology, no sync_every), the same wrapper with its allreduce, and torch
DDP (all with bucket_cap_mb=25). For each world size and model one job of that many ranks
holds all four (each its own copy of the model) and they take turns, round by round, so
machine noise hits all; a job's ranks share the machine's cores (one torch thread each).

Bytes sent are measured, not computed: each rank reads its own `wchar` from
/proc/self/io (bytes its threads wrote, gloo's socket writes included) around the timed
steps. Ring allreduce should send about 2(p-1)/p of the gradient per rank, gossip one copy.
Prints a table per world size and model and writes bench/results/gossip.json (a partial
run: gossip-<worlds><models>.json) and its chart.

Then MNIST: the Go trainer (examples/mnist) on 4 ranks with --reduce allreduce,
gossip-cube and gossip-dissemination, each gossip with --sync-every 4 and 0 (0: replicas
averaged only before each epoch's evaluation), same data, seed and global batch; its
--metrics lines give the loss and test accuracy per epoch. Writes
bench/results/gossip-mnist.json and its chart (examples/mnist/plot.py's two panels).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import launch, reports, save, table  # noqa: E402
from reducer import MODELS, build, make_step  # noqa: E402

WORLDS = (4, 8)
METHODS = ["gossip_cube", "gossip_dissemination", "pybridge", "torch_ddp"]
LABELS = {"gossip_cube": "gossip, cube", "gossip_dissemination": "gossip, dissemination",
          "pybridge": "pybridge allreduce", "torch_ddp": "torch DDP"}
RESULT = "GOSSIP-BENCH "  # the line a worker rank reports on
MNIST_RANKS = 4
MNIST_RUNS = [("allreduce", 0), ("gossip-cube", 4), ("gossip-cube", 0),
              ("gossip-dissemination", 4), ("gossip-dissemination", 0)]


def written_bytes():
    """Bytes this process has written so far (all threads; socket writes count)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no wchar line")


def gossip_step(topology, model):
    from pybridge.ddp.wrapper import DistributedDataParallel
    from pybridge.algorithms.gossip import GossipState, gossip_hook
    wrapped = DistributedDataParallel(model, bucket_cap_mb=25)
    state = GossipState(topology=topology, seed=0)
    wrapped.register_comm_hook(state, gossip_hook)

    def step(x):
        model.zero_grad()
        wrapped(x).square().mean().backward()
    step.state = state
    return step


def worker(key, rounds, iters, threads):
    """One rank: every method's timed steps and bytes; prints RESULT + JSON."""
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import pybridge
    torch.set_num_threads(threads)
    pybridge.init(backend="gloo", timeout=600)
    world, rank = pybridge.size(), pybridge.rank()
    cfg = MODELS[key]
    x = torch.randn(cfg["batch"], cfg["width"], generator=torch.Generator().manual_seed(rank))
    steps, models = {}, {}
    for m in METHODS:
        models[m] = build(cfg)  # the same initial weights for every method
        steps[m] = (gossip_step(m.split("_", 1)[1], models[m]) if m.startswith("gossip")
                    else make_step(m, models[m], world))
    for m in METHODS:
        steps[m](x)
    # Same work: after one step the allreduce rows hold the same mean gradient.
    for a, b in zip(models["pybridge"].parameters(), models["torch_ddp"].parameters()):
        if not torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6):
            raise SystemExit("pybridge's allreduce gradients differ from torch DDP's")
    grad_bytes = sum(p.numel() * p.element_size() for p in models["pybridge"].parameters())
    times = {m: [] for m in METHODS}
    sent = {m: [] for m in METHODS}
    for r in range(rounds):
        for m in METHODS[r % len(METHODS):] + METHODS[:r % len(METHODS)]:
            steps[m](x)  # warm-up after the other methods' turns
            pybridge.barrier()
            before = written_bytes()
            for _ in range(iters):
                t0 = time.perf_counter()
                steps[m](x)
                times[m].append(time.perf_counter() - t0)
            sent[m].append((written_bytes() - before) / iters)
    pybridge.barrier()
    for m in METHODS:
        if hasattr(steps[m], "state"):
            steps[m].state.close()
    pybridge.finalize()
    print(RESULT + json.dumps({"rank": rank, "grad_bytes": grad_bytes, "times": times, "sent": sent}),
          flush=True)


def run_job(world, key, rounds, iters, timeout):
    """Per-rank results of one job of `world` ranks on model `key`."""
    threads = 1  # ranks outnumber cores already
    outs = launch([sys.executable, os.path.abspath(__file__), "--worker", key, str(rounds), str(iters),
                   str(threads)], world, timeout, extra_env={"OMP_NUM_THREADS": "1"})
    return reports(outs, RESULT, f"the {world}-rank job on model ({key})")


def summarize(ranks):
    """Rows per method: the slower rank's median step (a step ends in communication, so ranks
    agree), and the median bytes per step averaged over ranks."""
    grad = ranks[0]["grad_bytes"]
    med = {m: max(statistics.median(r["times"][m]) for r in ranks) for m in METHODS}
    rows = {}
    for m in METHODS:
        per_rank = [statistics.median(r["sent"][m]) for r in ranks]
        mean = sum(per_rank) / len(per_rank)
        rows[m] = {"label": LABELS[m], "step_ms": round(med[m] * 1e3, 3), "vs_torch_ddp": round(med[m] / med["torch_ddp"], 3),
                   "sent_mib_per_rank_step": round(mean / 2**20, 3),
                   "sent_max_rank_mib": round(max(per_rank) / 2**20, 3),
                   "sent_over_gradient": round(mean / grad, 3)}
    return rows


def mnist_label(reduce, sync_every):
    if reduce == "allreduce":
        return reduce
    return f"{reduce}, " + (f"sync every {sync_every}" if sync_every else "sync before eval only")


def mnist_compare(epochs, batch, timeout, mnist_dir, quick):
    """Per-epoch loss and test accuracy of the Go trainer for each of MNIST_RUNS."""
    import mnist as bench_mnist  # bench/mnist.py: data, trainer build, launch
    sys.path.insert(0, os.path.join(bench_mnist.ROOT, "examples", "mnist"))
    from plot import read_metrics
    opts = SimpleNamespace(epochs=epochs, batch_size=batch, timeout=timeout, target=0.97)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mnist")
        size = ["--train-count", "2000", "--test-count", "500"] if quick and not mnist_dir else []
        kind = bench_mnist.prepare(data, mnist_dir, extra=size)
        bench_mnist.build_go_trainer()
        for reduce, k in MNIST_RUNS:
            label = mnist_label(reduce, k)
            print(f"MNIST, {MNIST_RANKS} ranks, {label}...", flush=True)
            metrics = os.path.join(tmp, f"{reduce}-{k}.jsonl")
            r = bench_mnist.run_trainer(bench_mnist.GO_TRAINER, MNIST_RANKS, data, opts,
                                        ["--reduce", reduce, "--sync-every", str(k), "--metrics", metrics])
            rows = read_metrics(metrics)
            runs.append({"label": label, "reduce": reduce, "sync_every": k, "wall_s": r["wall_s"],
                         "epochs": [{f: row[f] for f in ("epoch", "step", "loss", "test_accuracy")}
                                    for row in rows]})
    return kind, runs


def mnist_table(runs):
    epochs = len(runs[0]["epochs"])
    headers = ["reduction"] + [f"acc e{e + 1}" for e in range(epochs)] + ["final loss", "wall s"]
    return table(headers, [[r["label"], *(f"{e['test_accuracy']:.4f}" for e in r["epochs"]),
                            f"{r['epochs'][-1]['loss']:.4f}", f"{r['wall_s']:.1f}"] for r in runs])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 ranks only, 1 round of 2 steps; MNIST 2 epochs of 2000 records")
    ap.add_argument("--worlds", help="rank counts (default 4,8; --quick 4)")
    ap.add_argument("--models", default=",".join(MODELS), help="bench/reducer's models (default a,b)")
    ap.add_argument("--rounds", type=int, default=0, help="rounds of all methods (default 4, --quick 1)")
    ap.add_argument("--iters", type=int, default=0, help="timed steps per method per round (default 4, --quick 2)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per job (default 900)")
    ap.add_argument("--no-mnist", action="store_true", help="skip the MNIST comparison")
    ap.add_argument("--mnist-only", action="store_true", help="only the MNIST comparison")
    ap.add_argument("--mnist-epochs", type=int, default=0, help="MNIST epochs (default 5, --quick 2)")
    ap.add_argument("--mnist-batch", type=int, default=64, help="MNIST global batch (default 64)")
    ap.add_argument("--mnist-dir", default=os.environ.get("MNIST_DIR"),
                    help="real MNIST IDX files (default: synthetic digits, 10000 + 2000; --quick 2000 + 500)")
    ap.add_argument("--worker", nargs=4, metavar=("MODEL", "ROUNDS", "ITERS", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        key, rounds, iters, threads = args.worker
        return worker(key, int(rounds), int(iters), int(threads))
    args.worlds = args.worlds or ("4" if args.quick else ",".join(map(str, WORLDS)))
    try:
        worlds = [int(w) for w in args.worlds.split(",")]
    except ValueError:
        ap.error(f"--worlds: comma-separated rank counts, got {args.worlds!r}")
    models = args.models.split(",")
    if any(w < 2 for w in worlds):
        ap.error("--worlds: each rank count must be at least 2")
    if not models or any(m not in MODELS for m in models):
        ap.error(f"--models: choose from {', '.join(MODELS)}")
    rounds = args.rounds or (1 if args.quick else 4)
    iters = args.iters or (2 if args.quick else 4)

    if args.no_mnist and args.mnist_only:
        ap.error("--no-mnist and --mnist-only exclude each other")
    start = time.time()
    if not args.mnist_only:
        steps_and_bytes(args, worlds, models, rounds, iters)
    if not args.no_mnist:
        epochs = args.mnist_epochs or (2 if args.quick else 5)
        kind, runs = mnist_compare(epochs, args.mnist_batch, args.timeout, args.mnist_dir, args.quick)
        print(f"\nMNIST MLP 784-128-10 (Go trainer), {kind}, {MNIST_RANKS} ranks, global batch "
              f"{args.mnist_batch}, {epochs} epochs: test accuracy per epoch (gossip: replicas averaged "
              "before each evaluation)\n")
        print(mnist_table(runs))
        path = save("gossip-mnist" + ("-quick" if args.quick else ""),
                    {"data": kind, "ranks": MNIST_RANKS, "batch_size": args.mnist_batch, "epochs": epochs,
                     "command": "python bench/gossip.py " + " ".join(sys.argv[1:]), "runs": runs})
        print(f"wrote {os.path.relpath(path)}")
    print(f"done in {time.time() - start:.0f} s")


def steps_and_bytes(args, worlds, models, rounds, iters):
    import torch
    start = time.time()
    report = {"backend": "gloo", "device": "cpu", "torch": torch.__version__, "threads_per_rank": 1,
              "rounds": rounds, "iterations_per_round": iters, "bucket_cap_mb": 25,
              "command": "python bench/gossip.py " + " ".join(sys.argv[1:]),
              "statistic": "median step time (zero_grad + forward + backward + gradient sync), slower rank; "
                           "bytes written per rank per step (/proc/self/io wchar), median over rounds, "
                           "mean over ranks",
              "worlds": {}}
    for world in worlds:
        report["worlds"][str(world)] = {}
        for key in models:
            cfg = MODELS[key]
            print(f"{world} ranks, model ({key}): {len(METHODS)} methods taking turns...", flush=True)
            ranks = run_job(world, key, rounds, iters, args.timeout)
            rows = summarize(ranks)
            grad_mib = ranks[0]["grad_bytes"] / 2**20
            report["worlds"][str(world)][key] = {"desc": cfg["desc"], "batch_per_rank": cfg["batch"],
                                                 "gradient_mib": round(grad_mib, 3), "rows": rows}
            print(f"\n{world} ranks, ({key}) {cfg['desc']}, batch {cfg['batch']} per rank, "
                  f"gradient {grad_mib:.1f} MiB; ring allreduce ideal 2(p-1)/p = {2 * (world - 1) / world:.2f}x\n")
            print(table(["method", "step ms", "vs torch DDP", "MiB sent/rank/step", "x gradient"],
                        [[LABELS[m], f"{r['step_ms']:.1f}", f"{r['vs_torch_ddp']:.2f}x",
                          f"{r['sent_mib_per_rank_step']:.2f}", f"{r['sent_over_gradient']:.2f}"]
                         for m, r in rows.items()]), flush=True)
    print("\nMiB sent: bytes each rank wrote during the timed steps (/proc/self/io wchar) / steps, "
          "mean over ranks; x gradient: that over the model's gradient size")
    partial = worlds != list(WORLDS) or models != list(MODELS) or args.quick
    name = "gossip" + ("-" + ("quick" if args.quick else "") + "".join(map(str, worlds)) + "".join(models)
                       if partial else "")
    path = save(name, report)
    print(f"wrote {os.path.relpath(path)} in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
