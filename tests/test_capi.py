"""The C ABI: from a plain C program, and through cffi's ABI mode on real ranks
(collectives, async work, a peer that never joins, a peer that dies)."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from capi_loader import LIB_PATH, ROOT, init_world, last_error, load, np_tensor, pybridge_flags
from ranks import free_port, run_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


def test_bad_input_from_c(tmp_path):
    exe = tmp_path / "abi_errors"
    flags = pybridge_flags()
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", str(exe), os.path.join(ROOT, "tests/c/abi_errors.c"),
                    *flags], check=True)
    # A clean environment: the library must find torch and pybridge by itself.
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    run = subprocess.run([str(exe), str(free_port())], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "abi_errors: 0 failed checks" in run.stdout
    assert run.stdout.count("\nok ") >= 50


def abi_collectives(rank, world):
    ffi, lib = load()
    g = init_world(ffi, lib)
    out = ffi.new("int32_t *")
    assert lib.pb_rank(g, out) == 0 and out[0] == rank
    assert lib.pb_size(g, out) == 0 and out[0] == world
    x = np.arange(5, dtype=np.float32) * (rank + 1)
    assert lib.pb_all_reduce(g, np_tensor(ffi, lib, x), lib.PB_SUM) == 0
    np.testing.assert_array_equal(x, np.arange(5) * sum(r + 1 for r in range(world)))
    y = np.full(3, rank, dtype=np.int64)
    assert lib.pb_broadcast(g, np_tensor(ffi, lib, y), world - 1) == 0
    assert y.tolist() == [world - 1] * 3
    # The same buffer again and again (the library prepares each call once): every call
    # works on the buffer's current contents, also with a new op or root, or a prefix.
    desc = np_tensor(ffi, lib, x)
    for step in range(3):
        x[:] = rank + step
        assert lib.pb_all_reduce(g, desc, lib.PB_SUM) == 0
        assert x.tolist() == [sum(r + step for r in range(world))] * 5
        x[:] = rank * 10 + step
        assert lib.pb_all_reduce(g, desc, lib.PB_MIN) == 0
        assert x.tolist() == [step] * 5
        x[:] = rank + step
        assert lib.pb_broadcast(g, desc, step % world) == 0
        assert x.tolist() == [step % world + step] * 5
    x[:] = rank + 1
    desc.count = 2
    assert lib.pb_all_reduce(g, desc, lib.PB_SUM) == 0
    assert x.tolist() == [sum(r + 1 for r in range(world))] * 2 + [rank + 1] * 3
    gathered = np.zeros(2 * world, dtype=np.int32)
    assert lib.pb_all_gather(g, np_tensor(ffi, lib, np.full(2, rank, np.int32)), np_tensor(ffi, lib, gathered)) == 0
    assert gathered.tolist() == [r for r in range(world) for _ in range(2)]
    big = np.arange(2 * world, dtype=np.float64)
    part = np.zeros(2, np.float64)
    assert lib.pb_reduce_scatter(g, np_tensor(ffi, lib, big), np_tensor(ffi, lib, part), lib.PB_MAX) == 0
    assert part.tolist() == big[2 * rank:2 * rank + 2].tolist()
    # Async on a library-owned buffer.
    bp = ffi.new("pb_buffer **")
    assert lib.pb_buffer_new(lib.PB_INT32, 4, lib.PB_CPU, bp) == 0
    desc = ffi.new("pb_tensor *")
    assert lib.pb_buffer_tensor(bp[0], desc) == 0
    view = np.frombuffer(ffi.buffer(desc.data, 16), dtype=np.int32)
    view[:] = rank + 1
    wp = ffi.new("pb_work **")
    assert lib.pb_all_reduce_async(g, bp[0], lib.PB_PRODUCT, wp) == 0
    assert lib.pb_work_wait(wp[0], 10.0) == 0
    assert view.tolist() == [int(np.prod([r + 1 for r in range(world)]))] * 4
    assert lib.pb_work_close(wp[0]) == 0 and lib.pb_buffer_close(bp[0]) == 0
    # Point to point.
    msg = np.full(4, rank * 10, dtype=np.uint8)
    if rank == 0:
        assert lib.pb_send(g, np_tensor(ffi, lib, msg), 1, 7) == 0
    elif rank == 1:
        assert lib.pb_recv(g, np_tensor(ffi, lib, msg), 0, 7) == 0
        assert msg.tolist() == [0] * 4
    assert lib.pb_barrier(g) == 0
    assert lib.pb_finalize(g) == 0
    return "ok"


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_through_the_c_abi(world):
    assert run_ranks(abi_collectives, world, timeout=90) == ["ok"] * world


def never_joined(rank, world, timeout):
    ffi, lib = load()
    gp = ffi.new("pb_group **")
    start = time.monotonic()
    rc = lib.pb_init(ffi.NULL, b"gloo", -1, -1, -1, timeout, gp)
    return rc, last_error(ffi, lib), time.monotonic() - start


def test_peer_that_never_joins_times_out():
    # world size 2, but only rank 0 is started: rank 1 never joins.
    (rc, msg, took), absent = run_ranks(never_joined, 2, 3.0, timeout=60, only=[0])
    _, lib = load()
    assert rc == lib.PB_ERR_TIMEOUT, msg
    assert took < 3.0 + 10, took
    assert "pb_init" in msg


def dies_mid_collective(rank, world):
    ffi, lib = load()
    g = init_world(ffi, lib, timeout=15.0)
    x = np.ones(1 << 16, dtype=np.float32)
    assert lib.pb_all_reduce(g, np_tensor(ffi, lib, x), lib.PB_SUM) == 0
    if rank == 1:
        os._exit(3)  # dies without finalizing, while rank 0 enters the next collective
    start = time.monotonic()
    rcs = [lib.pb_all_reduce(g, np_tensor(ffi, lib, x), lib.PB_SUM) for _ in range(3)]
    return rcs, last_error(ffi, lib), time.monotonic() - start


def test_peer_that_dies_mid_collective_gives_an_error():
    results = run_ranks(dies_mid_collective, 2, timeout=90, expect_fail={1})
    rcs, msg, took = results[0]
    _, lib = load()
    assert rcs[0] in (lib.PB_ERR_COMM, lib.PB_ERR_TIMEOUT), (rcs, msg)
    assert all(rc != 0 for rc in rcs), rcs
    assert took < 60, took


def loaded_after_torch(rank, world):
    import torch  # noqa: F401 - the point: torch touched Python's type caches first
    ffi, lib = load()
    g = init_world(ffi, lib, timeout=10)
    x = np.ones(3, np.float32)
    assert lib.pb_all_reduce(g, np_tensor(ffi, lib, x), lib.PB_SUM) == 0
    assert lib.pb_finalize(g) == 0
    return "ok"


def test_library_loads_into_a_running_python_after_torch():
    # cffi's start-up lock spun for ever here before capi/build.py invalidated the tag it uses.
    assert run_ranks(loaded_after_torch, 1, timeout=60) == ["ok"]


def test_core_that_cannot_start_returns_internal_error(tmp_path):
    fake = tmp_path / "pybridge"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('deliberately broken pybridge')\n")
    code = ("from capi_loader import last_error, load\n"
            "ffi, lib = load()\n"
            "for _ in range(2):\n"
            "    rc = lib.pb_barrier(ffi.NULL)\n"
            "    print(rc, last_error(ffi, lib))\n")
    env = {**os.environ, "PYBRIDGE_PYTHONPATH": str(tmp_path),
           "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 2, run.stdout + run.stderr
    for line in lines:
        assert line.startswith(f"{load()[1].PB_ERR_INTERNAL} "), line
        assert "deliberately broken pybridge" in line, line


def test_loading_into_a_running_python_leaves_it_intact():
    # Regression: loaded into a running interpreter, the start-up code re-ran site.addsitedir
    # over site-packages and reset sys.executable; a later import of torch's compiler stack
    # in that process crashed it (SIGSEGV). Now only an interpreter the library started is
    # configured.
    code = ("import sys, torch\n"
            "from capi_loader import load\n"
            "exe, path = sys.executable, list(sys.path)\n"
            "ffi, lib = load()\n"
            "assert lib.pb_barrier(ffi.NULL) == lib.PB_ERR_NOT_INITIALIZED\n"
            "assert sys.executable == exe and sys.path == path, (sys.executable, sys.path)\n"
            "import torch._dynamo\n"
            "p = torch.nn.Parameter(torch.ones(3))\n"
            "opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)\n"
            "p.sum().backward(); opt.step()\n"
            "print('intact', p.tolist())\n")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr[-3000:])
    assert run.stdout.startswith("intact"), run.stdout
