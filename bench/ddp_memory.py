"""Memory that gradient_as_bucket_view saves, pybridge's DDP wrapper beside torch DDP, 2 ranks.

    python bench/ddp_memory.py [--width 2048] [--depth 3] [--steps 4]

With gradient_as_bucket_view (pybridge's default, torch's opt-in) each .grad is a view into
the flat buckets; with False it is a tensor of its own and the buckets are extra memory, as
large as the gradients. Each case runs in a fresh pair of processes: rank 0's resident set
(RSS) is read after the model is built, then after `steps` training steps, with glibc told to
return freed large blocks at once (MALLOC_MMAP_THRESHOLD_), so RSS follows live memory (SGD without
momentum, so the optimizer holds nothing), for both zero_grad(set_to_none=True) (torch's
default: autograd hands over a fresh gradient each step) and set_to_none=False. The table
gives the growth in MiB beside the model's parameter size; writes bench/results/ddp-memory.json.
"""

import argparse
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Ranks, progress, save, table  # noqa: E402

# pybridge's default (None): .grad a bucket view, autograd's large fresh gradients kept
# until the next backward (see DistributedDataParallel._attach); True: torch's memory.
CASES = [("pybridge", None), ("pybridge", True), ("pybridge", False), ("torch", True), ("torch", False)]
MiB = 1 << 20


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rank(rank, conn, who, view, none, width, depth, steps):
    import torch
    import torch.nn.functional as F
    from torch import nn
    torch.set_num_threads(1)
    if who == "pybridge":
        import pybridge
        pybridge.init(timeout=120)
        wrap = lambda m: pybridge.DistributedDataParallel(m, gradient_as_bucket_view=view)  # noqa: E731
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        wrap = lambda m: nn.parallel.DistributedDataParallel(m, gradient_as_bucket_view=view)  # noqa: E731
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])
    x, y = torch.randn(8, width), torch.randn(8, width)
    before = rss()
    ddp = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(steps):
        opt.zero_grad(set_to_none=none)
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    after = rss()
    conn.send({"growth": after - before, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    conn.recv()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    # Large blocks straight from mmap and back to the system when freed: without this, glibc
    # keeps freed blocks (the construction broadcast's staging copy, say) and RSS says little.
    os.environ.update({"MALLOC_MMAP_THRESHOLD_": str(64 << 10), "MALLOC_TRIM_THRESHOLD_": str(64 << 10)})
    params = a.depth * (a.width * a.width + a.width) * 4
    rows, out = [], []
    for none in (True, False):
        for who, view in CASES:
            progress(f"{who} gradient_as_bucket_view={view} set_to_none={none}")
            ranks = Ranks(_rank, 2, args=(who, view, none, a.width, a.depth, a.steps), name=who)
            got = ranks.ask(300)[0]
            ranks.close()
            out.append({"who": who, "gradient_as_bucket_view": view, "set_to_none": none, **got})
            rows.append([who, str(view), str(none), f"{got['growth'] / MiB:.1f}", f"{got['growth'] / params:.2f}"])
    print(f"model: {a.depth} layers of {a.width}x{a.width}, parameters {params / MiB:.1f} MiB; "
          f"{a.steps} steps, rank 0's RSS growth from wrapping on")
    print(table(["wrapper", "gradient_as_bucket_view", "zero_grad set_to_none", "RSS growth MiB",
                 "x parameter size"], rows))
    save("ddp-memory", {"width": a.width, "depth": a.depth, "steps": a.steps, "param_bytes": params,
                        "cases": out})


if __name__ == "__main__":
    main()
