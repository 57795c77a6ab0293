"""Subgroups and reducer hooks through the C ABI, on 4 real ranks (cffi ABI mode)."""

import os

import numpy as np
import pytest

from capi_loader import LIB_PATH, init_world, last_error, load, np_tensor
from ranks import run_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


def torch_has_cuda():
    import torch
    return torch.cuda.is_available()


def abi_groups(rank, world):
    ffi, lib = load()
    g = init_world(ffi, lib)
    out = {}
    i32 = ffi.new("int32_t *")

    # Two pairs reduce at once on their own subgroups; peers and roots are group ranks.
    pp = ffi.new("pb_group **")
    assert lib.pb_group_split(g, rank // 2, rank, pp) == 0, last_error(ffi, lib)
    pair = pp[0]
    assert lib.pb_rank(pair, i32) == 0 and i32[0] == rank % 2
    assert lib.pb_size(pair, i32) == 0 and i32[0] == 2
    x = np.full(100, rank + 1, np.float32)
    assert lib.pb_all_reduce(pair, np_tensor(ffi, lib, x), lib.PB_SUM) == 0
    out["sum"] = float(x[0])
    y = np.full(3, rank, np.int64)
    assert lib.pb_broadcast(pair, np_tensor(ffi, lib, y), 1) == 0
    out["bcast"] = int(y[0])
    assert lib.pb_group_global_rank(pair, 1, i32) == 0
    out["global_of_1"] = i32[0]
    assert lib.pb_group_rank_of(pair, rank, i32) == 0 and i32[0] == rank % 2
    assert lib.pb_group_rank_of(pair, (rank + 2) % 4, i32) == lib.PB_ERR_INVALID_ARGUMENT
    assert "not a member" in last_error(ffi, lib)
    assert lib.pb_broadcast(pair, np_tensor(ffi, lib, y), 2) == lib.PB_ERR_INVALID_ARGUMENT

    # Negative color: no group, PB_OK. Nested split. Member lists (non-members get NULL).
    none = ffi.new("pb_group **")
    assert lib.pb_group_split(g, -1, 0, none) == 0 and none[0] == ffi.NULL
    solo = ffi.new("pb_group **")
    assert lib.pb_group_split(pair, rank % 2, 0, solo) == 0 and solo[0] != ffi.NULL
    assert lib.pb_size(solo[0], i32) == 0 and i32[0] == 1
    members = ffi.new("int32_t[2]", [3, 0])
    sub = ffi.new("pb_group **")
    assert lib.pb_group_new(g, members, 2, sub) == 0, last_error(ffi, lib)
    assert (sub[0] == ffi.NULL) == (rank not in (0, 3))
    if sub[0] != ffi.NULL:
        assert lib.pb_rank(sub[0], i32) == 0 and i32[0] == (0 if rank == 3 else 1)  # listed order
        z = np.array([float(rank)], np.float64)
        assert lib.pb_broadcast(sub[0], np_tensor(ffi, lib, z), 0) == 0
        out["sub_root"] = float(z[0])  # group rank 0 is global rank 3
        assert lib.pb_group_close(sub[0]) == 0
        assert lib.pb_barrier(sub[0]) == lib.PB_ERR_INVALID_ARGUMENT  # closed: an unknown handle
    bad = ffi.new("int32_t[2]", [1, 1])
    assert lib.pb_group_new(g, bad, 2, sub) == lib.PB_ERR_INVALID_ARGUMENT

    # A split with its backend chosen (gloo beside the world's; "" is the parent's).
    host = ffi.new("pb_group **")
    assert lib.pb_group_split_backend(g, rank % 2, rank, b"gloo", host) == 0, last_error(ffi, lib)
    w = np.full(4, rank, np.int32)
    assert lib.pb_all_reduce(host[0], np_tensor(ffi, lib, w), lib.PB_SUM) == 0
    out["host_sum"] = int(w[0])
    assert lib.pb_group_close(host[0]) == 0
    assert lib.pb_group_split_backend(g, 0, rank, b"mpi", host) == lib.PB_ERR_INVALID_ARGUMENT
    assert "unknown backend 'mpi'" in last_error(ffi, lib)

    # Streams: NULL (the current stream) is always accepted; a stream without CUDA is named.
    assert lib.pb_group_set_stream(pair, ffi.NULL) == 0
    if not torch_has_cuda():
        assert lib.pb_group_set_stream(pair, ffi.cast("void *", 0x1000)) == lib.PB_ERR_INVALID_ARGUMENT
        assert "pb_group_set_stream: stream: a CUDA stream was given" in last_error(ffi, lib)

    # Node groups: nodes of 2 ranks.
    intra, cross = ffi.new("pb_group **"), ffi.new("pb_group **")
    assert lib.pb_group_nodes(g, 2, intra, cross) == 0, last_error(ffi, lib)
    ids = []
    for h in (intra[0], cross[0]):
        assert lib.pb_group_global_rank(h, 0, i32) == 0
        ids.append(i32[0])
    out["nodes"] = ids

    # The world cannot be closed like a subgroup; a subgroup cannot be finalized.
    assert lib.pb_group_close(g) == lib.PB_ERR_INVALID_ARGUMENT
    assert "pb_group_close: the world group is left with pb_finalize" in last_error(ffi, lib)
    assert lib.pb_finalize(pair) == lib.PB_ERR_INVALID_ARGUMENT

    # A reducer on the pair, with the fp16 hook chosen by code.
    rp = ffi.new("pb_reducer **")
    counts, dts = ffi.new("int64_t[1]", [6]), ffi.new("int32_t[1]", [lib.PB_FLOAT32])
    assert lib.pb_reducer_new(pair, 1, counts, dts, 0, lib.PB_AVG, lib.PB_COMPRESS_NONE, 0, rp) == 0
    assert lib.pb_reducer_set_hook(rp[0], lib.PB_HOOK_FP16, 0, 0) == 0, last_error(ffi, lib)
    assert lib.pb_reducer_set_hook(rp[0], 77, 0, 0) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_reducer_set_hook(rp[0], lib.PB_HOOK_POWERSGD, 0, 0) == lib.PB_ERR_INVALID_ARGUMENT
    view = ffi.new("pb_tensor *")
    assert lib.pb_reducer_grad(rp[0], 0, view) == 0
    arr = np.frombuffer(ffi.buffer(view.data, 6 * 4), np.float32)
    arr[:] = rank
    assert lib.pb_reducer_mark_ready(rp[0], 0) == 0
    assert lib.pb_reducer_wait(rp[0], 30.0) == 0, last_error(ffi, lib)
    out["reduced"] = float(arr[0])
    assert lib.pb_reducer_free(rp[0]) == 0

    assert lib.pb_barrier(g) == 0
    assert lib.pb_finalize(g) == 0
    assert lib.pb_barrier(pair) == lib.PB_ERR_CLOSED  # finalize closed every subgroup
    assert lib.pb_group_free(pair) == 0  # the deprecated name of pb_group_close still works
    return out


def test_subgroups_and_hooks_through_the_c_abi():
    res = run_ranks(abi_groups, 4, timeout=120)
    assert [r["sum"] for r in res] == [3.0, 3.0, 7.0, 7.0]
    assert [r["bcast"] for r in res] == [1, 1, 3, 3]
    assert [r["global_of_1"] for r in res] == [1, 1, 3, 3]
    assert [r.get("sub_root") for r in res] == [3.0, None, None, 3.0]
    assert [r["nodes"] for r in res] == [[0, 0], [0, 1], [2, 0], [2, 1]]
    assert [r["host_sum"] for r in res] == [2, 4, 2, 4]  # ranks {0, 2} and {1, 3}
    assert [r["reduced"] for r in res] == [0.5, 0.5, 2.5, 2.5]
