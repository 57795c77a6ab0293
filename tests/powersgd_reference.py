"""Reference for go/group_test.go's PowerSGD test: pybridge's Python Reducer with torch's own
powerSGD_hook, on 2 ranks, fed the same gradients as the Go test feeds its reducer
(g = sin(0.013 (j + 1)^2 + iteration + 7 rank + 3 param), float32: matrices of full
rank, so a rank-2 approximation is not exact). Prints one JSON line per
rank: the reduced gradients after each iteration."""

import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import run_ranks  # noqa: E402

SHAPES = [(16, 12), (16,), (4, 16)]
ITERATIONS = 4


def gradient(it, rank, i, n):
    return [float(math.sin(0.013 * (j + 1) ** 2 + it + 7 * rank + 3 * i)) for j in range(n)]


def rank_main(rank, world):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    import pybridge
    from pybridge.ddp.reducer import Reducer
    pybridge.init(backend="gloo", timeout=60)
    red = Reducer([(s, "float32") for s in SHAPES])
    red.register_comm_hook(psgd.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                              start_powerSGD_iter=2, warm_start=True, random_seed=0),
                           psgd.powerSGD_hook)
    out = []
    for it in range(ITERATIONS):
        for i, s in enumerate(SHAPES):
            n = math.prod(s)
            red.grad(i).copy_(torch.tensor(gradient(it, rank, i, n), dtype=torch.float32).view(s))
            red.mark_ready(i)
        red.finalize()
        out.append([red.grad(i).reshape(-1).tolist() for i in range(len(SHAPES))])
    pybridge.finalize()
    return out


if __name__ == "__main__":
    for rank, res in enumerate(run_ranks(rank_main, 2, timeout=120)):
        print(json.dumps({"rank": rank, "grads": res}))
