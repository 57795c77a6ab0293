"""Hierarchical allreduce and model averaging through the C ABI (cffi ABI mode, 4 real
ranks pretending to be 2 nodes of 2): results against numpy, the schedule, and misuse."""

import os

import numpy as np
import pytest

from capi_loader import LIB_PATH, init_world, last_error, load
from ranks import run_ranks
from test_capi_reducer import _create, _step, options

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")

COUNTS = [5, 300, 7]


def _values(rank, step):
    rng = np.random.default_rng(10 * step + rank)
    return [rng.standard_normal(n).astype(np.float32) for n in COUNTS]


def _tensors(ffi, lib, arrays):
    ts = ffi.new("pb_tensor[]", len(arrays))
    for t, a in zip(ts, arrays):
        t.data, t.count, t.device = ffi.cast("void *", a.ctypes.data), a.size, lib.PB_CPU
        t.dtype = lib.PB_FLOAT64 if a.dtype == np.float64 else lib.PB_FLOAT32
    return ts


def _hier_reducer(ffi, lib, g, rank, world):
    out = {}
    for name, flags in (("hier", 0), ("fp16", lib.PB_HOOK_WIRE_FP16)):
        o = options(ffi, lib, hook=lib.PB_HOOK_HIERARCHICAL, hook_ranks_per_node=2, hook_flags=flags,
                    bucket_cap_mb=1e-3)
        rc, r = _create(ffi, lib, g, COUNTS, o)
        assert rc == 0, last_error(ffi, lib)
        got = _step(ffi, lib, r, [v.tolist() for v in _values(rank, 0)])
        want = [np.mean([_values(q, 0)[i] for q in range(world)], axis=0) for i in range(len(COUNTS))]
        out[name] = max(float(np.abs(np.array(a) - w).max()) for a, w in zip(got, want))
        assert lib.pb_reducer_close(r) == 0
    bad = {}
    for name, fields in (("wire without hierarchical", dict(hook=lib.PB_HOOK_FP16, hook_flags=lib.PB_HOOK_WIRE_FP16)),
                         ("two wires", dict(hook=lib.PB_HOOK_HIERARCHICAL,
                                            hook_flags=lib.PB_HOOK_WIRE_FP16 | lib.PB_HOOK_WIRE_BF16)),
                         ("node of 3", dict(hook=lib.PB_HOOK_HIERARCHICAL, hook_ranks_per_node=3)),
                         ("negative node", dict(hook=lib.PB_HOOK_HIERARCHICAL, hook_ranks_per_node=-2))):
        rc, _ = _create(ffi, lib, g, COUNTS, options(ffi, lib, **fields))
        bad[name] = (rc == lib.PB_ERR_INVALID_ARGUMENT, last_error(ffi, lib))
    out["bad"] = bad
    return out


def _averagers(ffi, lib, g, rank, world):
    out = {}
    # pb_average_params: float32 and float64 together, against numpy's mean.
    mine = [np.full(3, rank + 1.0, dtype=np.float32), np.arange(4, dtype=np.float64) * (rank + 1)]
    assert lib.pb_average_params(g, 2, _tensors(ffi, lib, mine)) == 0, last_error(ffi, lib)
    mean = sum(range(1, world + 1)) / world
    out["average"] = max(float(np.abs(mine[0] - mean).max()), float(np.abs(mine[1] - np.arange(4) * mean).max()))

    out["null tensors"] = (lib.pb_average_params(g, 2, ffi.NULL) == lib.PB_ERR_INVALID_ARGUMENT, last_error(ffi, lib))
    ints = ffi.new("pb_tensor *", {"data": ffi.new("int32_t[2]"), "count": 2, "dtype": lib.PB_INT32,
                                   "device": lib.PB_CPU})
    out["int tensor"] = (lib.pb_average_params(g, 1, ints) == lib.PB_ERR_INVALID_ARGUMENT, last_error(ffi, lib))
    out["null averager"] = (lib.pb_averager_step(ffi.NULL, 0, ffi.NULL, ffi.NULL) == lib.PB_ERR_INVALID_ARGUMENT,
                            last_error(ffi, lib))
    ap = ffi.new("pb_averager **")
    assert lib.pb_averager_create(g, 2, 1, ap) == 0, last_error(ffi, lib)
    flags = []
    x = np.zeros(6, dtype=np.float32)
    did = ffi.new("int32_t *")
    for step in range(5):
        x += rank + step  # a local step: replicas drift
        assert lib.pb_averager_step(ap[0], 1, _tensors(ffi, lib, [x]), did) == 0, last_error(ffi, lib)
        flags.append(did[0])
    out["flags"] = flags
    out["x"] = x.tolist()
    step = ffi.new("int64_t *")
    assert lib.pb_averager_get_step(ap[0], step) == 0 and step[0] == 5
    assert lib.pb_averager_set_step(ap[0], 1) == 0
    assert lib.pb_averager_step(ap[0], 1, _tensors(ffi, lib, [x]), ffi.NULL) == 0  # step 1: due
    out["set_step -1"] = lib.pb_averager_set_step(ap[0], -1) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_averager_close(ap[0]) == 0
    out["closed twice"] = lib.pb_averager_close(ap[0]) == lib.PB_ERR_INVALID_ARGUMENT
    out["period 0"] = (lib.pb_averager_create(g, 0, 0, ap) == lib.PB_ERR_INVALID_ARGUMENT, last_error(ffi, lib))

    # Hierarchical: pairs every step, all four every 2nd (step 0 included).
    periods, sizes = ffi.new("int32_t[]", [1, 2]), ffi.new("int32_t[]", [2, world])
    assert lib.pb_averager_create_hierarchical(g, 2, periods, sizes, 0, ap) == 0, last_error(ffi, lib)
    y = [np.array([float(rank)], dtype=np.float32)]
    assert lib.pb_averager_step(ap[0], 1, _tensors(ffi, lib, y), did) == 0 and did[0] == 1
    out["level 2"] = float(y[0][0])
    y[0][0] = rank
    assert lib.pb_averager_step(ap[0], 1, _tensors(ffi, lib, y), did) == 0 and did[0] == 1
    out["level 1"] = float(y[0][0])
    assert lib.pb_averager_close(ap[0]) == 0
    bad = ffi.new("int32_t[]", [3, 2])
    out["bad sizes"] = (lib.pb_averager_create_hierarchical(g, 2, bad, sizes, 0, ap) == lib.PB_ERR_INVALID_ARGUMENT,
                        last_error(ffi, lib))
    return out


def c_ranks(rank, world):
    ffi, lib = load()
    g = init_world(ffi, lib)
    out = {**_hier_reducer(ffi, lib, g, rank, world), **_averagers(ffi, lib, g, rank, world)}
    assert lib.pb_finalize(g) == 0
    return out


def test_hierarchical_and_averaging_through_c():
    res = run_ranks(c_ranks, 4, timeout=120)
    # The averager's x: steps 1 and 3 average (warm-up 1, period 2); numpy replays it.
    xs = [np.zeros(6) for _ in range(4)]
    for step in range(5):
        for r in range(4):
            xs[r] += r + step
        if step in (1, 3):
            m = np.mean(xs, axis=0)
            xs = [m.copy() for _ in range(4)]
    for rank, r in enumerate(res):
        assert r["hier"] < 1e-6 and r["fp16"] < 1e-2, r
        for name, (refused, msg) in r["bad"].items():
            assert refused, (name, msg)
        assert "PB_HOOK_HIERARCHICAL" in r["bad"]["wire without hierarchical"][1]
        assert "does not divide" in r["bad"]["node of 3"][1]
        assert r["average"] < 1e-6, r
        for name, words in (("null tensors", "tensors is NULL"), ("int tensor", "floating"), ("null averager", "averager")):
            assert r[name][0] and words in r[name][1], (name, r[name])
        assert r["flags"] == [0, 1, 0, 1, 0], r
        assert np.allclose(r["x"], xs[rank], atol=1e-5), (r["x"], xs[rank])
        assert r["set_step -1"] and r["closed twice"], r
        assert r["period 0"][0] and "period" in r["period 0"][1], r
        assert r["level 2"] == 1.5 and r["level 1"] == (0.5 if rank < 2 else 2.5), r
        assert r["bad sizes"][0] and "increase" in r["bad sizes"][1], r
