"""Hierarchical allreduce and local SGD against plain allreduce: training step time and
bytes written per rank per step, on 4 loopback ranks pretending to be 2 nodes of 2.

    python bench/hierarchical.py [--quick] [--models a,b] [--ranks-per-node 2] [--rounds N] [--iters N]

Methods, each a full training step (zero_grad, forward, backward, gradient sync, SGD step)
on bench/reducer.py's models: torch DDP (the baseline), pybridge's DDP wrapper with its
allreduce, with the hierarchical hook (float32 and fp16 on the wire), and local SGD (no
gradient sync; parameters averaged every 4 and every 16 steps, pybridge.algorithms.local_sgd). One job
of 4 ranks holds them all (each its own copy of the model); they take turns, round by round,
so machine noise hits all.

Local SGD's step time is amortized over its period: the median local step plus
(median averaging step - median local step) / period. Bytes are measured (each rank's
`wchar` from /proc/self/io around the timed steps, gloo's socket writes included); for
every method two figures per node per step: the payload it puts into collectives over
groups that span nodes (counted by the hierarchical hook for its leaders' allreduce; each
rank's gradient for allreduce; each rank's parameters on local SGD's averaging steps),
and the bytes that really went between ranks of different pretend nodes (measured: the
kernel's bytes_sent of every TCP connection, `ss -tinp`, each connection's peer rank found
from the other ranks' tables). The two differ: gloo's ring allreduce over ranks numbered
node by node sends 2(p-1)/p of the gradient over each node's link whatever the ranks per
node, so the hierarchy lowers that only to 2(n-1)/n (n nodes). On loopback every byte crosses the same
loopback and the 2 cores are shared by 4 ranks, so this measures the compute and
copy overhead of each method; what a slow node link does to them is for bench/cluster.

Writes bench/results/hierarchical.json (a partial run: hierarchical-<models>.json) and its chart.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import launch, reports, save, table  # noqa: E402
from gossip import written_bytes  # noqa: E402
from reducer import MODELS, build  # noqa: E402

WORLD = 4
METHODS = ["torch_ddp", "pybridge", "hierarchical", "hierarchical_fp16", "local_sgd4", "local_sgd16"]
LABELS = {"torch_ddp": "torch DDP", "pybridge": "pybridge allreduce", "hierarchical": "hierarchical",
          "hierarchical_fp16": "hierarchical, fp16 wire", "local_sgd4": "local SGD, average every 4",
          "local_sgd16": "local SGD, average every 16"}
RESULT = "HIER-BENCH "  # the line a worker rank reports on


def tcp_sent():
    """{(local address, peer address): bytes sent} of this process's TCP connections, from
    the kernel's tcp_info (`ss -tinp`): gloo's pair connections, so bytes per rank pair."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    me, got = f"pid={os.getpid()},", {}
    for line, info in zip(out, out[1:] + [""]):
        if me in line:
            m = re.search(r"bytes_sent:(\d+)", info)
            if m:
                fields = line.split()
                got[f"{fields[3]} {fields[4]}"] = int(m.group(1))
    return got


def make_step(method, model, per_node):
    """(step function, hook state or averager or None) for one method."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as TDDP

    import pybridge
    from pybridge.algorithms import comm_hooks, local_sgd
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    extra, wrapped = None, model
    if method == "torch_ddp":
        wrapped = TDDP(model, bucket_cap_mb=25)
    elif method.startswith("local_sgd"):
        extra = local_sgd.PeriodicModelAverager(period=int(method[len("local_sgd"):]))
    else:
        wrapped = pybridge.DistributedDataParallel(model, bucket_cap_mb=25)
        if method.startswith("hierarchical"):
            spec = comm_hooks.HierarchicalHook(per_node, compression="fp16" if method.endswith("fp16") else None)
            extra = spec.build(pybridge.current())[0]
            wrapped.register_comm_hook(extra, comm_hooks.hierarchical_hook)

    def step(x):
        model.zero_grad()
        wrapped(x).square().mean().backward()
        opt.step()
        if method.startswith("local_sgd"):
            return extra.average_parameters(model.parameters())
        return None
    return step, extra


def worker(key, rounds, iters, per_node):
    """One rank: every method's timed steps and bytes; prints RESULT + JSON."""
    import warnings
    warnings.filterwarnings("ignore")
    import torch

    import pybridge
    torch.set_num_threads(1)
    pybridge.init(backend="gloo", timeout=600)
    rank = pybridge.rank()
    cfg = MODELS[key]
    x = torch.randn(cfg["batch"], cfg["width"], generator=torch.Generator().manual_seed(rank))
    steps = {m: make_step(m, build(cfg), per_node) for m in METHODS}
    times = {m: [] for m in METHODS}
    averaging = {m: [] for m in METHODS}  # local SGD: times of the steps that averaged
    sent = {m: [] for m in METHODS}
    cross = {m: [] for m in METHODS}
    pairs = {m: {} for m in METHODS}  # bytes per connection over all timed steps
    nsteps = {m: 0 for m in METHODS}
    for r in range(rounds):
        for m in METHODS[r % len(METHODS):] + METHODS[:r % len(METHODS)]:
            step, extra = steps[m]
            step(x)  # warm-up after the other methods' turns
            pybridge.barrier()
            before, crossed, conns = written_bytes(), getattr(extra, "sent", {}).get("cross", 0), tcp_sent()
            for _ in range(iters):
                t0 = time.perf_counter()
                did = step(x)
                (averaging if did else times)[m].append(time.perf_counter() - t0)
            sent[m].append((written_bytes() - before) / iters)
            pybridge.barrier()  # the last step's messages are sent everywhere
            for k, v in tcp_sent().items():
                pairs[m][k] = pairs[m].get(k, 0) + v - conns.get(k, 0)
            nsteps[m] += iters
            cross[m].append((getattr(extra, "sent", {}).get("cross", 0) - crossed) / iters)
    pybridge.barrier()
    grad_bytes = sum(p.numel() * p.element_size() for p in build(cfg).parameters())
    for m in METHODS:
        if hasattr(steps[m][1], "close"):
            steps[m][1].close()
    pybridge.finalize()
    print(RESULT + json.dumps({"rank": rank, "grad_bytes": grad_bytes, "times": times, "averaging": averaging,
                               "sent": sent, "cross": cross, "pairs": pairs, "steps": nsteps}), flush=True)


def run_job(key, rounds, iters, per_node, timeout):
    outs = launch([sys.executable, os.path.abspath(__file__), "--worker", key, str(rounds), str(iters), str(per_node)],
                  WORLD, timeout, extra_env={"OMP_NUM_THREADS": "1"})
    return reports(outs, RESULT, f"the job on model ({key})")


def step_seconds(ranks, m):
    """The slower rank's median step; local SGD's amortized over its period (see the module doc)."""
    per_rank = []
    for r in ranks:
        local = statistics.median(r["times"][m])
        if m.startswith("local_sgd") and r["averaging"][m]:
            period = int(m[len("local_sgd"):])
            local += (statistics.median(r["averaging"][m]) - local) / period
        per_rank.append(local)
    return max(per_rank)


def link_bytes(ranks, m, per_node):
    """Bytes per node per step that went over TCP connections between ranks of different
    (pretend) nodes, measured: each rank's connections, the peer's rank found from the
    address it listens on in the other ranks' tables."""
    owner = {}
    for rank, r in enumerate(ranks):
        for key in r["pairs"][m]:
            owner[key.split()[0]] = rank
    total = 0
    for rank, r in enumerate(ranks):
        for key, n in r["pairs"][m].items():
            peer = owner.get(key.split()[1])
            if peer is not None and peer // per_node != rank // per_node:
                total += n
    return total / (len(ranks) // per_node) / ranks[0]["steps"][m]


def cross_node_payload(ranks, m, per_node):
    """Bytes per node per step put into collectives over groups that span nodes: counted by
    the hierarchical hook (its leaders' allreduce); for the others every rank's whole
    gradient (allreduce) or parameters (local SGD, on its averaging steps)."""
    grad = ranks[0]["grad_bytes"]
    if m.startswith("hierarchical"):
        return sum(statistics.median(r["cross"][m]) for r in ranks) / (len(ranks) // per_node)
    if m.startswith("local_sgd"):
        r = ranks[0]
        return per_node * grad * len(r["averaging"][m]) / (len(r["averaging"][m]) + len(r["times"][m]))
    return per_node * grad


def summarize(ranks, per_node):
    grad = ranks[0]["grad_bytes"]
    secs = {m: step_seconds(ranks, m) for m in METHODS}
    rows = {}
    for m in METHODS:
        written = [statistics.median(r["sent"][m]) for r in ranks]
        node_cross = cross_node_payload(ranks, m, per_node)
        rows[m] = {"label": LABELS[m], "step_ms": round(secs[m] * 1e3, 3),
                   "vs_torch_ddp": round(secs[m] / secs["torch_ddp"], 3),
                   "sent_mib_per_rank_step": round(sum(written) / len(written) / 2**20, 3),
                   "sent_over_gradient": round(sum(written) / len(written) / grad, 3),
                   "cross_mib_per_node_step": round(node_cross / 2**20, 3),
                   "link_mib_per_node_step": round(link_bytes(ranks, m, per_node) / 2**20, 3)}
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--quick", action="store_true", help="smoke run: model (a) only, 1 round of 4 steps")
    ap.add_argument("--models", default=None, help="bench/reducer's models (default a,b; --quick a)")
    ap.add_argument("--ranks-per-node", type=int, default=2, help="pretend node size (default 2)")
    ap.add_argument("--rounds", type=int, default=0, help="rounds of all methods (default 4, --quick 1)")
    ap.add_argument("--iters", type=int, default=0, help="timed steps per method per round (default 16, --quick 4)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per job (default 900)")
    ap.add_argument("--worker", nargs=4, metavar=("MODEL", "ROUNDS", "ITERS", "PER_NODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        key, rounds, iters, per_node = args.worker
        return worker(key, int(rounds), int(iters), int(per_node))
    models = (args.models or ("a" if args.quick else ",".join(MODELS))).split(",")
    if any(m not in MODELS for m in models):
        ap.error(f"--models: choose from {', '.join(MODELS)}")
    if args.ranks_per_node < 1 or WORLD % args.ranks_per_node:
        ap.error(f"--ranks-per-node must divide {WORLD}")
    rounds = args.rounds or (1 if args.quick else 4)
    iters = args.iters or (4 if args.quick else 16)
    import torch
    start = time.time()
    report = {"backend": "gloo", "device": "cpu", "torch": torch.__version__, "threads_per_rank": 1,
              "ranks_per_node": args.ranks_per_node, "rounds": rounds, "iterations_per_round": iters,
              "bucket_cap_mb": 25, "command": "python bench/hierarchical.py " + " ".join(sys.argv[1:]),
              "title": f"hierarchical and local SGD, {WORLD} loopback ranks as nodes of {args.ranks_per_node}",
              "statistic": "median training step (zero_grad + forward + backward + sync + SGD step), slower "
                           "rank; local SGD amortized over its period; bytes written per rank per step "
                           "(/proc/self/io wchar), median over rounds, mean over ranks",
              "chart_bytes": ["link_mib_per_node_step", "MiB over node links per node per step"],
              "worlds": {str(WORLD): {}}}
    for key in models:
        cfg = MODELS[key]
        print(f"{WORLD} ranks, model ({key}): {len(METHODS)} methods taking turns...", flush=True)
        ranks = run_job(key, rounds, iters, args.ranks_per_node, args.timeout)
        rows = summarize(ranks, args.ranks_per_node)
        grad_mib = ranks[0]["grad_bytes"] / 2**20
        report["worlds"][str(WORLD)][key] = {"desc": cfg["desc"], "batch_per_rank": cfg["batch"],
                                             "gradient_mib": round(grad_mib, 3), "rows": rows}
        print(f"\n({key}) {cfg['desc']}, batch {cfg['batch']} per rank, gradient {grad_mib:.1f} MiB, "
              f"{WORLD} ranks as {WORLD // args.ranks_per_node} nodes\n")
        print(table(["method", "step ms", "vs torch DDP", "MiB written/rank/step", "payload to cross-node groups",
                     "MiB over node links/node/step"],
                    [[r["label"], f"{r['step_ms']:.1f}", f"{r['vs_torch_ddp']:.2f}x",
                      f"{r['sent_mib_per_rank_step']:.2f}", f"{r['cross_mib_per_node_step']:.2f}",
                      f"{r['link_mib_per_node_step']:.2f}"]
                     for r in rows.values()]), flush=True)
    print("\nMiB written: measured (/proc/self/io wchar), all of a rank's writes. Payload to cross-node groups "
          "(MiB/node/step): what a node puts into collectives over groups that span nodes (counted by the hook; "
          "for allreduce and local SGD, each rank's gradient or parameters). MiB over node links: measured, "
          "bytes sent on TCP connections between ranks of different pretend nodes (ss -tinp), per node per step")
    name = "hierarchical" + ("" if models == list(MODELS) and not args.quick
                             else "-" + ("quick" if args.quick else "") + "".join(models))
    path = save(name, report)
    print(f"wrote {os.path.relpath(path)} in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
