"""Use after the group is finalized (issue 13 item 6): objects made from a group (reducers,
loaders, work handles) answer Closed once it is finalized, on every rank and also on 1 rank,
from Python and through the C ABI (cffi ABI mode). Go: go/closed_test.go."""

import os
import time

import pytest
import torch

from capi_loader import LIB_PATH, load
from ranks import run_ranks

needs_lib = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


def _dataset(path):
    from pybridge.recordio import Writer
    with Writer(path) as w:
        for i in range(20):
            w.write(f"record {i}".encode())
    return path


def python_ranks(rank, world, path):
    import pybridge
    from pybridge.recordio import Loader
    g = pybridge.init(timeout=30)
    reducer = pybridge.Reducer([torch.zeros(3), torch.zeros(2)], group=g)
    reducer.mark_ready(0)  # an iteration under way when the group goes
    loader = Loader([path], 4, partition="dynamic", group=g)
    work = pybridge.all_reduce(torch.ones(2), async_op=True)
    work.wait()
    pybridge.finalize()
    got = {}
    for name, call in (("mark", lambda: reducer.mark_ready(1)), ("wait", reducer.finalize),
                       ("grads", reducer.grads), ("loader", loader.next_batch),
                       ("iter", lambda: next(iter(loader)))):
        try:
            call()
            got[name] = "no error"
        except pybridge.errors.Closed as exc:
            got[name] = "Closed: " + str(exc)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            got[name] = f"{type(exc).__name__}: {exc}"
    return got


@pytest.mark.parametrize("world", [1, 2])
def test_python_objects_are_closed_after_finalize(tmp_path, world):
    path = _dataset(str(tmp_path / "d.rio"))
    for rank, got in enumerate(run_ranks(python_ranks, world, path, timeout=90)):
        for name, what in got.items():
            assert what.startswith("Closed:") and "finalized" in what, (rank, name, what)


def capi_ranks(rank, world, path):
    ffi, lib = load()
    gp = ffi.new("pb_group **")
    assert lib.pb_init(ffi.NULL, b"gloo", -1, -1, -1, 30.0, gp) == 0, ffi.string(lib.pb_last_error())
    g = gp[0]
    rp = ffi.new("pb_reducer **")
    rc = lib.pb_reducer_new(g, 2, ffi.new("int64_t[]", [3, 2]), ffi.new("int32_t[]", [lib.PB_FLOAT32] * 2),
                            0.0, lib.PB_AVG, 0, 0, rp)
    assert rc == 0, ffi.string(lib.pb_last_error())
    assert lib.pb_reducer_mark_ready(rp[0], 0) == 0
    name = ffi.new("char[]", path.encode())  # kept alive: files only points to it
    files = ffi.new("char *[]", [name])
    lp = ffi.new("pb_loader **")
    rc = lib.pb_loader_open(g, files, 1, 4, lib.PB_PARTITION_DYNAMIC, 0, 0, 0, 0, lp)
    assert rc == 0, ffi.string(lib.pb_last_error())
    # seed -1 is refused when the loader is opened, not at its first shuffled batch
    bad = ffi.new("pb_loader **")
    seed_rc = lib.pb_loader_open(g, files, 1, 4, lib.PB_PARTITION_DYNAMIC, 1, -1, 0, 0, bad)
    seed_msg = ffi.string(lib.pb_last_error()).decode()
    assert lib.pb_finalize(g) == 0
    data, offsets = ffi.new("uint8_t **"), ffi.new("int64_t **")
    count, has = ffi.new("int64_t *"), ffi.new("int32_t *")
    got = {"seed": (seed_rc, seed_msg)}
    for name, call in (("mark", lambda: lib.pb_reducer_mark_ready(rp[0], 1)),
                       ("wait", lambda: lib.pb_reducer_wait(rp[0], 5.0)),
                       ("loader", lambda: lib.pb_loader_next(lp[0], data, offsets, count, has))):
        rc = call()
        got[name] = (rc, ffi.string(lib.pb_last_error()).decode() if rc else "")
    got["close"] = (lib.pb_loader_close(lp[0]), "")  # freeing still works
    got["free"] = (lib.pb_reducer_free(rp[0]), "")
    return got, int(lib.PB_ERR_CLOSED), int(lib.PB_ERR_INVALID_ARGUMENT)


@needs_lib
@pytest.mark.parametrize("world", [1, 2])
def test_capi_objects_are_closed_after_finalize(tmp_path, world):
    path = _dataset(str(tmp_path / "d.rio"))
    for rank, (got, closed, invalid) in enumerate(run_ranks(capi_ranks, world, path, timeout=90)):
        seed_rc, seed_msg = got.pop("seed")
        assert seed_rc == invalid and "seed" in seed_msg, (rank, seed_rc, seed_msg)
        assert got.pop("close") == (0, "") and got.pop("free") == (0, ""), (rank, got)
        for name, (rc, msg) in got.items():
            assert rc == closed and "finalized" in msg, (rank, name, rc, msg)



def test_finalize_waits_for_python_holders_of_the_backend_not_for_cpp_ones():
    """finalize() drops the world's backend with _free_here, which waits while a Python object
    still holds it (a closure that gloo's thread is about to drop) and not for a reference
    only C++ holds (importing torch._dynamo, as torch.optim does, takes such references to a
    live group), which no wait would release. A plain object stands in for the backend."""
    import ctypes
    import threading

    from pybridge.comm.group import _free_here

    class Backend:
        pass

    def held_from_cpp(obj):  # a reference outside Python, never released
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
        return obj

    _free_here([held_from_cpp(Backend())], 3600)  # waiting for it would hang: pytest's timeout
    holder, dropped = [Backend()], threading.Event()  # a Python holder, dropped by another thread

    def drop():
        time.sleep(0.3)
        dropped.set()
        holder.clear()

    threading.Thread(target=drop).start()
    _free_here([holder[0]], 3600)
    assert dropped.is_set()
