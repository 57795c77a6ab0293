"""Use after the group is finalized (issue 13 item 6): objects made from a group (reducers,
loaders, work handles) answer Closed once it is finalized, on every rank and also on 1 rank,
from Python and through the C ABI (cffi ABI mode). Go: go/closed_test.go."""

import os

import pytest
import torch

from capi_loader import LIB_PATH, init_world, last_error, load
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
    g = init_world(ffi, lib)
    rp = ffi.new("pb_reducer **")
    rc = lib.pb_reducer_new(g, 2, ffi.new("int64_t[]", [3, 2]), ffi.new("int32_t[]", [lib.PB_FLOAT32] * 2),
                            0.0, lib.PB_AVG, 0, 0, rp)
    assert rc == 0, last_error(ffi, lib)
    assert lib.pb_reducer_mark_ready(rp[0], 0) == 0
    name = ffi.new("char[]", path.encode())  # kept alive: files only points to it
    files = ffi.new("char *[]", [name])
    lp = ffi.new("pb_loader **")
    rc = lib.pb_loader_open(g, files, 1, 4, lib.PB_PARTITION_DYNAMIC, 0, 0, 0, 0, lp)
    assert rc == 0, last_error(ffi, lib)
    # seed -1 is refused when the loader is opened, not at its first shuffled batch
    bad = ffi.new("pb_loader **")
    seed_rc = lib.pb_loader_open(g, files, 1, 4, lib.PB_PARTITION_DYNAMIC, 1, -1, 0, 0, bad)
    seed_msg = last_error(ffi, lib)
    assert lib.pb_finalize(g) == 0
    data, offsets = ffi.new("uint8_t **"), ffi.new("int64_t **")
    count, has = ffi.new("int64_t *"), ffi.new("int32_t *")
    got = {"seed": (seed_rc, seed_msg)}
    for name, call in (("mark", lambda: lib.pb_reducer_mark_ready(rp[0], 1)),
                       ("wait", lambda: lib.pb_reducer_wait(rp[0], 5.0)),
                       ("loader", lambda: lib.pb_loader_next(lp[0], data, offsets, count, has))):
        rc = call()
        got[name] = (rc, last_error(ffi, lib) if rc else "")
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


def test_finalize_parks_a_backend_held_elsewhere_and_frees_it_on_a_callers_thread():
    """finalize() lets go of the world's backend with _free_here. While something else holds
    it (a closure that gloo's thread is about to drop, the user's DDP wrapper, a reference
    only C++ holds), it is parked, not waited for: gloo's thread never drops the last
    reference, and the backend is freed on the thread of the next finalize() that finds
    nothing else holding it. A plain object stands in for the backend."""
    import ctypes
    import threading
    import weakref

    from pybridge.comm import world as group

    freed_on = []

    class Backend:
        def __del__(self):
            freed_on.append(threading.current_thread())

    def held_from_cpp(obj):  # a reference outside Python, never released
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
        return obj

    group._free_here([held_from_cpp(Backend())], 0.05)  # no wait would release it
    assert len(group._parked) == 1
    group._release_parked()
    assert len(group._parked) == 1 and not freed_on  # still held from C++: still parked

    holder = [Backend()]
    alive = weakref.ref(holder[0])
    group._free_here([holder[0]], 0)
    assert len(group._parked) == 2 and not freed_on
    other = threading.Thread(target=holder.clear)  # gloo's thread drops its closure
    other.start()
    other.join()
    assert alive() is not None and not freed_on  # not freed there: the parked reference holds it
    group._release_parked()
    assert alive() is None and freed_on == [threading.current_thread()]
    assert len(group._parked) == 1  # the C++-held one stays until exit

    group._free_here([Backend()], 0)  # when nothing else holds it, it goes at once, here
    assert freed_on == [threading.current_thread()] * 2 and len(group._parked) == 1
    group._parked.clear()
