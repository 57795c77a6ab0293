"""A rank of bench/observe.py's in-process comparison: the Python MNIST trainer's step
(examples/mnist/train.py's model, loader and DDP wrapper), in alternating blocks of steps
with recording off and on in the same processes, so that the machine's drift (which moves a
whole run by 10% here) falls on both alike. Prints one JSON line on rank 0."""

import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "mnist"))
import train  # noqa: E402

import pybridge  # noqa: E402
from pybridge import recordio as rio  # noqa: E402
from pybridge import observe  # noqa: E402
from pybridge.observe import state  # noqa: E402


def train_batches(data, world, batch=64):
    """The MNIST training shards' batches of this rank (global batch 64), epoch after epoch."""
    files = sorted(os.path.join(data, f) for f in os.listdir(data) if f.startswith("train-"))
    loader = rio.Loader(files, batch // world, shuffle=True, seed=1)
    while True:
        yield from loader


def main():
    data, trace, blocks, block = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    device = torch.device("cpu")
    g = pybridge.init()
    model = train.build_model(1)
    ddp = pybridge.DistributedDataParallel(model, bucket_cap_mb=0.004)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    batches = train_batches(data, g.size)

    def step():
        observe.scalar("loss", train.train_step(ddp, opt, next(batches), device))  # a no-op when off

    for _ in range(50):  # warm-up
        step()
    observe.start(trace, metrics_port=0)  # after init: starts now
    rec, state.REC = state.REC, None
    times = {"off": [], "on": []}
    cpu = {"off": [], "on": []}  # the main thread's CPU per step: steadier than wall time on a shared machine
    for i in range(2 * blocks):
        mode = "on" if i % 2 else "off"
        state.REC = rec if mode == "on" else None
        pybridge.barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(block):
            step()
        times[mode].append((time.perf_counter() - t0) / block * 1e3)
        cpu[mode].append((time.thread_time() - c0) / block * 1e3)
    state.REC = rec
    if g.rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        paired = statistics.median(on / off for on, off in zip(times["on"], times["off"]))
        print("AB " + json.dumps({"step_ms": med, "on_over_off": paired,
                                  "main_thread_cpu_ms": {k: statistics.median(v) for k, v in cpu.items()},
                                  "blocks_ms": times, "block": block}), flush=True)
    pybridge.finalize()


if __name__ == "__main__":
    main()
