"""Python + pybridge DDP against Python + torch DDP in the same processes, by turns: the
MNIST trainer's step (examples/mnist/train.py's model, loader and SGD) through each wrapper
in alternating blocks of steps, on one torch process group that pybridge adopts. Separate
runs of the two differ by up to 10-15% on this machine whatever they run; side by side in
one run they see the same machine.

    OMP_NUM_THREADS=1 python -m pybridge.launch --nproc-per-node 2 bench/ddp_ab.py DATA [BLOCKS] [STEPS]

Prints one JSON line on rank 0 ("DDPAB {...}"): the median step time of each wrapper, the
median ratio of pairs of neighbouring blocks and the main thread's CPU per step (steadier than
wall time on a shared machine; where the wrappers' Python differs) (docs/benchmarks.md quotes it beside
bench/gotorch.py's separate runs).
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "mnist"))
import train  # noqa: E402

import pybridge  # noqa: E402
from observe_ab import train_batches  # noqa: E402


def main():
    data = sys.argv[1]
    blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    wrappers = {
        "torch": torch.nn.parallel.DistributedDataParallel(train.build_model(1), bucket_cap_mb=0.004),
        "pybridge": pybridge.DistributedDataParallel(train.build_model(1), bucket_cap_mb=0.004),
    }
    opts = {k: torch.optim.SGD(w.parameters(), lr=0.05, momentum=0.9) for k, w in wrappers.items()}
    batches = train_batches(data, world)

    def batch():
        return next(batches)

    for k in wrappers:  # warm-up
        for _ in range(30):
            train.train_step(wrappers[k], opts[k], batch(), device)
    times = {k: [] for k in wrappers}
    cpu = {k: [] for k in wrappers}
    order = list(wrappers)
    for i in range(blocks):
        for k in (order if i % 2 == 0 else order[::-1]):  # ABBA: neither always goes first
            dist.barrier()
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(steps):
                train.train_step(wrappers[k], opts[k], batch(), device)
            times[k].append((time.perf_counter() - t0) / steps * 1e3)
            cpu[k].append((time.thread_time() - c0) / steps * 1e3)
    if rank == 0:
        ratios = [p / t for p, t in zip(times["pybridge"], times["torch"])]
        print("DDPAB " + json.dumps({"step_ms": {k: statistics.median(v) for k, v in times.items()},
                                     "pybridge_over_torch": statistics.median(ratios),
                                     "main_thread_cpu_ms": {k: statistics.median(v) for k, v in cpu.items()},
                                     "blocks_ms": times,
                                     "steps_per_block": steps}), flush=True)
    for w in wrappers.values():
        del w
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
