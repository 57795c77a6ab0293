"""The reducer on the program's own gradient tensors (bind_grads; torch DDP's default mode):
copied into the buckets at mark_ready, the reduced values copied back at wait. From Python
and through the C ABI (pb_reducer_bind_grads), on 2 real ranks."""

import os

import pytest
import torch

from capi_loader import LIB_PATH, init_world, last_error, load
from ranks import run_ranks

import pybridge
from pybridge.errors import InvalidArgument


def python_bound(rank, world):
    pybridge.init(backend="gloo")
    try:
        r = pybridge.Reducer([(3, "float32"), ((2, 2), "float64")], bucket_cap_mb=1e-5)  # one bucket each
        grads = [torch.zeros(3), torch.zeros(2, 2, dtype=torch.float64)]
        errors = []
        for bad in ([torch.zeros(4), grads[1]], [grads[0], torch.zeros(2, 2)], [grads[0], torch.zeros(4, 4)[:2, :2]],
                    [grads[0]]):
            try:
                r.bind_grads(bad)
            except InvalidArgument as exc:
                errors.append(str(exc))
        r.bind_grads(grads)
        seen = []
        for step in range(3):  # the rebuild after the first wait moves the buckets: still bound
            grads[0].copy_(torch.arange(3.0) * (rank + 1) + step)
            grads[1].fill_(rank * 10 + step)
            r.mark_ready(1)
            r.mark_ready(0)
            r.wait()
            seen.append((grads[0].tolist(), grads[1].flatten().tolist(), r.grad(0).tolist()))
        r.bind_grads(None)
        r.close()
        return errors, seen
    finally:
        pybridge.finalize()


def test_bound_gradients_are_averaged_in_place():
    for errors, seen in run_ranks(python_bound, 2):
        assert len(errors) == 4
        assert "gradient #0" in errors[0] and "3" in errors[0]
        assert "float64" in errors[1]
        assert "not contiguous" in errors[2]
        assert "got 1 gradients for 2 parameters" in errors[3]
        for step, (g0, g1, view0) in enumerate(seen):
            assert g0 == [1.5 * k + step for k in range(3)]
            assert g1 == [5.0 + step] * 4
            assert view0 == g0


def abi_bound(rank, world):
    ffi, lib = load()
    group = init_world(ffi, lib, 20.0)
    rp = ffi.new("pb_reducer **")
    counts, dtypes = ffi.new("int64_t[]", [4]), ffi.new("int32_t[]", [lib.PB_FLOAT32])
    assert lib.pb_reducer_create(group, 1, counts, dtypes, ffi.NULL, rp) == 0, last_error(ffi, lib)
    g = torch.full((4,), float(rank + 1))
    d = ffi.new("pb_tensor *")
    d.data, d.count, d.dtype, d.device = ffi.cast("void *", g.data_ptr()), 4, lib.PB_FLOAT32, lib.PB_CPU
    bad = lib.pb_reducer_bind_grads(rp[0], 2, d), last_error(ffi, lib)
    assert lib.pb_reducer_bind_grads(rp[0], 1, d) == 0, last_error(ffi, lib)
    assert lib.pb_reducer_mark_ready(rp[0], 0) == 0
    assert lib.pb_reducer_wait(rp[0], 10.0) == 0, last_error(ffi, lib)
    got = g.tolist()
    assert lib.pb_reducer_bind_grads(rp[0], 0, ffi.NULL) == 0
    assert lib.pb_reducer_close(rp[0]) == 0
    assert lib.pb_finalize(group) == 0
    return got, bad


@pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")
def test_c_abi_binds_the_callers_gradients():
    for got, (rc, msg) in run_ranks(abi_bound, 2):
        assert got == [1.5] * 4
        assert rc != 0 and "n is 2 but the reducer has 1 gradients" in msg


def bound_hooks(rank, world):
    """Each built-in hook in both modes on the same gradients: bound (the program's tensors,
    copied in and out) and bucket views (written in place) reduce to the same values."""
    from pybridge import abi
    from pybridge.algorithms.comm_hooks import BuiltinHook, GossipHook
    pybridge.init(backend="gloo")
    try:
        hooks = {"fp16": BuiltinHook(abi.PB_HOOK_FP16), "bf16": BuiltinHook(abi.PB_HOOK_BF16),
                 "powersgd": BuiltinHook(abi.PB_HOOK_POWERSGD, rank=1, start_iter=2),
                 "gossip": GossipHook("cube")}
        shapes = [((4, 3), "float32"), (5, "float32")]
        gen = torch.Generator().manual_seed(rank)
        steps = [[torch.randn(4, 3, generator=gen), torch.randn(5, generator=gen)] for _ in range(3)]
        out = {}
        for name, hook in hooks.items():
            bound = pybridge.Reducer(shapes, hook=hook, bucket_cap_mb=1e-5)
            views = pybridge.Reducer(shapes, hook=hook, bucket_cap_mb=1e-5)
            grads = [torch.zeros(4, 3), torch.zeros(5)]
            bound.bind_grads(grads)
            worst = 0.0
            for step in steps:
                for g, s in zip(grads, step):
                    g.copy_(s)
                for i in (1, 0):
                    bound.mark_ready(i)
                bound.wait()
                for i in (1, 0):
                    views.grad(i).copy_(step[i])
                    views.mark_ready(i)
                views.wait()
                moved = max((g - s).abs().max().item() for g, s in zip(grads, step))
                worst = max(worst, max((g - views.grad(i)).abs().max().item() for i, g in enumerate(grads)))
            bound.close()
            views.close()
            out[name] = (worst, moved)
        return out
    finally:
        pybridge.finalize()


def test_builtin_hooks_reduce_bound_gradients_as_bucket_views():
    for out in run_ranks(bound_hooks, 2, timeout=120):
        for name, (worst, moved) in out.items():
            assert worst == 0.0, name  # the same hook on the same gradients: the same values
            assert moved > 1e-3, name  # and the reduction changed the program's tensors
