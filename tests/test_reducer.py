"""The reducer core as a C or Go caller drives it (no autograd): gradient views into buckets,
mark_ready, finalize. Results are checked against numpy sums of what every rank is known to
contribute; all checks for one world size share one spawn."""

import numpy as np
import pytest
import torch

import pybridge
from pybridge.errors import Closed, InvalidArgument, NotInitialized
from pybridge.comm.params import broadcast_parameters
from pybridge.ddp.reducer import MiB, ParamSpec, Reducer, assign_buckets
from ranks import run_ranks

# Mixed dtypes and shapes; sizes chosen so that a 1 KiB cap makes several buckets.
SPECS = [(300, "float32"), ((8, 16), "float16"), (50, "float32"), ((4, 4, 4), "bfloat16"),
         (200, "float64"), (1, "float32"), (400, "float32"), (33, "float16")]
TOL = {torch.float32: 1e-6, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 2e-2}
KIB = 1024 / MiB


def contribution(rank, i, it, shape):
    """What `rank` writes as gradient `i` in iteration `it`: any rank can recompute it."""
    rng = np.random.default_rng(1000 * rank + 10 * i + it)
    return rng.standard_normal(shape)


def expected(world, i, it, shape, op="avg"):
    total = sum(contribution(r, i, it, shape) for r in range(world))
    return total / world if op == "avg" else total


def write(red, rank, it, idx=None):
    for i in range(red.num_params) if idx is None else idx:
        g = red.grad(i)
        g.copy_(torch.from_numpy(contribution(rank, i, it, tuple(g.shape))))


def check_values(red, world, it, op="avg", tol=None, only=None):
    for i in range(red.num_params) if only is None else only:
        g = red.grad(i)
        want = expected(world, i, it, tuple(g.shape), op)
        t = tol or TOL[g.dtype]
        np.testing.assert_allclose(g.double().numpy(), want, rtol=t, atol=t,
                                   err_msg=f"param {i} ({g.dtype}) iteration {it} op {op}")


def raises(exc, fn, *words):
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), f"{w!r} not in error message: {e}"
        return e
    raise AssertionError(f"expected {exc.__name__}")


def check_averaging_and_layout(rank, world):
    red = Reducer(SPECS, bucket_cap_mb=KIB, first_bucket_cap_mb=KIB, rebuild=False)
    # Initial buckets: reverse parameter order, one dtype per bucket, flat storage.
    flat_order = [i for b in red.bucket_indices for i in b]
    assert red.num_buckets >= 4
    assert sorted(flat_order) == list(range(len(SPECS)))
    for b in red.buckets:
        assert {red.specs[i].dtype for i in b.members} == {b.dtype}
        assert b.flat.is_contiguous() and b.flat.dtype == b.dtype
        # Each gradient is a view into its bucket's flat buffer, laid out back to back.
        offset = 0
        for i in b.members:
            g = red.grad(i)
            assert g.data_ptr() == b.flat.data_ptr() + offset * b.flat.element_size()
            assert tuple(g.shape) == red.specs[i].shape
            offset += g.numel()
        assert offset == b.flat.numel()
    first_f32 = [b for b in red.bucket_indices if red.specs[b[0]].dtype == torch.float32][0]
    assert first_f32[0] == max(i for i, s in enumerate(SPECS) if s[1] == "float32")
    # A write through the view lands in the bucket (no copy in between).
    red.grad(0).fill_(7.0)
    assert (red.buckets[red._layout.bucket_of[0]].flat == 7.0).sum() == 300

    for it in range(3):  # state resets between iterations
        write(red, rank, it, idx=range(0, len(SPECS), 2))
        order = np.random.default_rng(rank + 17 * it).permutation(len(SPECS)).tolist()
        for i in order:
            if i % 2 == 0:
                red.mark_ready(i)
            else:  # gradients kept elsewhere (flat, float64) are copied in, scaled on the way
                red.set_grad(i, torch.from_numpy(contribution(rank, i, it, red.specs[i].shape)).reshape(-1))
        red.finalize()
        check_values(red, world, it)
    assert red.iterations == 3 and red.generation == 0

    red_sum = Reducer(SPECS, op="sum", bucket_cap_mb=KIB, first_bucket_cap_mb=KIB)
    write(red_sum, rank, 5)
    for i in range(len(SPECS)):
        red_sum.mark_ready(i)
    red_sum.wait(timeout=30)
    check_values(red_sum, world, 5, op="sum")


def check_launch_order(rank, world):
    # Four float32 parameters of 1 KiB each with a 1 KiB cap: one bucket each, in reverse.
    red = Reducer([(256, "float32")] * 4, bucket_cap_mb=KIB, first_bucket_cap_mb=KIB, rebuild=False)
    assert red.bucket_indices == [[3], [2], [1], [0]]
    write(red, rank, 0)
    red.mark_ready(1)      # bucket 2 complete, but buckets 0 and 1 are not: must wait
    red.mark_ready(0)      # bucket 3 complete: still waiting
    assert red.launched == 0
    red.mark_ready(3)      # bucket 0 complete: goes out alone
    assert red.launched == 1
    red.mark_ready(2)      # bucket 1 complete: 1, 2 and 3 go out, in order
    assert red.launched == 4
    red.finalize()
    check_values(red, world, 0)


def check_rebuild(rank, world):
    specs = [(256, "float32")] * 6 + [(128, "float16")] * 2
    red = Reducer(specs, bucket_cap_mb=2 * KIB, first_bucket_cap_mb=KIB)
    before = red.bucket_indices
    assert before[0] == [7, 6]  # the float16 bucket never fills, but its first member leads
    # Every rank marks in a different order; rank 0's must win everywhere.
    orders = [np.random.default_rng(100 + r).permutation(8).tolist() for r in range(world)]
    write(red, rank, 0)
    for i in orders[rank]:
        red.mark_ready(i)
    red.finalize()
    want = assign_buckets([ParamSpec((n,), pybridge.base.dtypes.torch_dtype(d), torch.device("cpu"))
                           for n, d in specs], orders[0], 2 * 1024, 1024)
    assert red.bucket_indices == want, (red.bucket_indices, want)
    assert red.bucket_indices != before and red.generation == 1
    check_values(red, world, 0)  # the reduced values moved into the new views
    # Only once: a different order later changes nothing.
    write(red, rank, 1)
    for i in reversed(orders[rank]):
        red.mark_ready(i)
    red.finalize()
    assert red.bucket_indices == want and red.generation == 1
    check_values(red, world, 1)
    return want


def check_compression(rank, world):
    specs = [(5000, "float32"), (3000, "float32"), (700, "float64")]
    results = {}
    for comp in (None, "fp16", "bf16"):
        red = Reducer(specs, compression=comp, bucket_cap_mb=16 * KIB, first_bucket_cap_mb=16 * KIB)
        write(red, rank, 3, idx=[0, 2])
        red.mark_ready(0)
        red.mark_ready(2)
        assert red.bucket_indices[1] == [1, 0]  # set_grad and mark_ready in one bucket
        red.set_grad(1, torch.from_numpy(contribution(rank, 1, 3, (3000,))).float())
        red.finalize()
        results[comp] = [red.grad(i).double().numpy().copy() for i in range(len(specs))]
        if comp:  # the hook's wire buffers: one per float32 bucket, in the compressed type
            wire = red._hook.state._scratch.values()
            want = torch.float16 if comp == "fp16" else torch.bfloat16
            assert wire and all(w.dtype == want for w in wire)
    exact = results[None]
    for i in range(len(specs)):
        np.testing.assert_allclose(exact[i], expected(world, i, 3, (specs[i][0],)), atol=1e-6)
    # Stated tolerance: values ~N(0, 1); fp16 keeps 11 significant bits, bf16 8.
    for comp, tol in (("fp16", 2e-3), ("bf16", 2e-2)):
        for i in (0, 1):
            diff = np.abs(results[comp][i] - exact[i])
            assert diff.max() <= tol * (1 + np.abs(exact[i]).max()), (comp, diff.max())
            assert diff.max() > 0, f"{comp}: result identical to uncompressed; was it compressed?"
        assert np.array_equal(results[comp][2], exact[2])  # float64 is never compressed


def check_unused_and_broadcast(rank, world):
    red = Reducer([(10, "float32"), (20, "float32"), (5, "float16")], allow_unused=True,
                  bucket_cap_mb=KIB / 32, first_bucket_cap_mb=KIB / 32)
    write(red, rank, 4)
    red.mark_ready(0)
    red.mark_ready(2)
    assert red.missing == [1]
    red.finalize()  # gradient 1 is sent as its view holds it
    check_values(red, world, 4)

    ts = [torch.full((5,), float(rank)), torch.arange(7, dtype=torch.int64) * (rank + 1),
          torch.tensor([rank % 2 == 0, rank % 2 == 1]), torch.full((3, 2), rank + 0.5).half()]
    broadcast_parameters(ts, 0)
    assert torch.equal(ts[0], torch.zeros(5))
    assert torch.equal(ts[1], torch.arange(7))
    assert ts[2].tolist() == [True, False]
    assert torch.equal(ts[3], torch.full((3, 2), 0.5).half())
    ts = [torch.full((4,), float(rank))]
    broadcast_parameters(ts, world - 1, chunk_mb=KIB / 1024)
    assert ts[0].tolist() == [world - 1.0] * 4


def check_errors(rank, world):
    red = Reducer([(4, "float32"), (4, "float32"), (4, "float32")], names=["a.w", "a.b", "c.w"],
                  bucket_cap_mb=KIB / 1024, first_bucket_cap_mb=KIB / 1024)
    red.mark_ready(0)
    raises(InvalidArgument, lambda: red.mark_ready(0), "a.w", "twice")
    red.mark_ready(2)
    e = raises(InvalidArgument, red.finalize, "a.b", "not marked ready")
    assert "c.w" not in str(e)
    # Every rank hit the same error, so the reducer is usable for the next iteration.
    write(red, rank, 6)
    for i in range(3):
        red.mark_ready(i)
    red.finalize()
    check_values(red, world, 6)

    red.set_grad(1, torch.ones(4))
    raises(InvalidArgument, lambda: red.set_grad(1, torch.ones(4)), "a.b", "twice")
    raises(InvalidArgument, lambda: red.set_grad(0, torch.ones(5)), "a.w", "4 elements")
    red.mark_ready(0)
    red.mark_ready(2)
    red.finalize()
    raises(InvalidArgument, lambda: red.mark_ready(3), "out of range")
    raises(InvalidArgument, lambda: red.mark_ready(True), "out of range")
    raises(InvalidArgument, lambda: red.grad(-1), "out of range")
    raises(InvalidArgument, lambda: red.finalize(timeout=0), "timeout")
    raises(InvalidArgument, lambda: Reducer([(-1, "float32")]), "non-negative")
    raises(InvalidArgument, lambda: Reducer([(4, "int32")]), "floating point")
    raises(InvalidArgument, lambda: Reducer([(4, 99)]), "dtype code")
    raises(InvalidArgument, lambda: Reducer([(4, "float32", -5)]), "device")
    raises(InvalidArgument, lambda: Reducer(["nonsense"]), "parameter 0")
    raises(InvalidArgument, lambda: Reducer([(4, "float32")], op="max"), "avg")
    raises(InvalidArgument, lambda: Reducer([(4, "float32")], compression="zip"), "compression")
    raises(InvalidArgument, lambda: Reducer([(4, "float32")], bucket_cap_mb=0), "bucket_cap_mb")
    raises(InvalidArgument, lambda: Reducer([(4, "float32")], names=["x", "y"]), "names")

    # Shapes (or options) that differ across ranks are caught at construction on every rank.
    shape = (4, 5) if rank == world - 1 else (5, 4)
    raises(InvalidArgument, lambda: Reducer([(10, "float32"), (shape, "float32")]),
           "differ across ranks", f"rank {world - 1} parameters", "(parameters differs)")
    count = [(3, "float32")] * (2 if rank == 0 else 3)
    raises(InvalidArgument, lambda: Reducer(count), "differ across ranks", "2 parameters")
    raises(InvalidArgument, lambda: Reducer([(8, "float32")], compression="fp16" if rank else None),
           "differ across ranks")

    red.close()
    raises(Closed, lambda: red.mark_ready(0), "closed")
    raises(Closed, lambda: red.grad(0), "closed")
    raises(Closed, red.finalize, "closed")


def check_poll(rank, world):
    """poll() looks without giving the iteration up: False while the other ranks have not
    marked (they wait for rank 0's file), no more marks then; a later wait() gets the
    result; poll() until True ends an iteration as wait() does."""
    import os
    import tempfile
    import time
    red = Reducer(SPECS[:3], bucket_cap_mb=KIB, first_bucket_cap_mb=KIB, rebuild=False)
    flag = os.path.join(tempfile.gettempdir(), f"pybridge-test-poll-{os.environ['MASTER_PORT']}")
    write(red, rank, 0)
    if rank == 0:
        for i in range(red.num_params):
            red.mark_ready(i)
        assert red.poll() is False and red.poll(0.05) is False  # the others wait for the flag
        raises(InvalidArgument, lambda: red.mark_ready(0), "after this iteration's end began")
        raises(InvalidArgument, lambda: red.poll(-1), "timeout")
        open(flag, "w").close()
    else:
        for _ in range(3000):  # 30 s at most
            if os.path.exists(flag):
                break
            time.sleep(0.01)
        for i in range(red.num_params):
            red.mark_ready(i)
    red.wait(timeout=30)
    check_values(red, world, 0)
    write(red, rank, 1)
    for i in range(red.num_params):
        red.mark_ready(i)
    for _ in range(3000):
        if red.poll(0.01):
            break
    else:
        raise AssertionError("poll() never found the gradients reduced")
    check_values(red, world, 1)
    assert red.iterations == 2 and red.missing == list(range(red.num_params))  # the next iteration
    pybridge.barrier()
    if rank == 0:
        os.unlink(flag)
    red.close()


def reducer_suite(rank, world):
    pybridge.init(timeout=30)
    check_averaging_and_layout(rank, world)
    check_launch_order(rank, world)
    rebuilt = check_rebuild(rank, world)
    check_compression(rank, world)
    check_unused_and_broadcast(rank, world)
    check_errors(rank, world)
    check_poll(rank, world)
    pybridge.barrier()
    pybridge.finalize()
    return rebuilt


@pytest.mark.parametrize("world", [2, 3])
def test_reducer_on_real_ranks(world):
    results = run_ranks(reducer_suite, world, timeout=80)
    assert all(r == results[0] for r in results)  # every rank rebuilt the same buckets


def specs(*pairs):
    return [ParamSpec((n,), getattr(torch, d), torch.device("cpu")) for n, d in pairs]


def test_bucket_assignment_caps_and_order():
    # 100 float32 params of 64 KiB (6.25 MiB total): first bucket closes at 1 MiB, then 2 MiB.
    ps = specs(*[(16384, "float32")] * 100)
    got = assign_buckets(ps, list(range(100))[::-1], 2 * MiB, MiB)
    assert got[0] == list(range(99, 83, -1))  # 16 x 64 KiB = 1 MiB
    assert all(len(b) == 32 for b in got[1:-1]) and sum(map(len, got)) == 100
    # Default caps: a 25 MiB bucket after the 1 MiB one.
    got = assign_buckets(ps, list(range(100)), 25 * MiB, MiB)
    assert [len(b) for b in got] == [16, 84]


def test_bucket_caps_follow_torch_ddp():
    from pybridge.ddp.reducer import bucket_caps
    assert bucket_caps() == (25.0, 1.0)              # defaults: a small first bucket
    assert bucket_caps(25) == (25, 25)               # a cap the caller chose: the first bucket too
    assert bucket_caps(4, 0.5) == (4, 0.5)           # unless that is given as well
    assert bucket_caps(None, 2) == (25.0, 2)


def test_bucket_assignment_separates_dtypes_and_sorts_by_order():
    ps = specs((10, "float32"), (10, "float16"), (10, "float32"), (10, "bfloat16"), (10, "float16"))
    got = assign_buckets(ps, [4, 3, 2, 1, 0], MiB, MiB)
    # One bucket per dtype, ordered by the position of each bucket's first member.
    assert got == [[4, 1], [3], [2, 0]]


def test_reducer_needs_init():
    with pytest.raises(NotInitialized):
        Reducer([(4, "float32")])


def silent_peer(rank, world):
    import time
    pybridge.init(timeout=30)
    red = Reducer([(1000, "float32")])
    if rank == 1:
        time.sleep(2.5)  # never marks: rank 0's allreduce has no partner
        return "idle"
    red.set_grad(0, torch.ones(1000))
    t0 = time.monotonic()
    try:
        red.finalize(timeout=1.0)
    except pybridge.Timeout:
        return time.monotonic() - t0
    return "no timeout"


def test_finalize_times_out_instead_of_hanging():
    waited, idle = run_ranks(silent_peer, 2, timeout=40)
    assert idle == "idle" and isinstance(waited, float) and waited < 2.5, waited


# ---- one configuration, agreed on across ranks ---------------------------------------------

def agreement_cases(rank, world):
    """Settings that differ on one rank only: every rank raises InvalidArgument naming the
    setting (without checked mode), at construction or at the first call of the next
    iteration after register_comm_hook/set_shapes; and two spellings of one hook agree."""
    import threading

    from pybridge.algorithms import comm_hooks
    from pybridge.algorithms.comm_hooks import BuiltinHook, GossipHook
    from pybridge.algorithms.gossip import GossipState, gossip_hook
    pybridge.init(timeout=30)
    out = {}
    odd = rank == world - 1

    def refused(make, *words):
        e = raises(InvalidArgument, make, "differ across ranks", *words)
        return str(e)

    spec = [(64, "float32")]
    # At construction: PowerSGD beside fp16, and every other setting in turn.
    out["powersgd vs fp16"] = refused(
        lambda: Reducer(spec, **({"hook": BuiltinHook(comm_hooks.HOOK_POWERSGD)} if odd else {"compression": "fp16"})),
        "hook:", "powersgd_hook", "fp16_compress_hook")
    refused(lambda: Reducer(spec, hook=BuiltinHook(comm_hooks.HOOK_POWERSGD, rank=1 + odd)), "hook:", "rank 2")
    refused(lambda: Reducer(spec, op="sum" if odd else "avg"), "op:")
    refused(lambda: Reducer(spec, bucket_cap_mb=1 + odd), "bucket caps:")
    refused(lambda: Reducer(spec, allow_unused=odd), "flags:", "allow_unused")
    refused(lambda: Reducer(spec, rebuild=not odd), "flags:", "rebuild")
    # a setting that needs another is refused on every rank before any collective (C's and Go's flags too)
    raises(InvalidArgument, lambda: Reducer(spec, divide_by_initial_world_size=False),
           "divide_by_initial_world_size=False goes with join=True")
    refused(lambda: Reducer([((8, 8) if odd else (4, 16), "float32")]), "parameters:", "(8, 8)")
    # Gossip: compared before the state (a collective creating groups) is built.
    threads = threading.active_count()
    refused(lambda: Reducer(spec, hook=GossipHook("cube", seed=int(odd))), "hook:", "seed 0", "seed 1")
    refused(lambda: Reducer(spec, hook=GossipHook("cube" if odd else "dissemination")), "topology")
    assert threading.active_count() == threads, "a refused gossip reducer left a thread"

    # Two spellings of one hook agree, and reduce as fp16 does.
    red = Reducer(spec, **({"compression": "fp16"} if odd else {"hook": comm_hooks.HOOK_FP16}))
    red.set_grad(0, torch.full((64,), 1.0 / 3 + rank))
    red.wait()
    exact = torch.full((64,), 1.0 / 3 + sum(range(world)) / world)
    assert torch.allclose(red.grad(0), exact, atol=2e-3) and not torch.equal(red.grad(0), exact), red.grad(0)
    out["fp16 alias"] = red.grad(0)[0].item()
    red.close()

    # After construction: checked at the first mark_ready, set_grad or wait of the next
    # iteration (each rank may come to a different one first), before anything is sent.
    red = Reducer([(16, "float32"), (16, "float32")], allow_unused=True)
    if odd:
        red.register_comm_hook(*comm_hooks.builtin(comm_hooks.HOOK_POWERSGD, red.group))
    else:
        red.register_comm_hook(*comm_hooks.builtin(comm_hooks.HOOK_FP16, red.group))
    calls = {"mark_ready": lambda: red.mark_ready(0), "set_grad": lambda: red.set_grad(1, torch.ones(16)),
             "wait": red.wait}
    for firsts in (("mark_ready", "wait"), ("set_grad", "mark_ready")):
        out["registered " + "/".join(firsts)] = refused(calls[firsts[rank % 2]], "hook:", "powersgd_hook")
        assert red.missing == [0, 1] and red.launched == 0  # nothing was marked or launched
    red.register_comm_hook(*comm_hooks.builtin(comm_hooks.HOOK_ALLREDUCE, red.group))
    red.set_grad(0, torch.full((16,), float(rank)))
    red.set_grad(1, torch.ones(16))
    red.wait()
    assert red.grad(0).tolist() == [sum(range(world)) / world] * 16
    # Shapes set afterwards (C and Go's set_shapes) are compared the same way.
    red.set_shapes([(4, 4) if odd else (2, 8), None])
    refused(lambda: red.mark_ready(1), "parameters:", "(4, 4)")
    red.set_shapes([(4, 4), None])
    for i in (1, 0):
        red.mark_ready(i)
    red.wait()
    # A Python hook by name: module, qualified name and the state's type.
    state = GossipState(seed=int(odd))
    red.register_comm_hook(state, gossip_hook)
    refused(lambda: red.mark_ready(0), "pybridge.algorithms.gossip.gossip_hook", "seed 0", "seed 1")
    red.close()
    assert not state._worker.is_alive(), "Reducer.close() left the gossip state's thread running"
    pybridge.barrier()
    pybridge.finalize()
    return out


def test_every_setting_is_agreed_across_ranks():
    out = run_ranks(agreement_cases, 2, timeout=120)
    # Both ranks got the same message: the values of both ranks, not only their own.
    assert out[0]["powersgd vs fp16"] == out[1]["powersgd vs fp16"]
    for key in ("registered mark_ready/wait", "registered set_grad/mark_ready"):
        assert out[0][key] == out[1][key]
    assert out[0]["fp16 alias"] == out[1]["fp16 alias"]


def gossip_closed_with_reducer(rank, world):
    import threading

    from pybridge.algorithms import comm_hooks
    from pybridge.algorithms.comm_hooks import GossipHook
    pybridge.init(timeout=30)
    gossip = lambda: sum(t.name == "pybridge-gossip" for t in threading.enumerate())  # noqa: E731
    before = gossip()
    red = Reducer([(8, "float32")], hook=GossipHook("cube", seed=3))
    during = gossip()
    red.set_grad(0, torch.full((8,), float(rank)))
    red.wait()
    red.close()
    after = gossip()
    # Replacing the hook closes the state it replaces (the reducer owns it).
    red = Reducer([(8, "float32")], hook=GossipHook("cube", seed=3))
    red.register_comm_hook(*comm_hooks.builtin(comm_hooks.HOOK_ALLREDUCE, red.group))
    replaced = gossip()
    red.close()
    pybridge.finalize()
    return before, during, after, replaced


def test_closing_a_gossip_reducer_stops_its_thread():
    for counts in run_ranks(gossip_closed_with_reducer, 2, timeout=60):
        assert counts == (0, 1, 0, 0)


def test_the_c_abis_reducer_words_are_read_in_the_core():
    # C's pb_reducer_options (which Go's options fill) become Reducer keywords and a hook in
    # ddp/settings.py, named from the header: a flag the header adds and the core does not
    # read fails here
    from pybridge import abi
    from pybridge.algorithms.comm_hooks import GossipHook
    from pybridge.ddp import settings
    assert set(settings._FLAG_KEYWORDS) | {"PB_REDUCER_BUCKET_VIEW"} == set(settings.REDUCER_FLAGS)
    words, view = settings.flag_keywords(abi.PB_REDUCER_JOIN | abi.PB_REDUCER_JOIN_DIVIDE_BY_ACTIVE |
                                         abi.PB_REDUCER_BUCKET_VIEW, attach=True)
    assert words == {"allow_unused": False, "rebuild": True, "join": True, "divide_by_initial_world_size": False}
    assert view and settings.flag_keywords(abi.PB_REDUCER_NO_REBUILD)[0]["rebuild"] is False
    refusals = [(lambda: settings.flag_keywords(64), ["unknown reducer flags 0x40", "PB_REDUCER_BUCKET_VIEW (16)"]),
                (lambda: settings.flag_keywords(abi.PB_REDUCER_BUCKET_VIEW), ["goes with pb_reducer_attach"]),
                (lambda: settings.hook_of(flags=8), ["unknown hook flags 0x8", "PB_HOOK_NO_WARM_START (1)"]),
                (lambda: settings.hook_of(abi.PB_HOOK_HIERARCHICAL, flags=abi.PB_HOOK_WIRE_FP16 | abi.PB_HOOK_WIRE_BF16),
                 ["PB_HOOK_WIRE_BF16 and PB_HOOK_WIRE_FP16; choose one"]),
                (lambda: settings.hook_of(flags=abi.PB_HOOK_WIRE_FP16), ["goes with PB_HOOK_HIERARCHICAL"]),
                (lambda: settings.hook_of(topology=7), ["unknown gossip topology 7", "PB_GOSSIP_CUBE (0)"]),
                (lambda: settings.hook_of(abi.PB_HOOK_FP16, topology=abi.PB_GOSSIP_CUBE), ["takes the hook's place"]),
                (lambda: settings.compression_hook(7), ["unknown compression 7", "PB_COMPRESS_BF16 (2)"])]
    for call, words in refusals:
        raises(InvalidArgument, call, *words)
    wired = settings.hook_of(abi.PB_HOOK_HIERARCHICAL, flags=abi.PB_HOOK_WIRE_BF16, ranks_per_node=2)
    assert (wired.code, wired.compression) == (abi.PB_HOOK_HIERARCHICAL, "bf16")
    assert settings.hook_of(abi.PB_HOOK_POWERSGD, flags=abi.PB_HOOK_NO_WARM_START).warm_start is False
    gossip = settings.hook_of(topology=abi.PB_GOSSIP_DISSEMINATION, gossip_ranks_per_node=1)
    assert isinstance(gossip, GossipHook) and gossip.settings["topology"] == "dissemination"
    assert settings.compression_hook(abi.PB_COMPRESS_BF16) == abi.PB_HOOK_BF16


def test_wait_is_the_name_and_finalize_an_alias():
    assert Reducer.finalize is Reducer.wait
