"""Inputs that used to hang (issue 13 items 5 and 8) fail promptly with an error naming the
cause: init over file:// in a missing directory, init with rank 0 (the store's host) missing,
a RecordIO "file" that is a FIFO or a directory, and a launcher rendezvous port already in
use. Every case runs in a child process bounded in time, so a regression fails, not hangs.
The times themselves are measured by bench/failures.py."""

import os
import socket

import pytest
import torch

from capi_loader import LIB_PATH, last_error, load
from launcher import launch
from ranks import run_ranks

needs_lib = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


def init_file_missing_dir(rank, world, url):
    import pybridge
    try:
        pybridge.init(url, backend="gloo", rank=0, world_size=2, timeout=5)
    except pybridge.InvalidArgument as exc:
        return str(exc)
    return "no error"


def test_init_file_store_in_a_missing_directory(tmp_path):
    url = f"file://{tmp_path}/no-such-dir/store"
    [msg] = run_ranks(init_file_missing_dir, 1, url, timeout=60)
    assert f"{tmp_path}/no-such-dir does not exist" in msg, msg


def capi_init(rank, world, url, timeout):
    ffi, lib = load()
    gp = ffi.new("pb_group **")
    rc = lib.pb_init(url.encode() if url else ffi.NULL, b"gloo", -1, -1, -1, timeout, gp)
    return rc, last_error(ffi, lib), int(lib.PB_ERR_INVALID_ARGUMENT), int(lib.PB_ERR_TIMEOUT)


@needs_lib
def test_capi_init_file_store_in_a_missing_directory(tmp_path):
    [(rc, msg, invalid, _)] = run_ranks(capi_init, 1, f"file://{tmp_path}/gone/store", 5.0, timeout=60)
    assert rc == invalid and f"{tmp_path}/gone does not exist" in msg, (rc, msg)


def init_without_rank0(rank, world):
    import pybridge
    try:
        pybridge.init(backend="gloo", timeout=2)
    except pybridge.Timeout as exc:
        return str(exc)
    return "no error"


def test_missing_rank0_is_named_by_the_others():
    # world of 3, rank 0 never starts: ranks 1 and 2 give up at the timeout, saying why
    _, m1, m2 = run_ranks(init_without_rank0, 3, only=[1, 2], timeout=60)
    for r, msg in ((1, m1), (2, m2)):
        assert f"rank {r}: the rendezvous store at 127.0.0.1:" in msg and "hosted by rank 0" in msg, msg
        assert "within 2 s" in msg and "rank 0 is missing" in msg, msg


@needs_lib
def test_capi_missing_rank0_is_a_timeout():
    _, (rc, msg, _, timeout_rc) = run_ranks(capi_init, 2, None, 2.0, only=[1], timeout=60)
    assert rc == timeout_rc and "hosted by rank 0" in msg, (rc, msg)


def _rio(path):
    from pybridge.recordio import Writer
    with Writer(str(path)) as w:
        w.write(b"one record")
    return str(path)


def python_loader_on(rank, world, paths):
    from pybridge.errors import IOFailure
    from pybridge.recordio import Loader
    out = []
    for path in paths:
        try:
            Loader([path], 2)
            out.append("no error")
        except IOFailure as exc:
            out.append(str(exc))
    return out


def capi_loader_on(rank, world, paths):
    ffi, lib = load()
    out = []
    for path in paths:
        name = ffi.new("char[]", path.encode())
        files = ffi.new("char *[]", [name])
        lp = ffi.new("pb_loader **")
        rc = lib.pb_loader_open(ffi.NULL, files, 1, 2, lib.PB_PARTITION_STATIC, 0, 0, 0, 0, lp)
        out.append((rc == lib.PB_ERR_IO, last_error(ffi, lib)))
    return out


def test_loader_refuses_a_fifo_and_a_directory(tmp_path):
    fifo = tmp_path / "pipe.rio"
    os.mkfifo(fifo)  # no writer ever comes: an open() for reading would block for ever
    good = _rio(tmp_path / "good.rio")
    [(m_fifo, m_dir)] = run_ranks(python_loader_on, 1, [str(fifo), str(tmp_path)], timeout=60)
    assert f"{fifo}: cannot read: not a regular file but a FIFO" in m_fifo, m_fifo
    assert "not a regular file but a directory" in m_dir, m_dir
    assert run_ranks(python_loader_on, 1, [good], timeout=60) == [["no error"]]


@needs_lib
def test_capi_loader_refuses_a_fifo(tmp_path):
    fifo = tmp_path / "pipe.rio"
    os.mkfifo(fifo)
    [[(is_io, msg)]] = run_ranks(capi_loader_on, 1, [str(fifo)], timeout=60)
    assert is_io and "not a regular file but a FIFO" in msg, msg


def test_launcher_refuses_a_port_in_use(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        for extra in ([], ["--nnodes", "2", "--node-rank", "0"]):
            rc, out, _ = launch(["--nproc-per-node", "1", *extra, "--master-port", str(port), "/bin/true"],
                                timeout=60)
            assert rc != 0 and f"rendezvous port {port} is already in use" in out, out


def store_host_stops(rank, world, path):
    import signal
    import time

    import pybridge
    from pybridge.recordio import Loader
    g = pybridge.init(backend="gloo", timeout=2)
    pids = torch.zeros(world, dtype=torch.int64)
    pids[rank] = os.getpid()
    pybridge.all_reduce(pids)
    loader = Loader([path], 1, partition="dynamic", group=g)
    pybridge.barrier()  # both ranks are done opening the loader (its check uses the store)
    if rank == 0:
        os.kill(os.getpid(), signal.SIGSTOP)  # the store's host hangs without closing anything
    time.sleep(0.5)
    got = {}
    try:
        for _ in loader:
            pass
        got["loader"] = "no error"
    except pybridge.PyBridgeError as exc:
        got["loader"] = f"{type(exc).__name__}: {exc}"
    try:
        pybridge.new_group([1])  # its backend's rendezvous goes through the store
        got["new_group"] = "no error"
    except pybridge.PyBridgeError as exc:
        got["new_group"] = f"{type(exc).__name__}: {exc}"
    if rank == 1:
        os.kill(int(pids[0]), signal.SIGKILL)
    return got


def test_store_host_stopped_claims_and_subgroups_fail_instead_of_hanging(tmp_path):
    path = _rio(tmp_path / "d.rio")
    _, got = run_ranks(store_host_stops, 2, path, timeout=90, expect_fail=(0,))
    assert got["loader"].startswith("Timeout:") and got["new_group"].startswith("Timeout:"), got
