"""The gradient reducer through the C ABI (cffi ABI mode on real ranks): reduction results
against an independent computation, the rebuild and generation counter, compression,
parameter broadcast, and every misuse status."""

import os

import numpy as np
import pytest

from capi_loader import LIB_PATH, ROOT, init_world, last_error, load, pybridge_flags
from ranks import run_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


def _new(ffi, lib, g, counts, dts=None, cap=0.0, op=None, comp=0, flags=0):
    dts = dts if dts is not None else [lib.PB_FLOAT32] * len(counts)
    rp = ffi.new("pb_reducer **")
    rc = lib.pb_reducer_new(g, len(counts), ffi.new("int64_t[]", counts), ffi.new("int32_t[]", dts),
                            cap, lib.PB_AVG if op is None else op, comp, flags, rp)
    assert rc == 0, last_error(ffi, lib)
    return rp[0]


def _view(ffi, lib, r, i):
    """numpy array over gradient i's library-owned memory (float32 only)."""
    d = ffi.new("pb_tensor *")
    assert lib.pb_reducer_grad(r, i, d) == 0, last_error(ffi, lib)
    assert d.dtype == lib.PB_FLOAT32 and d.device == lib.PB_CPU
    return np.frombuffer(ffi.buffer(d.data, 4 * d.count), dtype=np.float32), int(ffi.cast("uintptr_t", d.data))


def _generation(ffi, lib, r):
    out = ffi.new("int64_t *")
    assert lib.pb_reducer_generation(r, out) == 0, last_error(ffi, lib)
    return out[0]


def grad_value(rank, i, k, step):
    return float((rank + 1) * (i + 1) + k * 0.5 + step)


def reduce_ranks(rank, world):
    ffi, lib = load()
    g = init_world(ffi, lib)
    counts = [3, 5, 1, 4, 0, 6]
    # A tiny cap: one bucket per gradient, so marking order decides the rebuilt layout.
    r = _new(ffi, lib, g, counts, cap=1e-6)
    assert _generation(ffi, lib, r) == 0
    order = [2, 0, 5, 3, 1, 4]  # not the parameter order, nor its reverse
    old_ptrs = {}
    for step in range(3):
        for i in order:
            view, ptr = _view(ffi, lib, r, i)
            old_ptrs.setdefault(step, {})[i] = ptr
            view[:] = [grad_value(rank, i, k, step) for k in range(counts[i])]
            assert lib.pb_reducer_mark_ready(r, i) == 0, last_error(ffi, lib)
        assert lib.pb_reducer_wait(r, 20.0) == 0, last_error(ffi, lib)
        for i, n in enumerate(counts):
            view, _ = _view(ffi, lib, r, i)
            want = [np.mean([grad_value(q, i, k, step) for q in range(world)]) for k in range(n)]
            np.testing.assert_allclose(view, want, rtol=1e-6)
        if step == 0:
            # Rebuilt in marking order: views moved, the generation says so.
            assert _generation(ffi, lib, r) == 1
    assert _generation(ffi, lib, r) == 1
    assert old_ptrs[1] == old_ptrs[2]
    assert any(old_ptrs[0][i] != old_ptrs[1][i] for i in order if counts[i])
    # All descriptors at once agree with one at a time.
    descs = ffi.new("pb_tensor[]", len(counts))
    assert lib.pb_reducer_grads(r, len(counts), descs) == 0, last_error(ffi, lib)
    for i in range(len(counts)):
        assert int(ffi.cast("uintptr_t", descs[i].data)) == _view(ffi, lib, r, i)[1]
        assert descs[i].count == counts[i]
    # zero
    assert lib.pb_reducer_zero(r) == 0
    assert all(not _view(ffi, lib, r, i)[0].any() for i in range(len(counts)))
    assert lib.pb_reducer_free(r) == 0

    # PB_SUM, no rebuild, float64 + float32 mixed, one bucket (default cap).
    r = _new(ffi, lib, g, [2, 3], dts=[lib.PB_FLOAT64, lib.PB_FLOAT32], op=lib.PB_SUM,
             flags=lib.PB_REDUCER_NO_REBUILD)
    d = ffi.new("pb_tensor *")
    assert lib.pb_reducer_grad(r, 0, d) == 0 and d.dtype == lib.PB_FLOAT64 and d.count == 2
    g64 = np.frombuffer(ffi.buffer(d.data, 16), dtype=np.float64)
    g64[:] = [rank, 2 * rank]
    g32, _ = _view(ffi, lib, r, 1)
    g32[:] = 1.5
    for i in (1, 0):
        assert lib.pb_reducer_mark_ready(r, i) == 0
    assert lib.pb_reducer_wait(r, 0) == 0, last_error(ffi, lib)  # 0: the group's timeout
    total = sum(range(world))
    assert g64.tolist() == [total, 2 * total] and g32.tolist() == [1.5 * world] * 3
    assert _generation(ffi, lib, r) == 0
    assert lib.pb_reducer_free(r) == 0

    # fp16 compression: close to the exact mean (half precision: ~1e-3 relative).
    r = _new(ffi, lib, g, [1000], comp=lib.PB_COMPRESS_FP16)
    v, _ = _view(ffi, lib, r, 0)
    exact = np.mean([np.sin(np.arange(1000) * (q + 1)) for q in range(world)], axis=0)
    v[:] = np.sin(np.arange(1000) * (rank + 1))
    assert lib.pb_reducer_mark_ready(r, 0) == 0 and lib.pb_reducer_wait(r, 20.0) == 0
    np.testing.assert_allclose(v, exact, atol=2e-3)
    assert not np.allclose(v, np.sin(np.arange(1000) * (rank + 1)))
    assert lib.pb_reducer_free(r) == 0

    # Gossip (pb_reducer_set_gossip): two steps follow the documented schedule (each rank
    # averages with the node it receives from), and with sync_every 2 the second is exact.
    from pybridge.algorithms.gossip_schedule import peers
    for topology, name in ((lib.PB_GOSSIP_CUBE, "cube"), (lib.PB_GOSSIP_DISSEMINATION, "dissemination")):
        r = _new(ffi, lib, g, [5])
        assert lib.pb_reducer_set_gossip(r, topology, 1, 9, 2) == 0, last_error(ffi, lib)
        got = []
        for step in range(2):
            v, _ = _view(ffi, lib, r, 0)
            v[:] = rank * rank
            assert lib.pb_reducer_mark_ready(r, 0) == 0 and lib.pb_reducer_wait(r, 20.0) == 0, last_error(ffi, lib)
            got.append(_view(ffi, lib, r, 0)[0].tolist())
        _, src = peers(name, world, 9, 0, rank)
        want0 = rank * rank if src is None else (rank * rank + src * src) / 2
        mean = sum(q * q for q in range(world)) / world
        assert got[0] == [want0] * 5 and got[1] == pytest.approx([mean] * 5), (name, got)
        assert lib.pb_reducer_free(r) == 0

    # Broadcast of initial parameters from the last rank, two dtypes.
    w = np.full(7, rank, dtype=np.float32)
    b = np.full(3, rank * 10, dtype=np.int64)
    ts = ffi.new("pb_tensor[]", 2)
    for t, arr, code in ((ts[0], w, lib.PB_FLOAT32), (ts[1], b, lib.PB_INT64)):
        t.data, t.count, t.dtype, t.device = ffi.cast("void *", arr.ctypes.data), arr.size, code, lib.PB_CPU
    assert lib.pb_broadcast_params(g, 2, ts, world - 1) == 0, last_error(ffi, lib)
    assert w.tolist() == [world - 1] * 7 and b.tolist() == [(world - 1) * 10] * 3
    assert lib.pb_finalize(g) == 0
    return "ok"


@pytest.mark.parametrize("world", [2, 3])
def test_reduction_through_the_c_abi(world):
    assert run_ranks(reduce_ranks, world, timeout=90) == ["ok"] * world


def misuse(rank, world):
    ffi, lib = load()
    INVALID, NOT_INIT, CLOSED = lib.PB_ERR_INVALID_ARGUMENT, lib.PB_ERR_NOT_INITIALIZED, lib.PB_ERR_CLOSED
    rp = ffi.new("pb_reducer **")
    counts, dts = ffi.new("int64_t[]", [4, 2, 3]), ffi.new("int32_t[]", [lib.PB_FLOAT32] * 3)
    results = {}

    def check(name, rc, want, text=None):
        msg = last_error(ffi, lib)
        assert rc == want, f"{name}: rc {rc}, want {want}: {msg}"
        if text is not None:
            assert text in msg, f"{name}: {msg!r} lacks {text!r}"
        results[name] = msg

    check("new before init", lib.pb_reducer_new(ffi.NULL, 3, counts, dts, 0, lib.PB_AVG, 0, 0, rp), NOT_INIT)
    g = init_world(ffi, lib)
    new = lambda n=3, c=counts, d=dts, op=lib.PB_AVG, comp=0, flags=0, out=rp: lib.pb_reducer_new(
        g, n, c, d, 0.0, op, comp, flags, out)
    check("NULL out", new(out=ffi.NULL), INVALID, "NULL")
    check("NULL counts", new(c=ffi.NULL), INVALID, "counts is NULL")
    check("NULL dtypes", new(d=ffi.NULL), INVALID, "dtypes is NULL")
    check("negative nparams", new(n=-1), INVALID, "nparams")
    check("negative count", new(c=ffi.new("int64_t[]", [4, -2, 3])), INVALID, "counts[1]")
    check("int dtype", new(d=ffi.new("int32_t[]", [lib.PB_FLOAT32, lib.PB_INT32, lib.PB_FLOAT32])),
          INVALID, "floating point")
    check("unknown dtype", new(d=ffi.new("int32_t[]", [0, 99, 0])), INVALID, "99")
    check("op MAX", new(op=lib.PB_MAX), INVALID, "op")
    check("unknown compression", new(comp=7), INVALID, "compression")
    check("unknown flags", new(flags=16), INVALID, "flags")
    check("join divisor without join", new(flags=lib.PB_REDUCER_JOIN_DIVIDE_BY_ACTIVE), INVALID,
          "PB_REDUCER_JOIN_DIVIDE_BY_ACTIVE goes with PB_REDUCER_JOIN")
    check("NULL group handle", lib.pb_reducer_new(ffi.cast("pb_group *", 12345), 3, counts, dts, 0,
                                                  lib.PB_AVG, 0, 0, rp), INVALID, "group")

    assert new() == 0, last_error(ffi, lib)
    r = rp[0]
    d = ffi.new("pb_tensor *")
    check("grad index too big", lib.pb_reducer_grad(r, 3, d), INVALID, "out of range")
    check("grad index negative", lib.pb_reducer_grad(r, -1, d), INVALID, "out of range")
    check("grad NULL out", lib.pb_reducer_grad(r, 0, ffi.NULL), INVALID, "NULL")
    check("grads wrong n", lib.pb_reducer_grads(r, 2, ffi.new("pb_tensor[]", 2)), INVALID, "3 gradients")
    check("grads NULL", lib.pb_reducer_grads(r, 3, ffi.NULL), INVALID, "NULL")
    check("generation NULL", lib.pb_reducer_generation(r, ffi.NULL), INVALID, "NULL")
    check("mark bad index", lib.pb_reducer_mark_ready(r, 5), INVALID, "out of range")
    assert lib.pb_reducer_mark_ready(r, 1) == 0
    check("mark twice", lib.pb_reducer_mark_ready(r, 1), INVALID, "twice")
    # Missing gradients are listed by index with this rank; the iteration is abandoned on every rank alike.
    check("wait with missing", lib.pb_reducer_wait(r, 10.0), INVALID,
          f"indices which did not receive grad for rank {rank}: 0 2.")
    assert "Expected to have finished reduction in the prior iteration" in results["wait with missing"]
    assert "pb_reducer_wait" in results["wait with missing"]
    # A full iteration works afterwards.
    for i in (2, 1, 0):
        assert lib.pb_reducer_mark_ready(r, i) == 0, last_error(ffi, lib)
    assert lib.pb_reducer_wait(r, 10.0) == 0, last_error(ffi, lib)
    check("join without PB_REDUCER_JOIN", lib.pb_reducer_join(r, ffi.NULL, ffi.NULL), INVALID, "PB_REDUCER_JOIN")
    cube = lib.PB_GOSSIP_CUBE
    check("gossip unknown topology", lib.pb_reducer_set_gossip(r, 7, 1, 0, 0), INVALID, "topology 7")
    check("gossip ranks_per_node -1", lib.pb_reducer_set_gossip(r, cube, -1, 0, 0), INVALID, "ranks_per_node")
    check("gossip ranks_per_node 3", lib.pb_reducer_set_gossip(r, cube, 3, 0, 0), INVALID, "does not divide")
    check("gossip negative seed", lib.pb_reducer_set_gossip(r, cube, 1, -1, 0), INVALID, "seed")
    check("gossip negative sync_every", lib.pb_reducer_set_gossip(r, cube, 1, 0, -1), INVALID, "sync_every")
    check("NULL reducer", lib.pb_reducer_mark_ready(ffi.NULL, 0), INVALID, "reducer is NULL")
    check("foreign reducer", lib.pb_reducer_wait(ffi.cast("pb_reducer *", 0xdead0), 1.0), INVALID,
          "not a live")
    assert lib.pb_reducer_free(r) == 0
    check("mark after free", lib.pb_reducer_mark_ready(r, 0), INVALID, "freed")
    check("grad after free", lib.pb_reducer_grad(r, 0, d), INVALID, "freed")
    check("wait after free", lib.pb_reducer_wait(r, 1.0), INVALID, "freed")
    check("zero after free", lib.pb_reducer_zero(r), INVALID, "freed")
    check("free twice", lib.pb_reducer_free(r), INVALID, "freed")
    check("broadcast NULL tensors", lib.pb_broadcast_params(g, 2, ffi.NULL, 0), INVALID, "NULL")
    check("broadcast negative n", lib.pb_broadcast_params(g, -1, ffi.NULL, 0), INVALID, "n must be")
    check("broadcast bad root", lib.pb_broadcast_params(g, 0, ffi.NULL, world), INVALID, "root")

    # Shapes that differ across ranks: every rank is told, nobody hangs.
    mine = ffi.new("int64_t[]", [4, 2 + rank, 3])
    check("shape mismatch", lib.pb_reducer_new(g, 3, mine, dts, 0.0, lib.PB_AVG, 0, 0, rp), INVALID,
          "differ across ranks")
    assert lib.pb_finalize(g) == 0
    check("new on finalized group", new(), CLOSED)
    return sorted(results)


def test_misuse_codes():
    out = run_ranks(misuse, 2, timeout=90)
    assert out[0] == out[1] and len(out[0]) > 30


# ---- pb_reducer_create: one options struct, agreed on across ranks --------------------------

def _header_defaults():
    """The defaults pb_reducer_options_init sets, read from its body in the header."""
    import re
    with open(os.path.join(ROOT, "capi", "pybridge.h")) as f:
        text = f.read()
    body = text[text.index("static inline void pb_reducer_options_init"):]
    body = body[:body.index("\n}")]
    return dict(re.findall(r"options->(\w+) = ([^;]+);", body))


def options(ffi, lib, **fields):
    """A pb_reducer_options as pb_reducer_options_init fills it (a static inline function,
    which cffi's ABI mode cannot call), then `fields`."""
    o = ffi.new("pb_reducer_options *")  # zero-filled
    for name, value in _header_defaults().items():
        if value == "0":
            continue
        if name == "size":
            o.size = ffi.sizeof("pb_reducer_options")
        else:
            setattr(o, name, getattr(lib, value) if value.startswith("PB_") else int(value))
    for name, value in fields.items():
        setattr(o, name, value)
    return o


def test_adapter_defaults_are_the_headers():
    """The C adapter's defaults for fields past a caller's size are what
    pb_reducer_options_init sets, and it knows every field of the struct."""
    from pybridge import abi
    from pybridge.capi import reducer as adapter
    ffi, _ = load()
    fields = [name for name, _ in ffi.typeof("pb_reducer_options").fields]
    assert set(adapter._DEFAULTS) == set(fields) - {"size"}
    header = _header_defaults()
    assert set(header) == set(fields)  # the init function sets every field
    for name, value in adapter._DEFAULTS.items():
        want = header[name]
        want = getattr(abi, want) if want.startswith("PB_") else int(want)
        assert (value or 0) == want, (name, value, want)


def _create(ffi, lib, g, counts, o, dts=None):
    dts = dts if dts is not None else [lib.PB_FLOAT32] * len(counts)
    rp = ffi.new("pb_reducer **")
    rc = lib.pb_reducer_create(g, len(counts), ffi.new("int64_t[]", counts), ffi.new("int32_t[]", dts), o, rp)
    return rc, rp[0]


def _step(ffi, lib, r, values):
    for i in range(len(values)):
        v, _ = _view(ffi, lib, r, i)
        v[:] = values[i]
        assert lib.pb_reducer_mark_ready(r, i) == 0, last_error(ffi, lib)
    assert lib.pb_reducer_wait(r, 20.0) == 0, last_error(ffi, lib)
    return [_view(ffi, lib, r, i)[0].tolist() for i in range(len(values))]


def create_cases(rank, world):
    ffi, lib = load()
    INVALID = lib.PB_ERR_INVALID_ARGUMENT
    g = init_world(ffi, lib)
    odd = rank == world - 1
    msgs = {}

    def refused(name, rc_r, *words):
        rc, r = rc_r
        msg = last_error(ffi, lib)
        assert rc == INVALID, f"{name}: rc {rc}: {msg}"
        for w in words:
            assert w in msg, f"{name}: {msg!r} lacks {w!r}"
        msgs[name] = msg

    def ok(rc_r):
        rc, r = rc_r
        assert rc == 0, last_error(ffi, lib)
        return r

    # NULL options: the defaults (average, allreduce).
    r = ok(_create(ffi, lib, g, [3], ffi.NULL))
    assert _step(ffi, lib, r, [[rank] * 3]) == [[sum(range(world)) / world] * 3]
    assert lib.pb_reducer_close(r) == 0, last_error(ffi, lib)
    assert lib.pb_reducer_close(r) == INVALID  # closed: the handle is gone

    # Local errors, named.
    refused("negative cap", _create(ffi, lib, g, [3], options(ffi, lib, bucket_cap_mb=-1.0)), "bucket_cap_mb")
    refused("NaN cap", _create(ffi, lib, g, [3], options(ffi, lib, bucket_cap_mb=float("nan"))), "bucket_cap_mb")
    refused("gossip with a hook", _create(ffi, lib, g, [3], options(
        ffi, lib, hook=lib.PB_HOOK_FP16, gossip_topology=lib.PB_GOSSIP_CUBE)), "hook's place")
    refused("unknown hook", _create(ffi, lib, g, [3], options(ffi, lib, hook=9)), "hook code 9")
    refused("unknown topology", _create(ffi, lib, g, [3], options(ffi, lib, gossip_topology=5)), "topology 5")
    refused("hook flags", _create(ffi, lib, g, [3], options(ffi, lib, hook_flags=64)), "hook flags")
    refused("PowerSGD rank 0", _create(ffi, lib, g, [3], options(ffi, lib, hook=lib.PB_HOOK_POWERSGD, hook_rank=0)),
            "PowerSGD rank")
    refused("size 0", _create(ffi, lib, g, [3], options(ffi, lib, size=0)), "size is 0")
    refused("size inside a field", _create(ffi, lib, g, [3], options(ffi, lib, size=6)), "inside field op")
    ndims, dims = ffi.new("int32_t[]", [2]), ffi.new("int64_t[]", [2, 2])
    refused("shape count", _create(ffi, lib, g, [3], options(ffi, lib, ndims=ndims, dims=dims)), "4 elements")
    refused("dims NULL", _create(ffi, lib, g, [4], options(ffi, lib, ndims=ndims)), "dims is NULL")

    # An older, smaller struct: the fields past its size take their defaults, whatever the
    # memory there holds.
    old = options(ffi, lib, op=lib.PB_SUM, hook=99, gossip_topology=77)
    old.size = ffi.offsetof("pb_reducer_options", "hook")
    r = ok(_create(ffi, lib, g, [2], old))
    assert _step(ffi, lib, r, [[1.0, rank]]) == [[world, sum(range(world))]]  # op was read: sum
    assert lib.pb_reducer_close(r) == 0
    # A newer, larger struct: unknown bytes must be zero.
    known = ffi.sizeof("pb_reducer_options")
    big = ffi.new("char[]", known + 16)
    ffi.memmove(big, options(ffi, lib), known)
    newer = ffi.cast("pb_reducer_options *", big)
    newer.size = known + 16
    r = ok(_create(ffi, lib, g, [2], newer))
    assert lib.pb_reducer_close(r) == 0
    big[known + 3] = b"\x01"
    refused("newer settings", _create(ffi, lib, g, [2], newer), "newer pybridge")

    # Across ranks, without checked mode: PowerSGD beside fp16, gossip seeds, shapes.
    refused("powersgd vs fp16", _create(ffi, lib, g, [16], options(
        ffi, lib, hook=lib.PB_HOOK_POWERSGD if odd else lib.PB_HOOK_FP16)), "hook:", "powersgd_hook", "fp16")
    refused("gossip seed", _create(ffi, lib, g, [16], options(
        ffi, lib, gossip_topology=lib.PB_GOSSIP_CUBE, gossip_seed=rank)), "seed 0", "seed 1")
    ndims, dims = ffi.new("int32_t[]", [2]), ffi.new("int64_t[]", [4, 4] if odd else [2, 8])
    refused("shapes", _create(ffi, lib, g, [16], options(ffi, lib, ndims=ndims, dims=dims)), "parameters:", "(4, 4)")
    refused("op", _create(ffi, lib, g, [16], options(ffi, lib, op=lib.PB_SUM if odd else lib.PB_AVG)), "op:")
    refused("caps", _create(ffi, lib, g, [16], options(ffi, lib, first_bucket_cap_mb=1.0 + odd)), "bucket caps:")

    # The compression spelling (pb_reducer_new) and the hook spelling agree.
    counts = [100]
    if odd:
        r = _new(ffi, lib, g, counts, comp=lib.PB_COMPRESS_FP16)
    else:
        r = ok(_create(ffi, lib, g, counts, options(ffi, lib, hook=lib.PB_HOOK_FP16)))
    got = _step(ffi, lib, r, [[1.0 / 3 + rank] * 100])[0]
    exact = 1.0 / 3 + sum(range(world)) / world
    assert abs(got[0] - exact) < 2e-3 and got[0] != np.float32(exact), got[0]
    assert lib.pb_reducer_free(r) == 0  # the deprecated name still works

    # Deprecated setters after creation: compared at the next iteration's first call.
    r = ok(_create(ffi, lib, g, [16], ffi.NULL))
    assert lib.pb_reducer_set_hook(r, lib.PB_HOOK_POWERSGD if odd else lib.PB_HOOK_BF16, 1, 0) == 0, last_error(ffi, lib)
    refused("set_hook", (lib.pb_reducer_mark_ready(r, 0), None), "hook:", "powersgd_hook", "bf16")
    assert lib.pb_reducer_set_hook(r, lib.PB_HOOK_ALLREDUCE, 1, 0) == 0
    assert _step(ffi, lib, r, [[rank] * 16]) == [[sum(range(world)) / world] * 16]
    assert lib.pb_reducer_close(r) == 0
    assert lib.pb_finalize(g) == 0
    return msgs


def test_create_with_options():
    out = run_ranks(create_cases, 2, timeout=120)
    for name in ("powersgd vs fp16", "gossip seed", "shapes", "set_hook"):
        assert out[0][name] == out[1][name], name  # every rank is told every rank's value


def powersgd_through_options(rank, world):
    """Shapes and PowerSGD in the options give what the deprecated set_shapes + set_hook
    calls give: the same gradients, bit for bit."""
    ffi, lib = load()
    g = init_world(ffi, lib)
    counts = [192, 8]  # a 16 x 12 matrix (small matrices are not worth compressing) and a vector
    grad = lambda it, q, i, k: float(np.sin(0.013 * (k + 1) ** 2 + it + 7 * q + 3 * i))  # noqa: E731
    ndims, dims = ffi.new("int32_t[]", [2, 0]), ffi.new("int64_t[]", [16, 12])  # kept alive: o points at them
    o = options(ffi, lib, hook=lib.PB_HOOK_POWERSGD, hook_rank=2, hook_start_iter=2, ndims=ndims, dims=dims)
    rc, r = _create(ffi, lib, g, counts, o)
    assert rc == 0, last_error(ffi, lib)
    old = _new(ffi, lib, g, counts)
    assert lib.pb_reducer_set_shapes(old, 2, ndims, dims) == 0
    assert lib.pb_reducer_set_hook(old, lib.PB_HOOK_POWERSGD, 2, 0) == 0
    for it in range(4):  # past start_iter: compressed
        grads = [[grad(it, rank, i, k) for k in range(n)] for i, n in enumerate(counts)]
        a, b = _step(ffi, lib, r, grads), _step(ffi, lib, old, grads)
        assert a == b
    assert lib.pb_reducer_close(r) == 0 and lib.pb_reducer_close(old) == 0
    assert lib.pb_finalize(g) == 0
    mean = [np.mean([grad(3, q, 0, k) for q in range(world)]) for k in range(counts[0])]
    return max(abs(x - y) for x, y in zip(a[0], mean))


@pytest.mark.skipif(__import__("torch").cuda.is_available(),
                    reason="torch's PowerSGD hook cannot run on CPU tensors when CUDA is present")
def test_powersgd_options_match_the_deprecated_setters():
    moved = run_ranks(powersgd_through_options, 2, timeout=120)
    assert all(m > 1e-4 for m in moved), moved  # compressed: not the exact mean


@pytest.mark.parametrize("compiler", ["gcc -std=c99 -pedantic", "g++ -x c++ -pedantic"])
def test_options_from_c_and_cpp(tmp_path, compiler):
    """pb_reducer_options_init and pb_reducer_create from a C (and C++) program, warnings as
    errors: the header's struct and inline function compile cleanly in both."""
    import shutil
    import subprocess

    from ranks import free_port
    if shutil.which(compiler.split()[0]) is None:
        pytest.skip(f"{compiler.split()[0]} is not installed")
    exe = tmp_path / "reducer_options"
    flags = pybridge_flags()
    subprocess.run([*compiler.split(), "-Wall", "-Wextra", "-Werror", "-o", str(exe),
                    os.path.join(ROOT, "tests/c/reducer_options.c"), *flags], check=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    run = subprocess.run([str(exe), str(free_port())], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0 and "reducer_options: ok" in run.stdout, run.stdout + run.stderr
