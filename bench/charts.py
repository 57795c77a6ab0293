"""Charts of the benchmark results: one SVG next to each bench/results/NAME.json.

Every benchmark calls draw() when it saves its JSON (bench/common.py), so its chart is
always from the same run as its table. matplotlib is optional (`pip install
'pybridge[plot]'`): without it no chart is drawn and the benchmark says so once.

Usage: python bench/charts.py [NAME ...]   redraw from the saved JSON (default: all)
"""

import json
import os
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
COLORS = {"torch": "#7f7f7f", "torch DDP": "#7f7f7f", "pybridge-py": "#1f77b4", "pybridge": "#1f77b4",
          "pybridge-go": "#2ca02c", "Go": "#2ca02c", "plain read": "#7f7f7f"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    plt.rcParams.update({"svg.hashsalt": "pybridge", "figure.dpi": 100, "font.size": 9})
    return plt


def _finish(plt, fig, name):
    path = os.path.join(RESULTS, f"{name}.svg")
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})  # no timestamp: redrawing the same data changes nothing
    plt.close(fig)
    return path


def collectives(plt, data):
    """Bandwidth against message size, one panel per operation."""
    rows = [r for r in data["results"] if r["kind"] == "bandwidth"]
    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 3.6), squeeze=False)
    for ax, op in zip(axes[0], ops):
        mine = sorted((r for r in rows if r["op"] == op), key=lambda r: r["bytes"])
        for impl in mine[0]["seconds_median"]:
            xs = [r["bytes"] for r in mine if r["seconds_median"].get(impl)]
            ys = [r["bytes"] / r["seconds_median"][impl] / 1e9 for r in mine if r["seconds_median"].get(impl)]
            ax.plot(xs, ys, marker="o", ms=3, label=impl, color=COLORS.get(impl))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("GB/s (bytes / median call)")
        ax.set_title(f"{op}, 2 ranks, gloo")
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def reducer(plt, data):
    """Step time per method, one group of bars per model."""
    models = data["models"]
    methods = []
    for m in models.values():
        methods += [k for k in m["rows"] if k not in methods]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(methods)
    for j, method in enumerate(methods):
        have = [(i, m["rows"][method]["step_ms"]) for i, m in enumerate(models.values())
                if m["rows"].get(method, {}).get("step_ms") is not None]  # not failed or skipped
        xs = [i + j * width for i, _ in have]
        ys = [ms for _, ms in have]
        ax.bar(xs, ys, width, label=method.replace("_", " "))
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(models))])
    ax.set_xticklabels([f"({k}) {m['desc']}" for k, m in models.items()])
    ax.set_ylabel("ms per training step (lower is better)")
    ax.set_title(f"gradient reduction, {data.get('world', 2)} ranks, {data.get('backend', 'gloo')}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def recordio(plt, data):
    """Read throughput against record size: plain file read, pybridge reader and loader, Go."""
    rows = data["results"]
    comps = sorted({r["compressor"] for r in rows})
    fig, axes = plt.subplots(1, len(comps), figsize=(5 * len(comps), 3.6), squeeze=False)
    for ax, comp in zip(axes[0], comps):
        mine = [r for r in rows if r["compressor"] == comp]
        sizes = sorted({r["record_bytes"] for r in mine})
        plain = [next(r["plain_MBps"] for r in mine if r["record_bytes"] == s) for s in sizes]
        ax.plot(sizes, plain, marker="o", ms=3, label="plain read", color=COLORS["plain read"], ls="--")
        for api in ("reader", "loader"):
            pts = [(r["record_bytes"], r["pybridge_MBps"]) for r in mine if r["api"] == api]
            ax.plot(*zip(*pts), marker="o", ms=3, label=f"pybridge {api}")
        go = [(r["record_bytes"], r["go_bridge_MBps"]) for r in mine if r["api"] == "loader" and r.get("go_bridge_MBps")]
        if go:
            ax.plot(*zip(*go), marker="o", ms=3, label="Go loader (via the C ABI)", color=COLORS["Go"])
        ax.set_xscale("log")
        ax.set_xlabel("record size (bytes)")
        ax.set_ylabel("MB/s")
        ax.set_title(f"RecordIO read, compressor {comp}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def mnist(plt, data):
    """Test accuracy against wall time, per trainer and rank count."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for lang, runs in data["results"].items():
        for run in runs:
            ax.plot(run["epoch_end_s"], run["epoch_test_accuracy"], marker="o", ms=3,
                    label=f"{lang}, {run['ranks']} rank{'s' if run['ranks'] > 1 else ''}")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("test accuracy")
    ax.set_title("MNIST, accuracy per epoch")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def gossip(plt, data):
    """Step time and bytes sent per rank per step, per method, one group per (ranks, model)
    (gossip.py's and hierarchical.py's results)."""
    cases = [(w, k, m) for w, models in data["worlds"].items() for k, m in models.items()]
    methods = list(cases[0][2]["rows"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / len(methods)
    field, ylabel = data.get("chart_bytes", ("sent_mib_per_rank_step", "MiB sent per rank per step"))
    for ax, field, ylabel in ((axes[0], "step_ms", "ms per training step (lower is better)"), (axes[1], field, ylabel)):
        for j, method in enumerate(methods):
            ys = [m["rows"][method][field] for _, _, m in cases]
            label = cases[0][2]["rows"][method].get("label", method.replace("_", " "))
            ax.bar([i + j * width for i in range(len(cases))], ys, width, label=label)
        ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(cases))])
        ax.set_xticklabels([f"{w} ranks, ({k})" for w, k, _ in cases])
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title(data.get("title", f"GossipGraD vs allreduce, {data.get('backend', 'gloo')}") + ", step time",
                      fontsize=8)
    axes[1].set_title(ylabel.split(" (")[0] + " (measured)" if "chart_bytes" in data
                      else "bytes written per rank per step (measured)", fontsize=8)
    axes[0].legend(fontsize=8)
    return fig


def cluster(plt, data):
    """Throughput against torch DDP and bytes per node link per step, per method, one group
    of bars per link rate (bench/cluster.py)."""
    rates = list(data["rates"])
    methods = [m for m in data["rates"][rates[0]] if "step_s" in data["rates"][rates[0]][m]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / max(len(methods), 1)
    for ax, ylabel in ((axes[0], "throughput / torch DDP's (higher is better)"),
                       (axes[1], "MB per node link per step (measured)")):
        for j, m in enumerate(methods):
            ys = []
            for r in rates:
                row, base = data["rates"][r].get(m, {}), data["rates"][r].get("torch_ddp", {})
                if ax is axes[0]:
                    ys.append(base["step_s"] / row["step_s"] if "step_s" in row and "step_s" in base else 0)
                else:
                    ys.append(row.get("link_mb_per_step", 0))
            ours = [k for k in range(10) if k != 7]  # tab10 without its gray, which is torch DDP's
            color = COLORS["torch DDP"] if m == "torch_ddp" else plt.cm.tab10(ours[j % len(ours)])
            ax.bar([i + j * width for i in range(len(rates))], ys, width, label=m, color=color)
        ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(rates))])
        ax.set_xticklabels([f"{r} Mbit/s" if r != "0" else "unlimited" for r in rates])
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title(f"{data['nodes']} nodes x {data['ranks_per_node']} ranks, model (b): throughput")
    axes[1].set_title("bytes on each node's link per step")
    axes[0].legend(fontsize=7)
    return fig


def scaling(plt, data):
    """bench/scaling.py: speedup against nodes (per rate and method), and at the slowest rate
    with the most nodes each method's metric against training time and against bytes."""
    rows = data["rows"]
    models = [m for m in data["models"] if any(r["model"] == m for r in rows)]
    fig, axes = plt.subplots(len(models), 3, figsize=(14, 3.8 * len(models)), squeeze=False)
    styles = {10000: "-", 1000: "--", 100: ":"}
    methods = sorted({r["method"] for r in rows if r["method"] != "plain"})
    color = {m: plt.cm.tab10(i) for i, m in enumerate(methods)}
    color["plain"] = COLORS["torch"]
    for ax_row, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model]
        what = "test accuracy" if model == "mlp" else "validation loss (nats a byte)"
        for rate in sorted({r["rate_mbit"] for r in mine if r["rate_mbit"]}, reverse=True):
            for m in methods:
                pts = sorted((r["nodes"], r["speedup"]) for r in mine
                             if r["method"] in (m, "plain") and (r["rate_mbit"] == rate or r["nodes"] == 1)
                             and r.get("speedup") is not None)
                if len(pts) > 1:
                    ax_row[0].plot(*zip(*pts), styles.get(rate, "-"), marker="o", ms=3, color=color[m],
                                   label=f"{m}, {rate} Mbit/s")
        ns = sorted({r["nodes"] for r in mine})
        ax_row[0].plot(ns, ns, color="k", lw=0.5, label="linear")
        ax_row[0].set_xlabel("nodes")
        ax_row[0].set_ylabel("speedup in time to target vs 1 node")
        ax_row[0].set_title(f"{model}: speedup (strong scaling)")
        ax_row[0].legend(fontsize=6)
        rates = [r["rate_mbit"] for r in mine if r["rate_mbit"]]
        slow, most = (min(rates), max(r["nodes"] for r in mine)) if rates else (None, 1)
        for r in mine:
            if r["method"] == "plain" or (r["rate_mbit"] == slow and r["nodes"] == most):
                c = r["curve"]
                label = "1 node" if r["method"] == "plain" else r["method"]
                ax_row[1].plot([p[0] for p in c], [p[2] for p in c], color=color[r["method"]], label=label)
                if r["method"] != "plain":
                    per_sample = r["bytes_per_sample"]  # the busiest link, spread evenly over the run
                    ax_row[2].plot([max(p[1] * per_sample, 1) for p in c], [p[2] for p in c],
                                   color=color[r["method"]], label=label)
        ax_row[1].set_xscale("log")
        ax_row[1].set_xlabel("training seconds")
        ax_row[1].set_ylabel(what)
        ax_row[1].set_title(f"{model}: {most} nodes at {slow} Mbit/s, against time")
        ax_row[2].set_xscale("log")
        ax_row[2].set_xlabel("bytes on the busiest node link")
        ax_row[2].set_ylabel(what)
        ax_row[2].set_title(f"{model}: {most} nodes at {slow} Mbit/s, against bytes")
        for ax in ax_row:
            ax.grid(alpha=0.3)
        ax_row[1].legend(fontsize=7)
    return fig


def training_curves(plt, curves, title):
    """examples/mnist/plot.py's two panels (loss, test accuracy) of [(label, metrics rows)]."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "examples", "mnist"))
    from plot import figure
    return figure(plt, curves, title)


def gossip_mnist(plt, data):
    """Loss and test accuracy per epoch of each reduction."""
    return training_curves(plt, [(r["label"], r["epochs"]) for r in data["runs"]],
                           f"MNIST (Go trainer, {data['data']}), {data['ranks']} ranks: gossip vs allreduce")


def federated_mnist(plt, data):
    """Loss and test accuracy per round of each run."""
    return training_curves(plt, [(r["label"], r["rounds"]) for r in data["runs"]],
                           f"federated MNIST ({data['data']}), {data['clients']} clients of 2 digits, "
                           f"{data['per_round']} per round, {data['world'] - 1} workers")


def federated(plt, data):
    """Round time of each mode, every round a point and the median a bar."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    modes = data["modes"]
    for i, (mode, m) in enumerate(modes.items()):
        ax.bar(i, m["round_seconds_median"], 0.6, label=f"{mode} (idle {m['idle_fraction_median']:.0%})")
        ax.plot([i] * len(m["round_seconds"]), m["round_seconds"], "k.", ms=4)
    ax.set_xticks(range(len(modes)))
    ax.set_xticklabels(list(modes))
    ax.set_ylabel("seconds per round (lower is better)")
    setup = data["setup"]
    ax.set_title(f"federated rounds, {setup['clients']} clients, {setup['world'] - 1} workers "
                 f"(one {setup['slowdown']}x slower), gloo")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def federated_modes(plt, data):
    """Test accuracy against wall time, a panel per speed profile, a line per mode."""
    profiles = list(dict.fromkeys(r["profile"] for r in data["runs"]))
    fig, axes = plt.subplots(1, len(profiles), figsize=(4.5 * len(profiles), 3.4), sharey=True, squeeze=False)
    target = data["preset"]["target"]
    for ax, profile in zip(axes[0], profiles):
        for run in (r for r in data["runs"] if r["profile"] == profile):
            t = run["seconds_to_target"]
            label = f"{run['mode']} ({'not reached' if t is None else f'{t:.0f} s'})"
            ax.plot([x["elapsed"] for x in run["rounds"]], [x["test_accuracy"] for x in run["rounds"]], ".-",
                    ms=3, label=label)
        ax.axhline(target, color="k", lw=0.8, ls=":")
        ax.set_title(f"workers {profile}", fontsize=9)
        ax.set_xlabel("wall seconds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(f"test accuracy (target {target:g})")
    fig.suptitle(f"federated MNIST ({data['data']}), time to target accuracy by server mode", fontsize=10)
    return fig


def federated_strategies(plt, data):
    """Milliseconds per result and per step of each aggregation case."""
    names = list(data["seconds"])
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.barh(range(len(names)), [data["seconds"][n] * 1e3 for n in names],
            color=["C0" if n.startswith("add") else "C1" for n in names])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds (lower is better)")
    ax.set_title(f"federated server aggregation, {data['numel']} float32 elements", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return fig


DRAW = {"collectives": collectives, "reducer": reducer, "recordio": recordio, "mnist": mnist,
        "gossip": gossip, "hierarchical": gossip, "gossip-mnist": gossip_mnist, "federated": federated,
        "federated-mnist": federated_mnist, "cluster": cluster, "federated-modes": federated_modes,
        "federated-strategies": federated_strategies, "scaling": scaling}


def draw(name, data):
    """Write bench/results/NAME.svg for a benchmark's results; returns the path, or None when
    matplotlib is missing or the benchmark has no chart."""
    if name not in DRAW:
        return None
    try:
        plt = _plt()
    except ImportError:
        print("charts: matplotlib is not installed (pip install 'pybridge[plot]'); no chart drawn")
        return None
    return _finish(plt, DRAW[name](plt, data), name)


def main(names):
    for name in names or sorted(DRAW):
        path = os.path.join(RESULTS, f"{name}.json")
        if name not in DRAW:
            raise SystemExit(f"no chart for {name!r}; charts exist for: {', '.join(sorted(DRAW))}")
        if not os.path.exists(path):
            print(f"{name}: no results yet ({path})")
            continue
        with open(path) as f:
            print(draw(name, json.load(f)))


if __name__ == "__main__":
    main(sys.argv[1:])
