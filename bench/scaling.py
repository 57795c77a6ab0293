"""The scaling experiment: 1, 2, 4 and 8 emulated nodes, each with its own CPU budget and
its own link (pybridge/testing/cluster.py), at 10 Gbit, 1 Gbit and 100 Mbit; time to a
target, bytes on each node's link per sample, speedup and parallel efficiency. Needs root.

    python bench/scaling.py [--models mlp,lm] [--nodes 1,2,4,8] [--rates 10000,1000,100]
                            [--methods torch_ddp,...] [--cpus 0.2] [--max-seconds S] [--quick]

One rank a node (pybridge-launch in every node). Each node gets CPUS CPUs (default 0.2, a
cgroup v1 cpu quota): 8 nodes then hold 1.6 of this machine's 2 cores, so N nodes have N
times one node's compute and the rest is left to the driver and the emulated network; the
quota is a ceiling, not a reservation, so other work on the machine can still slow the
nodes (each case records the CPU each node used and how often it was throttled).

Strong scaling: the global batch per step is the same at every node count (64 for the
MLP, 32 windows of 64 bytes for the LM), each of N nodes computing 1/N of it, so a step
is the same step at every N for DDP and 1 node's time to target is the number to beat.
Local SGD and DiLoCo use the same per-node batch (global / N); their replicas drift
between syncs, so their steps to target may differ.

Methods: torch DDP (torch.nn.parallel.DistributedDataParallel on gloo), pybridge DDP
(pybridge.DistributedDataParallel), local SGD (parameters averaged every 8 steps),
DiLoCo (H = 50, int4 pseudo-gradients in blocks of 128 with error feedback) and Streaming
DiLoCo (the same, 2 fragments, tau = 2). H = 50 rather than the paper's 500: these runs
last a few hundred steps. Inner optimizer AdamW everywhere (DiLoCo's paper's; lr 2e-3 MLP,
3e-3 LM), outer SGD Nesterov lr 0.7, momentum 0.9 (the paper's, DiLoCo's default).
1 node: plain AdamW training, no communication, the same for every method and rate (run
once per model; a link carries nothing on 1 node).

Targets: MLP test accuracy >= 0.92 (synthetic MNIST, examples/mnist/prepare.py); LM
validation loss <= 2.2 nats a byte (the standard library's .py files, last 10% held out).
Evaluations happen every 10 steps (DiLoCo: after each sync, every H or H/F steps; local
SGD: after each average), with the clock stopped.

Writes bench/results/scaling.json and bench/results/scaling.svg (bench/charts.py).
"""

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS, ROOT, free_port, progress, save, table  # noqa: E402

MODELS = ["mlp", "lm"]
METHODS = ["torch_ddp", "pybridge_ddp", "localsgd", "diloco", "streaming"]
LABELS = {"plain": "1 node (no communication)", "torch_ddp": "torch DDP", "pybridge_ddp": "pybridge DDP",
          "localsgd": "local SGD (every 8)", "diloco": "DiLoCo H50 int4", "streaming": "Streaming DiLoCo H50 F2 int4"}
NODES = [1, 2, 4, 8]
RATES = [10000, 1000, 100]
SETTINGS = {"localsgd_period": 8, "diloco_h": 50, "quantization": "int4", "streaming_fragments": 2,
            "streaming_delay": 2}
MODEL = {"mlp": {"global_batch": 64, "lr": 2e-3, "target": 0.92, "max_seconds": 120},
         "lm": {"global_batch": 32, "lr": 3e-3, "target": 2.2, "max_seconds": 150}}
QUICK = {"mlp": {"target": 0.85, "max_seconds": 30}, "lm": {"target": 2.6, "max_seconds": 40}}
LM_BYTES = 1 << 20
RANK = os.path.join(ROOT, "bench", "scaling_rank.py")


def csv(kind, text, choices=None):
    """A comma-separated list of `kind` (int or str), checked against choices."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise argparse.ArgumentTypeError("empty list")
    if kind is int:
        try:
            items = [int(s) for s in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
        if any(v <= 0 for v in items):
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    bad = [s for s in items if choices is not None and s not in choices]
    if bad:
        raise argparse.ArgumentTypeError(f"{', '.join(map(str, bad))} not among {', '.join(map(str, choices))}")
    return items


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=lambda s: csv(str, s, MODELS), default=MODELS)
    ap.add_argument("--nodes", type=lambda s: csv(int, s, [1, 2, 3, 4, 5, 6, 7, 8]), default=NODES,
                    help="node counts (1 to 8)")
    ap.add_argument("--rates", type=lambda s: csv(int, s), default=RATES, help="Mbit/s per node link")
    ap.add_argument("--methods", type=lambda s: csv(str, s, METHODS), default=METHODS)
    ap.add_argument("--cpus", type=float, default=0.2, help="CPUs per node (default 0.2)")
    ap.add_argument("--max-seconds", type=float, default=None, help="training seconds per case before giving up")
    ap.add_argument("--quick", action="store_true", help="a lower target and a shorter limit (a smoke run)")
    ap.add_argument("--out", default="scaling", help="results name (bench/results/NAME.json)")
    ap.add_argument("--append", action="store_true",
                    help="keep NAME.json's rows of other cases (this run's cases replace theirs)")
    args = ap.parse_args(argv)
    if not 0 < args.cpus <= 8:
        ap.error(f"--cpus must be in (0, 8], got {args.cpus}")
    if args.max_seconds is not None and args.max_seconds <= 0:
        ap.error(f"--max-seconds must be positive, got {args.max_seconds}")
    return args


def config(model, method, args):
    """The rank's settings for one case."""
    cfg = {**SETTINGS, **MODEL[model], **(QUICK[model] if args.quick else {})}
    if args.max_seconds:
        cfg["max_seconds"] = args.max_seconds
    # Evaluate where the replicas agree: after each average or sync.
    cfg["eval_every"] = {"localsgd": SETTINGS["localsgd_period"], "diloco": SETTINGS["diloco_h"],
                         "streaming": SETTINGS["diloco_h"] // SETTINGS["streaming_fragments"]}.get(method, 10)
    return cfg


def bytes_per_sample(ranks, samples):
    """Bytes on the busiest node link (sent + received) per global training sample."""
    if samples <= 0:
        raise ValueError(f"samples must be positive, got {samples}")
    return max(r["sent"] + r["received"] for r in ranks) / samples


def scaling(one_node_s, n_node_s, nodes):
    """(speedup, parallel efficiency) of a time to target on `nodes` nodes against 1 node's;
    (None, None) where either did not reach the target."""
    if one_node_s is None or n_node_s is None:
        return None, None
    if n_node_s <= 0 or nodes <= 0:
        raise ValueError(f"times and node counts must be positive, got {n_node_s} s on {nodes}")
    speedup = one_node_s / n_node_s
    return speedup, speedup / nodes


def summarize(case, ranks):
    """One case's row from its ranks' RESULT lines."""
    r0 = next(r for r in ranks if r["rank"] == 0)
    row = {**case, "reached": r0["reached"], "seconds": r0["seconds"], "samples": r0["samples"],
           "steps": r0["steps"], "samples_per_s": r0["samples"] / r0["seconds"] if r0["seconds"] else None,
           "seconds_to_target": r0.get("seconds_to_target"), "curve": r0["curve"],
           "link_bytes": [r["sent"] + r["received"] for r in sorted(ranks, key=lambda r: r["rank"])]}
    row["bytes_per_sample"] = bytes_per_sample(ranks, r0["samples"])
    return row


def add_scaling(rows):
    """Speedup and efficiency of every row against its model's 1-node row."""
    base = {r["model"]: r["seconds_to_target"] for r in rows if r["nodes"] == 1}
    for r in rows:
        r["speedup"], r["efficiency"] = scaling(base.get(r["model"]), r["seconds_to_target"], r["nodes"])
    return rows


def case_key(r):
    return r["model"], r["method"], r["nodes"], r["rate_mbit"]


def merge(path, new):
    """new's rows and failures, plus those of the saved results at path for other cases."""
    if not os.path.exists(path):
        return new
    with open(path) as f:
        old = json.load(f)
    mine = {case_key(r) for r in new["rows"] + new["failed"]}
    new["rows"] = [r for r in old["rows"] if case_key(r) not in mine] + new["rows"]
    new["failed"] = [r for r in old["failed"] if case_key(r) not in mine] + new["failed"]
    new["command"] = old.get("command", "") + " ; " + new["command"]
    new["wall_s"] += old.get("wall_s", 0)
    new["models"] = {**old.get("models", {}), **new["models"]}
    return new


def parse_results(outs):
    return [json.loads(line[7:]) for o in outs for line in o.splitlines() if line.startswith("RESULT ")]


def run_cluster(model, method, nodes, rate, data, cfg, cpus, timeout):
    from pybridge.testing import cluster
    with cluster.Cluster(nodes, rate_mbit=rate, cpus=cpus) as c:
        procs = c.launch(["--no-prefix", RANK, model, method, data, json.dumps(cfg)], nproc_per_node=1,
                         port=free_port())
        try:
            outs = c.communicate(procs, timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"did not finish within {timeout:.0f} s") from None
        if any(p.returncode for p in procs):
            raise RuntimeError("failed:\n" + "\n".join(o[-1500:] for o in outs))
        return parse_results(outs), [{k: n.get(k) for k in ("node",) + BUDGET_FIELDS} for n in c.report()]


BUDGET_FIELDS = ("cpus", "used_s", "periods", "throttled_periods")  # of cpulimit.CpuBudget.report()


def run_one_node(model, data, cfg, cpus, timeout):
    """The 1-node baseline: the rank alone under the same CPU budget, no network."""
    from pybridge.testing.cpulimit import CpuBudget
    with CpuBudget(cpus) as b:
        p = subprocess.run(b.wrap([sys.executable, RANK, model, "plain", data, json.dumps(cfg)]),
                           capture_output=True, text=True, timeout=timeout)
        if p.returncode:
            raise RuntimeError("failed:\n" + (p.stdout + p.stderr)[-1500:])
        return parse_results([p.stdout]), [{"node": 0, **{k: v for k, v in b.report().items()
                                                          if k in BUDGET_FIELDS}}]


def prepare(model, tmp):
    if model == "mlp":
        folder = os.path.join(tmp, "mnist")
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "mnist", "prepare.py"), "--out", folder,
                        "--synthetic", "--train-count", "8000", "--test-count", "1000", "--shards", "4",
                        "--seed", "0"], check=True, capture_output=True)
        return folder
    import scaling_rank
    path = os.path.join(tmp, "stdlib.txt")
    with open(path, "wb") as f:
        f.write(scaling_rank.text_corpus(sysconfig.get_paths()["stdlib"], LM_BYTES))
    return path


def main(argv=None):
    args = parse_args(argv)
    # The ranks import this checkout's pybridge, whatever an installed one points at.
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    from pybridge.testing import cluster, cpulimit
    for ok, why in (cluster.available(), cpulimit.available()):
        if not ok:
            raise SystemExit(f"bench/scaling.py: {why}")
    results = {"command": "python bench/scaling.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "cpus_per_node": args.cpus, "settings": SETTINGS, "models": {m: MODEL[m] for m in args.models},
               "quick": args.quick, "rows": [], "failed": []}
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            data = prepare(model, tmp)
            cases = [(1, None, "plain")] if 1 in args.nodes else []
            cases += [(n, r, m) for r in args.rates for n in args.nodes if n > 1 for m in args.methods]
            for nodes, rate, method in cases:
                cfg = config(model, method, args)
                case = {"model": model, "method": method, "nodes": nodes, "rate_mbit": rate}
                progress(f"{model}, {nodes} node(s), {rate or '-'} Mbit/s, {LABELS[method]} "
                         f"[{time.monotonic() - start:.0f} s]")
                timeout = cfg["max_seconds"] * 3 + 180  # startup under the CPU budget, evaluations
                try:
                    if nodes == 1:
                        ranks, cpu = run_one_node(model, data, cfg, args.cpus, timeout)
                    else:
                        ranks, cpu = run_cluster(model, method, nodes, rate, data, cfg, args.cpus, timeout)
                    row = summarize(case, ranks)
                    row["cpu"] = cpu
                except (RuntimeError, subprocess.TimeoutExpired, StopIteration) as exc:
                    results["failed"].append({**case, "why": str(exc)[:500]})
                    progress(f"  failed: {str(exc)[:300]}")
                    continue
                results["rows"].append(row)
                progress(f"  {'reached' if row['reached'] else 'NOT reached'}: {row['curve'][-1][2]:.4f} after "
                         f"{row['seconds']:.1f} s, {row['samples']} samples, {row['bytes_per_sample']:.0f} B/sample")
    results["wall_s"] = time.monotonic() - start
    if args.append:
        results = merge(os.path.join(RESULTS, f"{args.out}.json"), results)
    add_scaling(results["rows"])
    print(report(results["rows"]))
    save(args.out, results)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def report(rows):
    heads = ["model", "Mbit/s", "nodes", "method", "time to target s", "samples", "samples/s",
             "B/link/sample", "speedup", "efficiency"]
    out = [[r["model"], r["rate_mbit"] or "-", r["nodes"], LABELS[r["method"]],
            fmt(r["seconds_to_target"], ".1f") if r["reached"] else f"not in {r['seconds']:.0f}",
            r["samples"], fmt(r["samples_per_s"], ".0f"), fmt(r["bytes_per_sample"], ".0f"),
            fmt(r["speedup"], ".2f"), fmt(r["efficiency"], ".2f")] for r in rows]
    return table(heads, out)


if __name__ == "__main__":
    main()
