"""Elastic training, part 1 (pybridge/runtime/elastic.py): state committed and rolled back in memory,
and one rank's committed state sent to the others over the network (what a joiner needs)."""

import pytest
import torch
import torch.nn.functional as F

import pybridge
from pybridge import recordio as rio
from pybridge.runtime.elastic import State
from pybridge.errors import InvalidArgument
from ranks import run_ranks


def _train(model, opt, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(4, 6, generator=gen), torch.randn(4, 2, generator=gen)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


def _snapshot(model, opt):
    return ([p.detach().clone() for p in model.parameters()],
            [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()])


def test_restore_rolls_back_to_the_last_commit(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    path = str(tmp_path / "r.recordio")
    rio.write_file(path, [bytes([i]) for i in range(40)])
    loader = rio.Loader([path], 4, num_replicas=1, rank=0, prefetch=0)
    state = State(model=model, optimizer=opt, loader=loader, epoch=0, batch=0)
    it = iter(loader)
    _train(model, opt, 3, seed=1)
    first = [next(it) for _ in range(3)]
    state.batch = 3
    state.commit()
    want = _snapshot(model, opt)
    _train(model, opt, 5, seed=2)  # work after the commit...
    [next(it) for _ in range(2)]
    state.batch, state.epoch = 5, 1
    state.restore()  # ...is rolled back
    got = _snapshot(model, opt)
    assert all(torch.equal(a, b) for a, b in zip(want[0] + want[1], got[0] + got[1]))
    assert (state.epoch, state.batch) == (0, 3) and state.commits == 2
    # The loader continues after the committed batches: the rolled-back ones are read again.
    again = [bytes(r) for b in loader for r in b]
    assert again == [bytes([i]) for i in range(12, 40)], again
    assert [bytes(r) for b in first for r in b] == [bytes([i]) for i in range(12)]
    loader.close()


def test_values_and_misuse():
    state = State(step=1)
    state.step += 1
    state.commit()
    state.step = 9
    state.restore()
    assert state.step == 2
    with pytest.raises(AttributeError, match="give it at construction"):
        state.lr = 0.1
    with pytest.raises(AttributeError, match="no value 'lr'"):
        state.lr
    with pytest.raises(InvalidArgument, match="'commits': the name is taken"):
        State(commits=1)


def joiner(rank, world):
    pybridge.init()
    torch.manual_seed(rank)  # every rank starts from its own model: rank 1 "joins" with a fresh one
    model = torch.nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = State(model=model, optimizer=opt, step=0)
    if rank == 0:
        _train(model, opt, 4, seed=5)
        state.step = 4
        state.commit()
        _train(model, opt, 1, seed=6)  # not committed: not sent
    state.sync(0)
    out = [p.detach().tolist() for p in model.parameters()], state.step, state.committed_bytes
    pybridge.finalize()
    return out


def test_sync_sends_the_committed_state_to_every_rank():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, opt, 4, seed=5)
    want = [p.detach().tolist() for p in model.parameters()]
    res = run_ranks(joiner, 3, timeout=60)
    for params, step, size in res:
        assert params == want and step == 4 and size == res[0][2]


def abi_state(rank, world):
    import numpy as np
    from capi_loader import init_world, last_error, load
    ffi, lib = load()
    g = init_world(ffi, lib)
    sp = ffi.new("pb_state **")
    assert lib.pb_state_create(sp) == 0
    w = np.zeros(3, np.float32) if rank else np.array([1, 2, 3], np.float32)
    # cffi does not keep the strings of a char *[] alive: each needs a reference of its own
    # (a temporary here was freed at once, and the name read back was whatever reused it).
    w_name, v_name = ffi.new("char[]", b"w"), ffi.new("char[]", b"v")
    names = ffi.new("char *[1]", [w_name])
    t = ffi.new("pb_tensor *")
    t.data, t.count, t.dtype, t.device = ffi.cast("void *", w.ctypes.data), 3, lib.PB_FLOAT32, lib.PB_CPU
    step = ffi.new("int64_t *")
    out = {}
    if rank == 0:
        assert lib.pb_state_restore(sp[0], 1, names, t, ffi.NULL, ffi.NULL, step) == lib.PB_ERR_INVALID_ARGUMENT
        out["early"] = last_error(ffi, lib)
        assert lib.pb_state_commit(sp[0], 5, 1, names, t, ffi.NULL, ffi.NULL) == 0, last_error(ffi, lib)
        w[:] = 9
        assert lib.pb_state_restore(sp[0], 1, names, t, ffi.NULL, ffi.NULL, step) == 0, last_error(ffi, lib)
        out["restored"] = (w.tolist(), step[0])
        other = ffi.new("char *[1]", [v_name])
        assert lib.pb_state_restore(sp[0], 1, other, t, ffi.NULL, ffi.NULL, step) == lib.PB_ERR_INVALID_ARGUMENT
        out["names"] = last_error(ffi, lib)
        w[:] = 7  # not committed: sync rolls the root back too
    assert lib.pb_state_sync(sp[0], g, 0, 1, names, t, ffi.NULL, ffi.NULL, step) == 0, last_error(ffi, lib)
    out["synced"] = (w.tolist(), step[0])
    assert lib.pb_state_close(sp[0]) == 0
    assert lib.pb_state_close(sp[0]) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_finalize(g) == 0
    return out


def test_c_abi_commits_restores_and_syncs():
    res = run_ranks(abi_state, 2, timeout=60)
    assert "nothing was committed" in res[0]["early"]
    assert res[0]["restored"] == ([1.0, 2.0, 3.0], 5)
    assert "tensor names differ" in res[0]["names"]
    assert [r["synced"] for r in res] == [([1.0, 2.0, 3.0], 5)] * 2
