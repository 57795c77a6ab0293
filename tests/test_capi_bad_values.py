"""Extreme values through the C ABI: every one is PB_ERR_INVALID_ARGUMENT naming the argument
(they were PB_ERR_INTERNAL, an overflow deep in Python or torch, or NaN taken silently)."""

import math
import os

import pytest
import torch

from capi_loader import LIB_PATH, init_world, last_error, load
from ranks import run_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


def sweep(rank, world):
    ffi, lib = load()
    bad = []

    def expect(what, rc, words):
        msg = last_error(ffi, lib)
        if rc != lib.PB_ERR_INVALID_ARGUMENT or words not in msg:
            bad.append(f"{what}: {ffi.string(lib.pb_status_name(rc)).decode()} {msg!r}")

    gp = ffi.new("pb_group **")
    for t in (math.inf, math.nan, 1e300):
        expect(f"pb_init timeout {t}", lib.pb_init(ffi.NULL, b"gloo", -1, -1, -1, t, gp), "timeout")
    g = init_world(ffi, lib)
    x = ffi.new("float[4]")
    for n in (2**62, 2**63 - 1):
        t = ffi.new("pb_tensor *")
        t.data, t.count, t.dtype, t.device = x, n, lib.PB_FLOAT32, lib.PB_CPU
        expect(f"pb_all_reduce count {n}", lib.pb_all_reduce(g, t, lib.PB_SUM), "element count")
        expect(f"pb_broadcast_params count {n}", lib.pb_broadcast_params(g, 1, t, 0), "element count")
        expect(f"pb_buffer_new count {n}", lib.pb_buffer_new(lib.PB_FLOAT32, n, lib.PB_CPU, ffi.new("pb_buffer **")),
               "element count")
        counts, dts = ffi.new("int64_t[1]", [n]), ffi.new("int32_t[1]", [lib.PB_FLOAT32])
        expect(f"pb_reducer_new count {n}",
               lib.pb_reducer_new(g, 1, counts, dts, 0, lib.PB_AVG, 0, 0, ffi.new("pb_reducer **")), "element count")
    for dev, words in ((0, "CUDA"), (-5, "device")):
        if dev == 0 and torch.cuda.is_available():
            continue
        expect(f"pb_buffer_new device {dev}", lib.pb_buffer_new(lib.PB_FLOAT32, 4, dev, ffi.new("pb_buffer **")), words)
    counts, dts = ffi.new("int64_t[1]", [4]), ffi.new("int32_t[1]", [lib.PB_FLOAT32])
    rp = ffi.new("pb_reducer **")
    for cap in (math.inf, math.nan):
        expect(f"pb_reducer_new cap {cap}", lib.pb_reducer_new(g, 1, counts, dts, cap, lib.PB_AVG, 0, 0, rp),
               "bucket_cap_mb")
    assert lib.pb_reducer_new(g, 1, counts, dts, 0, lib.PB_AVG, 0, 0, rp) == 0
    assert lib.pb_reducer_mark_ready(rp[0], 0) == 0
    for t in (math.inf, math.nan, 1e300):
        expect(f"pb_reducer_wait {t}", lib.pb_reducer_wait(rp[0], t), "timeout")
    assert lib.pb_reducer_wait(rp[0], 10.0) == 0  # the iteration is still there to finish
    b, w = ffi.new("pb_buffer **"), ffi.new("pb_work **")
    assert lib.pb_buffer_new(lib.PB_FLOAT32, 4, lib.PB_CPU, b) == 0
    assert lib.pb_all_reduce_async(g, b[0], lib.PB_SUM, w) == 0
    for t in (math.inf, math.nan, 1e300):
        expect(f"pb_work_wait {t}", lib.pb_work_wait(w[0], t), "timeout")
    assert lib.pb_work_wait(w[0], 10.0) == 0
    assert lib.pb_finalize(g) == 0
    return bad


def test_extreme_values_are_invalid_arguments():
    assert run_ranks(sweep, 1, timeout=60) == [[]]
