"""CUDA and NCCL paths: skipped on machines without a GPU (CI has none).

One GPU is enough: NCCL runs one rank per GPU, so its tests use a world of one rank (the
code path through pybridge, the checks and the C ABI are the same as on many); gloo moves
CUDA tensors too, so the two-rank tests use gloo with every rank on cuda:0.
"""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from capi_loader import LIB_PATH, load
from ranks import run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def nccl_collectives(rank, world):
    import pybridge
    from pybridge.errors import InvalidArgument
    g = pybridge.init(backend="nccl", timeout=60)
    assert g.backend == "nccl" and g.device.type == "cuda"
    x = torch.arange(6, dtype=torch.float32, device="cuda")
    pybridge.all_reduce(x, "sum")
    assert x.tolist() == list(range(6))
    pybridge.all_reduce(x, "avg")
    pybridge.broadcast(x, 0)
    assert x.tolist() == list(range(6))
    out = torch.zeros(6, device="cuda")
    pybridge.all_gather(x, out)
    assert out.tolist() == x.tolist()
    pybridge.barrier()
    sub = g.split(0)  # a subgroup's own NCCL communicator (one rank here)
    z = torch.full((5,), 2.0, device="cuda")
    pybridge.all_reduce(z, "sum", group=sub)
    pybridge.broadcast(z, 0, group=sub)
    assert z.tolist() == [2.0] * 5 and sub.backend == "nccl"
    sub.close()
    try:
        pybridge.all_reduce(torch.ones(3), "sum")
        raise AssertionError("a CPU tensor under nccl was accepted")
    except InvalidArgument as exc:
        assert "CUDA" in str(exc)
    pybridge.finalize()
    return "ok"


def test_nccl_collectives_on_one_gpu():
    assert run_ranks(nccl_collectives, 1, timeout=120) == ["ok"]


def gloo_cuda_tensors(rank, world):
    import pybridge
    pybridge.init(backend="gloo", timeout=60)
    x = torch.full((1000,), float(rank + 1), device="cuda")
    pybridge.all_reduce(x, "sum")
    y = torch.full((5,), float(rank), device="cuda")
    pybridge.broadcast(y, 1)
    pybridge.finalize()
    return x[0].item(), y.tolist()


def test_gloo_moves_cuda_tensors_between_two_ranks():
    assert run_ranks(gloo_cuda_tensors, 2, timeout=120) == [(3.0, [1.0] * 5)] * 2


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4)).cuda()


def ddp_against_torch_on_cuda(rank, world, compression):
    import torch.distributed as dist
    import pybridge
    from pybridge.ddp import DistributedDataParallel as PDDP
    pybridge.init(backend="gloo", timeout=60)
    gen = torch.Generator().manual_seed(3)
    data = [(torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(5)]
    ours = PDDP(_model(1), compression=compression, bucket_cap_mb=0.001, first_bucket_cap_mb=0.001)
    theirs = torch.nn.parallel.DistributedDataParallel(_model(1), bucket_cap_mb=0.001)
    if compression == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        theirs.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    for net in (ours, theirs):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for x, y in data:
            n = len(x) // world
            xs, ys = x[rank * n:(rank + 1) * n].cuda(), y[rank * n:(rank + 1) * n].cuda()
            opt.zero_grad()
            F.mse_loss(net(xs), ys).backward()
            opt.step()
    diff = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters()))
    on_gpu = all(p.grad.is_cuda for p in ours.parameters())
    pybridge.finalize()
    return diff, on_gpu


@pytest.mark.parametrize("compression,tol", [(None, 1e-6), ("fp16", 1e-3)])
def test_ddp_wrapper_matches_torch_ddp_on_cuda(compression, tol):
    for diff, on_gpu in run_ranks(ddp_against_torch_on_cuda, 2, compression, timeout=180):
        assert on_gpu and diff < tol, diff


def capi_nccl(rank, world):
    ffi, lib = load()
    gp = ffi.new("pb_group **")
    assert lib.pb_init(ffi.NULL, b"nccl", -1, -1, -1, 60.0, gp) == 0, ffi.string(lib.pb_last_error())
    dev = ffi.new("int32_t *")
    assert lib.pb_device(gp[0], dev) == 0 and dev[0] == 0
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    t = ffi.new("pb_tensor *")
    t.data, t.count, t.dtype, t.device = ffi.cast("void *", x.data_ptr()), 8, lib.PB_FLOAT32, 0
    assert lib.pb_all_reduce(gp[0], t, lib.PB_SUM) == 0, ffi.string(lib.pb_last_error())
    assert lib.pb_broadcast(gp[0], t, 0) == 0, ffi.string(lib.pb_last_error())
    torch.cuda.synchronize()
    assert x.tolist() == list(range(8))
    t.device = lib.PB_CPU  # a device pointer described as host memory under nccl: refused
    host = np.zeros(8, np.float32)
    t.data = ffi.cast("void *", host.ctypes.data)
    assert lib.pb_all_reduce(gp[0], t, lib.PB_SUM) == lib.PB_ERR_INVALID_ARGUMENT
    buf = ffi.new("pb_buffer **")
    assert lib.pb_buffer_new(lib.PB_FLOAT32, 16, 0, buf) == 0, ffi.string(lib.pb_last_error())
    bt = ffi.new("pb_tensor *")
    assert lib.pb_buffer_tensor(buf[0], bt) == 0 and bt.device == 0 and bt.count == 16
    work = ffi.new("pb_work **")
    assert lib.pb_all_reduce_async(gp[0], buf[0], lib.PB_SUM, work) == 0, ffi.string(lib.pb_last_error())
    assert lib.pb_work_wait(work[0], 30.0) == 0
    assert lib.pb_work_close(work[0]) == 0 and lib.pb_buffer_close(buf[0]) == 0
    assert lib.pb_finalize(gp[0]) == 0
    return "ok"


@pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` first")
def test_c_abi_under_nccl():
    assert run_ranks(capi_nccl, 1, timeout=120) == ["ok"]


def federated_on_nccl(rank, world):
    import pybridge
    from pybridge.errors import WorkerFailed
    from pybridge.federated import FedAvg, Server, Worker
    g = pybridge.init(backend="nccl", timeout=60)
    v = torch.arange(1.0, 6.0, device="cuda")
    if rank == 0:
        param = torch.nn.Parameter(torch.zeros(5, device="cuda"))
        avg = FedAvg([param])
        devices = set()
        with Server(g, timeout=60) as s:
            for r in s.run_round(range(6), avg.vector()):
                devices.add(r.payload.device.type)
                avg.add(r)
            avg.step()
            try:
                list(s.run_round([99], avg.vector()))
                failed = None
            except WorkerFailed as exc:
                failed = (exc.worker, exc.client)
        out = (param.detach().cpu().tolist(), sorted(devices), failed)
    else:
        def train(model, client):
            if client == 99:
                raise ValueError("no data")
            return model + (client + 1) * v, client + 1
        Worker(g).serve(train)
        out = None
    pybridge.finalize()
    return out


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank: 2 GPUs")
def test_federated_server_and_worker_on_nccl():
    model, devices, failed = run_ranks(federated_on_nccl, 2, timeout=180)[0]
    # Client c trained to model + (c+1) v from c+1 samples: FedAvg moves the model by
    # sum((c+1)^2) / sum(c+1) v = 91/21 v.
    assert model == pytest.approx([91 / 21 * i for i in range(1, 6)], rel=1e-5)
    assert devices == ["cuda"] and failed == (1, 99)
