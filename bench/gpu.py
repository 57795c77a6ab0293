"""GPU benchmark (needs CUDA; says so and skips without it): pybridge beside raw
torch.distributed and torch DDP on one GPU, in one run.

  nccl, 1 rank   all_reduce of 4 bytes (latency: pybridge's per-call overhead over NCCL)
                 and of 64 MiB (bandwidth), and a DDP training step
  gloo, 2 ranks  both on cuda:0: all_reduce of 16 MiB of CUDA memory, and a DDP step

Each case alternates the two implementations sample by sample in the same processes and
reports the median call (or step). Writes bench/results/gpu.json.

Usage: python bench/gpu.py [--steps N]
"""

import argparse
import json
import os
import statistics
import sys
import time

from common import launch, save, table

STEPS = 30


def _timed(fn, n, sync):
    times = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def _model(torch, width=2048, depth=4):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).cuda()


def worker(backend, steps):
    import torch
    import torch.distributed as dist

    import pybridge
    from pybridge.ddp.wrapper import DistributedDataParallel as PDDP
    g = pybridge.init(backend=backend, timeout=120)
    sync = torch.cuda.synchronize
    sizes = {"nccl": [1, 16 << 20], "gloo": [4 << 20]}[backend]  # float32 elements
    out = {}
    for n in sizes:
        x = torch.ones(n, device="cuda")
        cases = {"torch": lambda: dist.all_reduce(x), "pybridge": lambda: pybridge.all_reduce(x)}
        res = {k: [] for k in cases}
        for _ in range(3):  # alternate in rounds: drift hits both alike
            for k, fn in cases.items():
                fn()  # warm
                res[k] += _timed(fn, steps, sync)
        out[f"all_reduce {n * 4} B"] = {k: statistics.median(v) for k, v in res.items()}
    batch = torch.randn(64, 2048, device="cuda")
    nets = {"torch DDP": torch.nn.parallel.DistributedDataParallel(_model(torch)),
            "pybridge DDP": PDDP(_model(torch))}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in nets.items()}

    def step(k):
        opts[k].zero_grad(set_to_none=False)
        nets[k](batch).square().mean().backward()
        opts[k].step()
    res = {k: [] for k in nets}
    for _ in range(3):
        for k in nets:
            step(k)
            res[k] += _timed(lambda: step(k), steps, sync)
    out["DDP step (4x2048x2048 MLP)"] = {k: statistics.median(v) for k, v in res.items()}
    pybridge.finalize()
    if g.rank == 0:
        print("RESULT " + json.dumps(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="timed calls per sample (3 samples)")
    parser.add_argument("--worker", choices=["nccl", "gloo"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps)
    import torch
    if not torch.cuda.is_available():
        print("bench/gpu.py: skipped, no CUDA GPU is visible")
        return
    rows, report = [], {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cases": []}
    for backend, world in (("nccl", 1), ("gloo", 2)):
        outs = launch([sys.executable, os.path.abspath(__file__), "--worker", backend, "--steps",
                       str(args.steps)], world, timeout=600)
        result = json.loads(next(line for line in outs[0].splitlines() if line.startswith("RESULT "))[7:])
        for case, times in result.items():
            base, ours = times.get("torch", times.get("torch DDP")), times.get("pybridge", times.get("pybridge DDP"))
            rows.append([f"{backend} x{world}", case, f"{base * 1e6:.1f}", f"{ours * 1e6:.1f}", f"{ours / base:.3f}"])
            report["cases"].append({"backend": backend, "world": world, "case": case, "torch_s": base,
                                    "pybridge_s": ours})
    print(f"GPU: {report['device']}, torch {report['torch']}")
    print(table(["backend", "case", "torch us", "pybridge us", "ratio"], rows))
    print("results:", save("gpu", report))


if __name__ == "__main__":
    main()
