"""Every collective x dtype on 2 and 4 real ranks, checked against values computed
independently with numpy from what each rank is known to contribute."""

import numpy as np
import pytest
import torch

import pybridge
from ranks import run_ranks

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
N = 6


def contribution(rank, n=N):
    # Small positive integers: exact in every dtype, and products stay in range.
    return (np.arange(n) % 2 + 1 + rank % 2).astype(np.float64)


def expected_reduce(op, world, n=N):
    stack = np.stack([contribution(r, n) for r in range(world)])
    return {"sum": stack.sum(0), "avg": stack.mean(0), "min": stack.min(0),
            "max": stack.max(0), "product": stack.prod(0)}[op]


def as_np(t):
    return t.to(torch.float64).numpy()


def check(name, got, want):
    np.testing.assert_allclose(as_np(got), want, rtol=1e-2, atol=1e-2, err_msg=name)


def all_collectives(rank, world):
    pybridge.init(timeout=30)
    assert (pybridge.rank(), pybridge.size()) == (rank, world)
    for name in DTYPES:
        dt = getattr(torch, name)
        for op in ["sum", "min", "max", "product"] + (["avg"] if dt.is_floating_point else []):
            t = torch.tensor(contribution(rank), dtype=dt)
            pybridge.all_reduce(t, op)
            check(f"all_reduce {op} {name}", t, expected_reduce(op, world))
        for root in range(world):
            t = torch.tensor(contribution(rank) * (rank + 1), dtype=dt)
            pybridge.broadcast(t, root)
            check(f"broadcast root={root} {name}", t, contribution(root) * (root + 1))
        out = torch.zeros(N * world, dtype=dt)
        pybridge.all_gather(torch.tensor(contribution(rank), dtype=dt), out)
        check(f"all_gather {name}", out, np.concatenate([contribution(r) for r in range(world)]))
        big = torch.tensor(contribution(rank, N * world), dtype=dt)
        out = torch.zeros(N, dtype=dt)
        pybridge.reduce_scatter(big, out, "sum")
        check(f"reduce_scatter {name}", out, expected_reduce("sum", world, N * world)[rank * N:(rank + 1) * N])
        # Point to point around a ring, sync and async.
        right, left = (rank + 1) % world, (rank - 1) % world
        got = torch.zeros(N, dtype=dt)
        sent = torch.tensor(contribution(rank) + rank, dtype=dt)
        works = [pybridge.isend(sent, right, tag=3), pybridge.irecv(got, left, tag=3)]
        import time
        deadline = time.monotonic() + 20
        while not all(w.test() for w in works):  # test() must report completion on its own
            assert time.monotonic() < deadline, "isend/irecv never reported done through test()"
            time.sleep(0.001)
        check(f"isend/irecv {name}", got, contribution(left) + left)
        if rank % 2 == 0 and right != rank:
            pybridge.send(sent, right)
        elif rank % 2 == 1:
            pybridge.recv(got, left)
            check(f"send/recv {name}", got, contribution(left) + left)
        # Async collective: result defined after wait().
        t = torch.tensor(contribution(rank), dtype=dt)
        work = pybridge.all_reduce(t, "max", async_op=True)
        while not work.test():
            pass
        check(f"async all_reduce {name}", t, expected_reduce("max", world))
    pybridge.barrier()
    pybridge.finalize()
    return "ok"


@pytest.mark.parametrize("world", [2, 4])
def test_every_collective_and_dtype(world):
    assert run_ranks(all_collectives, world, timeout=150) == ["ok"] * world


def buffer_kinds(rank, world):
    """numpy arrays, bytearrays, memoryviews and raw pointers are reduced in place (zero copy)."""
    import ctypes
    from pybridge.base.buffers import from_pointer
    pybridge.init(timeout=30)
    a = np.full(4, rank + 1, dtype=np.int32)
    pybridge.all_reduce(a)
    b = bytearray(np.full(3, rank + 1.5, dtype=np.float64).tobytes())
    pybridge.all_reduce(b, "max", dtype="float64")
    m = memoryview(np.full(2, rank, dtype=np.int64))
    pybridge.broadcast(m, 1)
    raw = (ctypes.c_float * 5)(*([rank + 1.0] * 5))
    pybridge.all_reduce(from_pointer(ctypes.addressof(raw), 5, "float32"), "sum")
    bf = np.zeros(2, np.uint16)
    torch.from_numpy(bf).view(torch.bfloat16).fill_(rank + 0.5)
    pybridge.all_reduce(bf, dtype="bfloat16")
    pybridge.finalize()
    return (a.tolist(), np.frombuffer(b).tolist(), m.tolist(), list(raw),
            torch.from_numpy(bf).view(torch.bfloat16).tolist())


def test_buffer_kinds_are_zero_copy():
    results = run_ranks(buffer_kinds, 2, timeout=60)
    for a, b, m, raw, bf in results:
        assert a == [3] * 4 and b == [2.5] * 3 and m == [1, 1] and raw == [3.0] * 5 and bf == [2.0, 2.0]


def prepared_collectives(rank, world):
    """prepare_all_reduce / prepare_broadcast check once and then reduce the buffer's
    current contents on every run; a finalized group fails them with Closed."""
    pybridge.init(timeout=30)
    a = np.zeros(3, dtype=np.float32)
    reduce_sum = pybridge.comm.collectives.prepare_all_reduce(a, "sum")
    reduce_max = pybridge.comm.collectives.prepare_all_reduce(a, "max")
    got = []
    for step in range(3):
        a[:] = rank + step
        reduce_sum()
        got.append(a.tolist())
        a[:] = rank * 10 + step
        reduce_max()
        got.append(a.tolist())
    b = torch.full((2,), float(rank))
    from_last = pybridge.comm.collectives.prepare_broadcast(b, world - 1)
    from_last()
    got.append(b.tolist())
    b.fill_(rank + 7)
    from_last()
    got.append(b.tolist())
    errors = []
    for bad in (lambda: pybridge.comm.collectives.prepare_all_reduce(a, "median"),
                lambda: pybridge.comm.collectives.prepare_all_reduce(np.zeros(2, np.int32), "avg"),
                lambda: pybridge.comm.collectives.prepare_broadcast(b, world)):
        try:
            bad()
        except pybridge.InvalidArgument as err:
            errors.append(str(err))
    pybridge.finalize()
    try:
        reduce_sum()
    except pybridge.Closed as err:
        errors.append(str(err))
    return got, errors


def test_prepared_collectives_reduce_current_contents():
    world = 2
    for got, errors in run_ranks(prepared_collectives, world, timeout=60):
        want = []
        for step in range(3):
            want.append([float(sum(r + step for r in range(world)))] * 3)
            want.append([float((world - 1) * 10 + step)] * 3)
        want += [[float(world - 1)] * 2, [float(world - 1 + 7)] * 2]
        assert got == want
        assert len(errors) == 4, errors
        assert "unknown reduce op 'median'" in errors[0]
        assert "avg needs a floating-point dtype" in errors[1]
        assert f"root rank {world} is out of range" in errors[2]
        assert "finalized" in errors[3]


def wait_timeout_then_success(rank, world):
    """A wait that times out means 'not finished yet': a later wait returns the result."""
    import time
    from pybridge.errors import Timeout
    pybridge.init(timeout=30)
    buf = torch.zeros(3)
    if rank == 0:
        work = pybridge.irecv(buf, 1, tag=9)
        try:
            work.wait(timeout=0.2)  # rank 1 sends only after 1 s
            raise AssertionError("wait returned before anything was sent")
        except Timeout:
            pass
        assert not work.test()
        work.wait(timeout=20)
        got = buf.tolist()
    else:
        time.sleep(1.0)
        pybridge.send(torch.tensor([1.0, 2.0, 3.0]), 0, tag=9)
        got = None
    pybridge.barrier()
    pybridge.finalize()
    return got


def test_a_timed_out_wait_can_be_waited_again():
    assert run_ranks(wait_timeout_then_success, 2, timeout=60)[0] == [1.0, 2.0, 3.0]


def all_to_all_rank(rank, world):
    """Block j of rank r's input lands as block r of rank j's output, sync and async; in
    checked mode ranks that pass other sizes are told so, and the group goes on."""
    from pybridge.comm import collectives
    pybridge.init(timeout=30, checked=True)
    out = {}
    for dt in (torch.uint8, torch.float32):
        x = torch.tensor([10 * rank + j for j in range(2 * world)], dtype=dt)  # block j: 10r + 2j, 10r + 2j + 1
        got = torch.empty_like(x)
        collectives.all_to_all(x, got)
        out[str(dt)] = got.tolist()
    got = torch.empty(world, dtype=torch.int64)
    collectives.all_to_all(torch.full((world,), rank), got, async_op=True).wait()
    out["async"] = got.tolist()
    n = world if rank else 2 * world
    try:
        collectives.all_to_all(torch.zeros(n), torch.zeros(n))
    except pybridge.InvalidArgument as exc:
        out["mismatch"] = str(exc)
    for bad in ((torch.zeros(world), torch.zeros(world + 1)), (torch.zeros(world + 1), torch.zeros(world + 1)),
                (torch.zeros(world), torch.zeros(world, dtype=torch.int32))):
        try:
            collectives.all_to_all(*bad)
        except pybridge.InvalidArgument as exc:
            out.setdefault("bad", []).append(str(exc))
    pybridge.barrier()  # still usable
    pybridge.finalize()
    return out


def test_all_to_all():
    world = 3
    res = run_ranks(all_to_all_rank, world, timeout=60)
    for r, out in enumerate(res):
        want = [10 * s + 2 * r + k for s in range(world) for k in range(2)]
        assert out["torch.uint8"] == want and out["torch.float32"] == want
        assert out["async"] == list(range(world))
        assert "all_to_all" in out["mismatch"] and "float32 x 6" in out["mismatch"], out["mismatch"]
        assert "output must be as large as input and of its type" in out["bad"][0]
        assert "4 elements do not split into 3 equal blocks" in out["bad"][1]
        assert "output must be as large as input and of its type" in out["bad"][2]
