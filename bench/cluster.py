"""Data-parallel training when the network is the bottleneck: a simulated cluster of 4 nodes
of 2 ranks (pybridge/testing/cluster.py: network namespaces, each node's link limited with tc htb),
pybridge-launch in every node, as on real machines. Needs root.

    python bench/cluster.py [--quick] [--rates 1000,10000,0] [--methods ...] [--steps N]

For each link rate (Mbit/s per node link, both directions; 0 = unlimited, which shows what
the 2 cores' compute alone allows) and each method, in one run:
- mean step time of model (b) of the reducer benchmark (3 layers of 2048x2048, 12.6 M
  parameters, 50 MB of float32 gradients; batch 8 per rank) and the bytes each node's
  link carried per step (measured on the link);
- the MNIST MLP's test accuracy after a fixed number of samples (synthetic MNIST from
  examples/mnist/prepare.py), at the first rate.

Methods: torch DDP, pybridge's reducer (allreduce), fp16 compression, the hierarchical hook
(sum in the node, allreduce among node leaders, broadcast in the node; also with fp16 on
the wire), PowerSGD (rank 4),
GossipGraD (nodes: the launcher's 2 ranks), local SGD (parameters averaged every 4 and 16
steps). Writes bench/results/cluster.json and a chart (bench/charts.py).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, free_port, progress, save, table  # noqa: E402

from pybridge.testing import cluster  # noqa: E402

NODES, PER_NODE = 4, 2
METHODS = ["torch_ddp", "pybridge", "fp16", "hierarchical", "hierarchical_fp16", "powersgd", "gossip",
           "localsgd4", "localsgd16"]
LABELS = {"torch_ddp": "torch DDP", "pybridge": "pybridge allreduce", "fp16": "pybridge fp16",
          "hierarchical": "pybridge hierarchical", "hierarchical_fp16": "pybridge hierarchical, fp16 wire",
          "powersgd": "pybridge PowerSGD r4", "gossip": "pybridge gossip",
          "localsgd4": "local SGD, average every 4", "localsgd16": "local SGD, average every 16"}
RANK = os.path.join(ROOT, "bench", "cluster_rank.py")


def run_case(c, args, timeout):
    """pybridge-launch RANK args in every node; the RESULT lines, or raises with the output."""
    # --no-prefix: the RESULT lines as the ranks print them
    procs = c.launch(["--no-prefix", RANK, *args], nproc_per_node=PER_NODE, port=free_port())
    try:
        outs = c.communicate(procs, timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{args[:2]} did not finish within {timeout} s") from None
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{args[:2]} failed:\n" + "\n".join(o[-2000:] for o in outs))
    return [json.loads(line[7:]) for o in outs for line in o.splitlines() if line.startswith("RESULT ")]


def prepare_data(folder, train):
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "mnist", "prepare.py"), "--out", folder,
                    "--train-count", str(train), "--test-count", "1000", "--shards", "4", "--seed", "0"],
                   check=True, capture_output=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and samples (a smoke run)")
    ap.add_argument("--rates", default="1000,10000,0", help="Mbit/s per node link; 0: unlimited")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--steps", type=int, default=None,
                    help="measured steps of model (b) (default 16, one period of local SGD's every 16; quick 4)")
    ap.add_argument("--samples", type=int, default=None, help="MLP training samples (default 16000; quick 2000)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per case")
    args = ap.parse_args(argv)
    ok, why = cluster.available()
    if not ok:
        raise SystemExit(f"bench/cluster.py: {why}")
    methods = args.methods.split(",")
    if any(m not in METHODS for m in methods):
        ap.error(f"--methods: choose from {', '.join(METHODS)}")
    rates = [int(r) for r in args.rates.split(",")]
    steps = args.steps or (4 if args.quick else 16)
    samples = args.samples or (2000 if args.quick else 16000)
    results = {"nodes": NODES, "ranks_per_node": PER_NODE, "steps": steps, "batch_per_rank": 8,
               "samples": samples, "rates": {}, "accuracy": {}}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mnist")
        prepare_data(data, 8000)
        for k, rate in enumerate(rates):
            per_rate = results["rates"][str(rate)] = {}
            with cluster.Cluster(NODES, rate_mbit=rate or None) as c:
                for m in methods:
                    progress(f"{rate or 'unlimited'} Mbit/s: {LABELS[m]}: model (b), {steps} steps")
                    try:
                        rows = run_case(c, ["step", m, str(steps), "8"], args.timeout)
                    except RuntimeError as exc:
                        per_rate[m] = {"failed": str(exc)[:300]}
                        progress(f"  failed: {str(exc)[:200]}")
                        continue
                    step = max(r["step"] for r in rows if r["rank"] == 0)
                    links = [r for r in rows if "tx" in r]
                    per_rate[m] = {"step_s": step, "link_mb_per_step": max(r["tx"] + r["rx"] for r in links) / 1e6}
                    progress(f"  step {step:.3f} s, {per_rate[m]['link_mb_per_step']:.1f} MB per node link")
                    if k == 0:
                        progress(f"{rate or 'unlimited'} Mbit/s: {LABELS[m]}: MLP, {samples} samples")
                        try:
                            mlp = run_case(c, ["mlp", m, data, str(samples)], args.timeout)
                            r0 = next(r for r in mlp if r["rank"] == 0)
                            results["accuracy"][m] = {"accuracy": r0["accuracy"], "seconds": r0["seconds"],
                                                      "rate": rate}
                            progress(f"  accuracy {r0['accuracy']:.4f} in {r0['seconds']:.1f} s")
                        except RuntimeError as exc:
                            results["accuracy"][m] = {"failed": str(exc)[:300]}
    report(results, methods, rates)
    save("cluster", results)  # and the chart (bench/charts.py)


def report(results, methods, rates):
    heads = ["method"] + [f"{r or 'unlimited'} Mbit/s: step s (x torch DDP), MB/link/step" for r in rates]
    heads.append("MLP accuracy")
    rows = []
    for m in methods:
        row = [LABELS[m]]
        for r in rates:
            got = results["rates"][str(r)].get(m, {})
            base = results["rates"][str(r)].get("torch_ddp", {}).get("step_s")
            if "step_s" not in got:
                row.append("failed")
                continue
            speed = f" ({base / got['step_s']:.2f}x)" if base else ""
            row.append(f"{got['step_s']:.3f}{speed}, {got['link_mb_per_step']:.1f}")
        acc = results["accuracy"].get(m, {})
        row.append(f"{acc['accuracy']:.4f}" if "accuracy" in acc else "-")
        rows.append(row)
    print(table(heads, rows))


if __name__ == "__main__":
    main()
