"""Process-group setup from Python: launcher environment, overrides, init methods,
timeouts and misuse."""

import os
import time

import numpy as np
import pytest
import torch

import pybridge
from ranks import free_port, run_ranks


def env_init(rank, world, method):
    if method == "file":
        g = pybridge.init(init_method=f"file://{os.environ['STORE_FILE']}", timeout=20)
    elif method == "tcp":
        g = pybridge.init(init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", timeout=20)
    elif method == "override":
        # Explicit values win over the environment.
        os.environ["RANK"] = "99"
        g = pybridge.init(rank=rank, world_size=world, master_addr="127.0.0.1",
                          master_port=int(os.environ["MASTER_PORT"]), timeout=20)
    else:
        g = pybridge.init(timeout=20)
    x = torch.ones(3) * (rank + 1)
    pybridge.all_reduce(x)
    info = (g.rank, g.size, g.local_rank, g.backend, str(g.device), x.tolist(), repr(g))
    pybridge.finalize()
    assert not pybridge.is_initialized()
    return info


@pytest.mark.parametrize("method", ["env", "tcp", "file", "override"])
def test_init_methods(method, tmp_path):
    results = run_ranks(env_init, 2, method, timeout=60, env={"STORE_FILE": str(tmp_path / "store")})
    for rank, (r, size, local, backend, device, x, text) in enumerate(results):
        assert (r, size, local, backend, device) == (rank, 2, rank, "gloo", "cpu")
        assert x == [3.0, 3.0, 3.0]
        assert "live" in text


def test_misuse_before_init():
    assert not pybridge.is_initialized()
    with pytest.raises(pybridge.NotInitialized):
        pybridge.rank()
    with pytest.raises(pybridge.NotInitialized):
        pybridge.all_reduce(np.zeros(2, np.float32))
    pybridge.finalize()  # harmless when not initialized


@pytest.mark.parametrize("kwargs, words", [
    (dict(backend="mpi"), "unknown backend"),
    (dict(backend="nccl"), "needs CUDA"),
    (dict(rank=2, world_size=2), "not within world size"),
    (dict(timeout=0), "timeout must be a number of seconds in"),
    (dict(timeout=float("nan")), "timeout must be a number of seconds in"),
    (dict(init_method="http://x"), "must start with"),
    (dict(init_method="tcp://127.0.0.1:1", master_port=5), "not both"),
])
def test_bad_init_arguments(kwargs, words, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    if "nccl" in kwargs.values() and torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(pybridge.InvalidArgument, match=words):
        pybridge.init(**{"timeout": 5, **kwargs})
    assert not pybridge.is_initialized()


def test_missing_environment_is_named(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(pybridge.InvalidArgument, match="RANK and WORLD_SIZE"):
        pybridge.init()
    with pytest.raises(pybridge.InvalidArgument, match="MASTER_ADDR and MASTER_PORT"):
        pybridge.init(rank=0, world_size=1)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(pybridge.InvalidArgument, match="RANK='x'"):
        pybridge.init()


def single_rank_misuse(rank, world):
    g = pybridge.init(timeout=10)
    with pytest.raises(pybridge.AlreadyInitialized):
        pybridge.init(timeout=10)
    with pytest.raises(pybridge.InvalidArgument, match="root rank 1"):
        pybridge.broadcast(torch.zeros(2), 1)
    with pytest.raises(pybridge.InvalidArgument, match="read-only"):
        a = np.zeros(2, np.float32)
        a.flags.writeable = False
        pybridge.all_reduce(a)
    with pytest.raises(pybridge.InvalidArgument, match="not contiguous"):
        pybridge.all_reduce(torch.zeros(4, 4).t())
    with pytest.raises(pybridge.InvalidArgument, match="unsupported dtype"):
        pybridge.all_reduce(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(pybridge.InvalidArgument, match="unknown reduce op"):
        pybridge.all_reduce(torch.zeros(2), "median")
    with pytest.raises(pybridge.InvalidArgument, match="world size"):
        pybridge.all_gather(torch.zeros(2), torch.zeros(3))
    with pytest.raises(pybridge.InvalidArgument, match="own rank"):
        pybridge.send(torch.zeros(2), 0)
    empty = torch.zeros(0)
    pybridge.all_reduce(empty)  # zero elements is a valid, empty collective
    # Streams: None and 0 mean the current stream; a bad value or (without CUDA) any stream is named.
    g.set_stream(None)
    g.set_stream(0)
    assert g.stream is None
    with pytest.raises(pybridge.InvalidArgument, match="stream must be a torch.cuda.Stream"):
        g.set_stream("s1")
    with pytest.raises(pybridge.InvalidArgument, match="stream must be"):
        g.set_stream(-5)
    if not torch.cuda.is_available():
        with pytest.raises(pybridge.InvalidArgument, match="no CUDA device"):
            g.set_stream(0x1000)
    work = pybridge.all_reduce(torch.ones(3), async_op=True)
    assert work._stream is None  # host memory: no stream to wait on
    work.wait()
    pybridge.finalize()
    with pytest.raises(pybridge.Closed):
        pybridge.all_reduce(torch.zeros(2), group=g)
    with pytest.raises(pybridge.Closed):
        g.set_stream(None)
    return "ok"


def test_single_rank_misuse():
    assert run_ranks(single_rank_misuse, 1, timeout=60) == ["ok"]


def lonely(rank, world, timeout):
    start = time.monotonic()
    try:
        pybridge.init(timeout=timeout)
    except pybridge.Timeout as exc:
        return "timeout", str(exc), time.monotonic() - start
    return "joined", "", time.monotonic() - start


def test_peer_that_never_joins():
    result, _ = run_ranks(lonely, 2, 2.0, timeout=60, only=[0])
    kind, msg, took = result
    assert kind == "timeout", msg
    assert took < 2.0 + 10


def stalls(rank, world):
    pybridge.init(timeout=3)
    pybridge.barrier()
    if rank == 1:
        time.sleep(7)  # alive but silent: rank 0's next collective must time out
        return "slept"
    start = time.monotonic()
    with pytest.raises((pybridge.Timeout, pybridge.CommError)):
        pybridge.all_reduce(torch.ones(4))
    return time.monotonic() - start


def test_peer_that_stops_answering_times_out():
    took, slept = run_ranks(stalls, 2, timeout=60)
    assert slept == "slept"
    assert took < 3 + 5, took
