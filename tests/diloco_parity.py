"""The DiLoCo runs that C (tests/c/diloco.c) and Go (go/diloco_test.go) repeat through the C ABI,
and the Python DiLoCo's results for them, kept in tests/data/diloco_parity.json.

A model of four float32 tensors (35, 5, 15 and 3 elements, as diloco_reference.py's), the same
on every rank at the start; an inner step that C, Go and Python write the same way in float32
(each element moves a quarter of the way to a target that depends on the rank, the step, the
tensor and the element); STEPS inner steps under each configuration of CONFIGS on 2 and 3
ranks. tests/test_capi_diloco.py checks that the file holds what the Python DiLoCo computes
now, and that the C program's weights match it; the Go test reads it.

    python tests/diloco_parity.py      # writes tests/data/diloco_parity.json (after a change of the core)
"""

import json
import os

import numpy as np

SIZES = [35, 5, 15, 3]
STEPS = 12
WORLDS = (2, 3)
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "diloco_parity.json")

# name -> pb_diloco_options fields besides their defaults (and sync_every): the C and Go
# programs give the same, by these names.
CONFIGS = {
    "plain": {"sync_every": 4},
    "streaming": {"sync_every": 4, "fragments": 2, "delay": 1, "alpha": 0.5},
    "int4": {"sync_every": 3, "quantization": "int4", "block_size": 8, "error_feedback": True,
             "outer_lr": 0.5, "outer_momentum": 0.8, "outer_nesterov": False},
}


def initial():
    """The starting weights: ((i * 13 + j * 7) % 17 - 8) * 0.05, in float32."""
    return [np.array([((i * 13 + j * 7) % 17 - 8) for j in range(n)], dtype=np.float32) * np.float32(0.05)
            for i, n in enumerate(SIZES)]


def inner_step(params, rank, step):
    """p -= 0.25 (p - target), target = ((rank * 7 + step * 3 + i * 5 + j) % 11 - 5) * 0.1, float32."""
    for i, p in enumerate(params):
        j = np.arange(p.size)
        target = ((rank * 7 + step * 3 + i * 5 + j) % 11 - 5).astype(np.float32) * np.float32(0.1)
        p -= np.float32(0.25) * (p - target)


def diloco_kwargs(config):
    """A configuration as the Python DiLoCo's keywords."""
    from pybridge.algorithms.diloco import outer_sgd
    c = dict(config)
    outer = {k: c.pop(f"outer_{k}") for k in ("lr", "momentum", "nesterov") if f"outer_{k}" in c}
    if outer:
        c["outer_optimizer"] = outer_sgd(**outer)
    return c


def python_rank(rank, world):
    """{config: this rank's flat weights after STEPS steps, and the steps that synced}."""
    import torch

    import pybridge
    from pybridge.algorithms.diloco import DiLoCo
    pybridge.init(backend="gloo", timeout=60)
    out = {}
    for name, config in CONFIGS.items():
        arrays = initial()
        params = [torch.from_numpy(a) for a in arrays]  # shares the arrays' memory
        d = DiLoCo(params, **diloco_kwargs(config))
        synced = []
        for t in range(1, STEPS + 1):
            inner_step(arrays, rank, t)
            if d.step():
                synced.append(t)
        d.close()
        out[name] = {"weights": [float(x) for x in np.concatenate(arrays)], "synced": synced}
    pybridge.finalize()
    return out


def compute():
    """What the file holds: the runs' settings and, per world size, each rank's results."""
    from ranks import run_ranks
    results = {str(w): run_ranks(python_rank, w, timeout=120) for w in WORLDS}
    return {"sizes": SIZES, "steps": STEPS, "configs": CONFIGS, "results": results}


def load():
    with open(PATH) as f:
        return json.load(f)


if __name__ == "__main__":
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import diloco_parity  # by its name, so that the ranks find python_rank
    with open(PATH, "w") as f:
        json.dump(diloco_parity.compute(), f, indent=1)
        f.write("\n")
    print("wrote", PATH)
