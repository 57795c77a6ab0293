"""What elastic training's in-memory state costs (pybridge/elastic.py, issue 25 part 1):
commit() and restore() of a model with its SGD momentum beside one training step of the
same model, for three model sizes, in one process.

    python bench/elastic.py [--quick]

A commit every N steps costs commit / (N x step) of the training time; the table gives the
N at which that is 1%. Writes bench/results/elastic.json.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import progress, save, table  # noqa: E402

from pybridge.elastic import State  # noqa: E402

SIZES = {"1M": (1024, 1), "17M": (2048, 4), "67M": (4096, 4)}  # width, layers of width x width


def timed(fn, repeat):
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def case(width, depth, repeat):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = torch.randn(32, width), torch.randn(32, width)

    def step():
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    step()  # momentum buffers exist from here on
    state = State(model=model, optimizer=opt, step=0)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "step_ms": timed(step, repeat) * 1e3, "commit_ms": timed(state.commit, repeat) * 1e3,
            "restore_ms": timed(state.restore, repeat) * 1e3, "committed_mb": state.committed_bytes / 1e6}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the smallest model only, 3 repeats")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sizes = {"1M": SIZES["1M"]} if args.quick else SIZES
    rows, results = [], {}
    for name, (width, depth) in sizes.items():
        progress(f"elastic: {name} parameters")
        r = results[name] = case(width, depth, 3 if args.quick else 7)
        every = r["commit_ms"] / (0.01 * r["step_ms"])
        rows.append([name, f"{r['committed_mb']:.0f} MB", f"{r['step_ms']:.1f}", f"{r['commit_ms']:.1f}",
                     f"{r['restore_ms']:.1f}", f"{r['commit_ms'] / r['step_ms']:.2f}", f"{every:.0f}"])
    print(table(["model", "commit size", "step ms (batch 32)", "commit ms", "restore ms",
                 "commit / step", "commit every N steps for 1%"], rows))
    save("elastic", {"models": results, "threads": 1})


if __name__ == "__main__":
    main()
