"""train.py of the sbatch test (tests/test_slurm.py; the script docs/clusters.md shows):
checkpoint.md's preemption loop, slowed down (72 s of steps) so that SLURM's warning comes
before the end: with `--time=2 --signal=USR1@60` it comes 30 to 60 s into each run (SLURM
looks every 30 s and sends it once the time left is within the warning plus 30 s). Step s subtracts 0.01 * (s + 1) from every weight,
so the final weights say whether a step ran twice or never. Rank 0 prints what happened:

    start at step S of 240 (resumed | fresh)
    preempted: saved step K
    done: 240 steps, w = -289.20
"""

import sys
import time

import torch

import pybridge
from pybridge.runtime import checkpoint, preempt

STEPS, STEP_SECONDS = 240, 0.3

g = pybridge.init(timeout=60)
w = torch.zeros(4, dtype=torch.float64)
got = checkpoint.restore("ck", tensors={"w": w})  # collective: the newest any rank holds
start = 0 if got is None else got.step
if g.rank == 0:
    print(f"start at step {start} of {STEPS} ({'fresh' if got is None else 'resumed'})", flush=True)
with preempt.Preemption() as watch:  # SIGUSR1 and SIGTERM
    for step in range(start, STEPS):
        grad = torch.full((4,), 0.01 * (step + 1), dtype=torch.float64)
        pybridge.all_reduce(grad, "avg")
        w -= grad
        time.sleep(STEP_SECONDS)  # ... the rest of a training step ...
        if watch.should_stop():  # collective: every rank, every step
            if g.rank == 0:
                checkpoint.save("ck", step + 1, tensors={"w": w})
                print(f"preempted: saved step {step + 1}", flush=True)
            pybridge.finalize()
            sys.exit(preempt.REQUEUE)
if g.rank == 0:
    print(f"done: {STEPS} steps, w = {w[0].item():.2f}", flush=True)
pybridge.finalize()
