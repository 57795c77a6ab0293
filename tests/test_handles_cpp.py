"""libtorch tensors by handle from plain C++ programs, whose backward runs in libtorch with no
Python frame above it (the hooks take the interpreter's lock themselves):

- tests/cpp/handles.cpp on 3 ranks: every dtype exact, float64 broadcast bit-exact,
  refusals by name (NULL, undefined, non-contiguous, complex, no grad), an async
  allreduce that keeps the memory of a tensor the program deleted, and an elastic reset
  of an attached reducer after a rank is lost;
- examples/libtorch/train.cpp, the attached reducer in both modes with every hook, 20 steps:
  within 1e-5 of one process on the whole batch (the exact hooks), within 1e-5 of the
  Python twin under torch's DistributedDataParallel with torch's own hooks (allreduce,
  fp16, bf16, PowerSGD), and in bucket-view mode every .grad is its bucket after each step.
"""

import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from capi_loader import LIB_PATH, ROOT
from launcher import unprefixed
from ranks import run_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")

HOOKS = ["allreduce", "fp16", "bf16", "powersgd", "hierarchical", "gossip"]
EXACT = ["allreduce", "hierarchical", "gossip"]  # gossip on 2 ranks: one exact pairwise average
LINE = re.compile(r"^rank (\d+): (\w+)/(\w+): 20 steps, loss \S+, max \|parameter - one process\| (\S+), "
                  r"grads moved (\d+)$", re.M)


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """handles and train, compiled against the torch wheel and build/libpybridge.so (in parallel)."""
    from pybridge.cbuild.cli import torch_flags
    cflags, libs = torch_flags()
    out = tmp_path_factory.mktemp("cpp")
    build = os.path.dirname(LIB_PATH)
    jobs = {}
    for name, src in (("handles", "tests/cpp/handles.cpp"), ("train", "examples/libtorch/train.cpp")):
        cmd = ["g++", "-std=c++17", "-O1", "-w", *cflags.split(), f"-I{ROOT}/capi", os.path.join(ROOT, src),
               "-o", str(out / name), *libs.split(), f"-L{build}", "-lpybridge", f"-Wl,-rpath,{build}"]
        jobs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, job in jobs.items():
        log, _ = job.communicate(timeout=300)
        assert job.returncode == 0, log
    return {name: str(out / name) for name in jobs}


def launch(nproc, *argv, timeout=120):
    """pybridge-launch --nproc-per-node NPROC ARGV... (launcher flags may lead ARGV)."""
    flags = [a for a in argv[:1] if a.startswith("--")]
    p = subprocess.run([sys.executable, "-m", "pybridge.launch", *flags, "--nproc-per-node", str(nproc),
                        *argv[len(flags):]],
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, unprefixed(p.stdout + p.stderr)


def test_handles_from_cpp_and_an_elastic_reset(programs):
    """3 ranks under pybridge-launch --elastic: the checks, then rank 2 dies mid-training and
    the survivors reset the attached reducer onto the 2-rank world and go on."""
    rc, out = launch(3, "--elastic", programs["handles"], "--elastic")
    assert rc == 0, out
    assert "worker node0-slot2-0 (local rank 2) was killed by signal SIGKILL" in out, out
    assert out.count("handles: 0 failed checks") == 2, out
    for check in ("ok elastic: pb_reducer_wait said PB_ERR_MEMBERSHIP, naming the lost rank",
                  "ok elastic: one reset onto the smaller world",
                  "ok elastic: every gradient the average over the world of its step"):
        assert out.count(check) == 2, (check, out)
    assert out.count("\nok ") >= 2 * 20


def formula(rows, cols, a, b, c, scale):
    """train.cpp's formula(): scale * sin(a i + b j + c) in double, stored as float32."""
    return np.array([[scale * math.sin(a * i + b * j + c) for j in range(cols)] for i in range(rows)], np.float32)


def twin(rank, world, hook):
    """train.cpp's model, data and SGD in Python under torch's DistributedDataParallel."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as psgd
    init = [formula(16, 8, 1.3, 0.7, 0.5, 0.3), formula(1, 16, 0.9, 0.4, 0.1, 0.1).reshape(16),
            formula(4, 16, 0.6, 1.1, 0.2, 0.3), formula(1, 4, 0.3, 0.8, 0.7, 0.1).reshape(4)]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.b1, self.w2, self.b2 = (torch.nn.Parameter(torch.from_numpy(a.copy())) for a in init)

        def forward(self, x):
            return torch.nn.functional.linear(torch.tanh(torch.nn.functional.linear(x, self.w1, self.b1)),
                                              self.w2, self.b2)

    ddp = torch.nn.parallel.DistributedDataParallel(Net())
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":  # torch's own hook, under another name: torch DDP refuses the name itself off NCCL
        ddp.register_comm_hook(None, lambda state, bucket: default_hooks.bf16_compress_hook(state, bucket))
    elif hook == "powersgd":
        ddp.register_comm_hook(psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                  start_powerSGD_iter=2, warm_start=True, random_seed=0),
                               psgd.powerSGD_hook)
    for step in range(20):
        x = torch.from_numpy(formula(6 * world, 8, 0.37, 0.71, 0.13 * step, 1.0))[6 * rank:6 * rank + 6]
        y = torch.from_numpy(formula(6 * world, 4, 0.23, 1.7, 0.29 * step + 1.0, 0.5))[6 * rank:6 * rank + 6]
        for p in ddp.parameters():
            p.grad = None
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        with torch.no_grad():
            for p in ddp.parameters():
                p.add_(p.grad, alpha=-0.1)
    return np.concatenate([p.detach().numpy().ravel() for p in ddp.module.parameters()])


def twins(rank, world):
    import pybridge
    pybridge.init(backend="gloo", timeout=60)
    got = {hook: twin(rank, world, hook) for hook in ("allreduce", "fp16", "bf16", "powersgd")}
    pybridge.finalize()
    return got


def test_attached_reducer_from_cpp(programs, tmp_path):
    rc, out = launch(2, programs["train"], "--mode", "copy,view", "--hook", ",".join(HOOKS),
                     "--out", str(tmp_path / "r"))
    assert rc == 0, out
    runs = {(int(r), m, h): (float(d), int(moved)) for r, m, h, d, moved in LINE.findall(out)}
    assert len(runs) == 2 * 2 * len(HOOKS), out
    for (rank, mode, hook), (diff, moved) in runs.items():
        assert moved == 0, (rank, mode, hook, out)
        if hook in EXACT:
            assert diff < 1e-5, (rank, mode, hook, diff)
    reference = run_ranks(twins, 2, timeout=120)[0]
    for mode in ("copy", "view"):
        for hook, want in reference.items():
            got = np.array((tmp_path / f"r-{mode}-{hook}.txt").read_text().split(), np.float32)
            assert np.abs(got - want).max() < 1e-5, (mode, hook, np.abs(got - want).max())


def test_attached_reducer_from_cpp_on_three_ranks(programs):
    rc, out = launch(3, programs["train"], "--mode", "copy,view", "--hook", "allreduce,hierarchical")
    assert rc == 0, out
    runs = LINE.findall(out)
    assert len(runs) == 3 * 2 * 2, out
    assert all(float(d) < 1e-5 and moved == "0" for _, _, _, d, moved in runs), out
