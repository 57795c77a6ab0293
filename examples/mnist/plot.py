"""Plot training curves from the trainers' --metrics files (one JSON line per epoch).

    python examples/mnist/plot.py build/go-2ranks.jsonl build/py-2ranks.jsonl --out curves.svg

Each file is one curve, labelled with its file name (or --labels). Two panels: training loss
and test accuracy per epoch (per round for federated.py's files). Needs matplotlib (pip install 'pybridge[plot]').
"""

import argparse
import json
import os
import sys


def read_metrics(path):
    """The epoch records of a --metrics file, in order; a clear error for a bad line."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows.append({k: row[k] for k in (x_of(row), "loss", "test_accuracy")} | row)
            except (ValueError, KeyError, TypeError) as exc:
                raise SystemExit(f"{path}:{n}: not a metrics line (need epoch or round, loss, "
                                 f"test_accuracy): {exc}")
    if not rows:
        raise SystemExit(f"{path}: no epochs recorded")
    return rows


def x_of(row):
    """The x axis of a metrics row: federated.py counts rounds, the trainers epochs."""
    return "round" if "round" in row else "epoch"


def figure(plt, curves, title=None):
    """The two-panel figure of [(label, metrics rows)] (bench/charts.py draws it too)."""
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(9, 3.4))
    for label, rows in curves:
        xs = [r[x_of(r)] for r in rows]
        loss_ax.plot(xs, [r["loss"] for r in rows], marker="o", ms=3, label=label)
        acc_ax.plot(xs, [r["test_accuracy"] for r in rows], marker="o", ms=3, label=label)
    x = " or ".join(sorted({x_of(r) for _, rows in curves for r in rows}))
    loss_ax.set(xlabel=x, ylabel="training loss", title="loss")
    acc_ax.set(xlabel=x, ylabel="test accuracy", title="test accuracy")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def plot(curves, out, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"svg.hashsalt": "pybridge", "font.size": 9})
    fig = figure(plt, curves, title)
    fig.tight_layout()
    fig.savefig(out, metadata={"Date": None} if out.endswith(".svg") else None)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="--metrics files written by main.go or train.py")
    p.add_argument("--labels", help="comma-separated curve labels (default: the file names)")
    p.add_argument("--title", help="figure title")
    p.add_argument("--out", default="curves.svg", help="output image, .svg or .png (default curves.svg)")
    opts = p.parse_args(argv)
    labels = opts.labels.split(",") if opts.labels else [os.path.splitext(os.path.basename(f))[0]
                                                         for f in opts.files]
    if len(labels) != len(opts.files):
        raise SystemExit(f"{len(labels)} labels for {len(opts.files)} files")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("plot.py needs matplotlib: pip install 'pybridge[plot]'") from None
    plot([(label, read_metrics(f)) for label, f in zip(labels, opts.files)], opts.out, opts.title)
    print(opts.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
