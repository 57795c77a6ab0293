"""Communication hooks: torch's own DDP comm hooks run unmodified on pybridge's DDP wrapper
and end with the same weights as torch DDP with the same hook; pybridge's built-in hooks
(by code, as C and Go select them) match torch's; hook errors are pybridge errors."""

import glob
import os

import pytest
import torch
import torch.nn.functional as F

from ranks import run_ranks

STEPS = 6


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 5))


def _data(rank, world):
    g = torch.Generator().manual_seed(11)
    out = []
    for _ in range(STEPS):
        x, y = torch.randn(8 * world, 20, generator=g), torch.randn(8 * world, 5, generator=g)
        out.append((x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8]))
    return out


def _train(net, data):
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for x, y in data:
        opt.zero_grad()
        F.mse_loss(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def _torch_hook(name):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                            start_powerSGD_iter=2, random_seed=5)
        return state, powerSGD_hook.powerSGD_hook
    if name == "bf16":  # torch's bf16_compress_hook refuses to run without CUDA and NCCL: its body
        def bf16_hook(state, bucket):
            return default_hooks._compress_hook(torch.bfloat16, state, bucket)
        return None, bf16_hook
    return None, {"allreduce": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook}[name]


def torch_hooks_vs_torch_ddp(rank, world, names):
    import pybridge
    from pybridge.algorithms import comm_hooks
    pybridge.init(backend="gloo", timeout=60)
    data = _data(rank, world)
    out = {}
    for name in names:
        ours = pybridge.DistributedDataParallel(_model(1))
        ours.register_comm_hook(*_torch_hook(name))
        theirs = torch.nn.parallel.DistributedDataParallel(_model(1))
        theirs.register_comm_hook(*_torch_hook(name))
        a, b = _train(ours, data), _train(theirs, data)
        out[name] = max((p - q).abs().max().item() for p, q in zip(a, b))
        ours.close()
    # pybridge's built-in hooks, chosen as C and Go choose them (by code), against torch's.
    for name, code in (("fp16", comm_hooks.HOOK_FP16), ("bf16", comm_hooks.HOOK_BF16),
                       ("powersgd", comm_hooks.HOOK_POWERSGD)):
        ours = pybridge.DistributedDataParallel(_model(1))
        ours.register_comm_hook(*comm_hooks.builtin(code, pybridge.current(), rank=2, start_iter=2, seed=5)
                                if code == comm_hooks.HOOK_POWERSGD
                                else comm_hooks.builtin(code, pybridge.current()))
        theirs = torch.nn.parallel.DistributedDataParallel(_model(1))
        theirs.register_comm_hook(*_torch_hook(name))
        a, b = _train(ours, data), _train(theirs, data)
        out["builtin " + name] = max((p - q).abs().max().item() for p, q in zip(a, b))
        ours.close()
    # The uncompressed reference, to show the compressed runs really differ from it.
    plain = _train(pybridge.DistributedDataParallel(_model(1)), data)
    ref = _train(torch.nn.parallel.DistributedDataParallel(_model(1)), data)
    out["plain"] = max((p - q).abs().max().item() for p, q in zip(plain, ref))
    theirs = torch.nn.parallel.DistributedDataParallel(_model(1))
    theirs.register_comm_hook(*_torch_hook("powersgd"))
    out["powersgd vs plain"] = max((p - q).abs().max().item() for p, q in zip(_train(theirs, data), ref))
    pybridge.finalize()
    return out


# torch's powerSGD_hook calls torch.cuda.synchronize(bucket device) whenever CUDA is present,
# which raises for CPU buckets: on a GPU machine it fails under torch DDP on gloo as well.
CPU_POWERSGD = pytest.mark.skipif(torch.cuda.is_available(),
                                  reason="torch's PowerSGD hook cannot run on CPU tensors when CUDA is present")


@CPU_POWERSGD
def test_torch_hooks_match_torch_ddp():
    res = run_ranks(torch_hooks_vs_torch_ddp, 2, ["allreduce", "fp16", "bf16", "powersgd"], timeout=180)
    for r in res:
        # torch's hooks run the same code on the same bucket contents in the same order: the
        # weights after 6 steps were identical (0.0) in every run. pybridge's fp16 built-in
        # divides by the world size before casting rather than after (measured 9e-8).
        for name in ("plain", "allreduce", "fp16", "bf16", "powersgd",
                     "builtin fp16", "builtin bf16", "builtin powersgd"):
            assert r[name] < 1e-6, (name, r)
        assert r["powersgd vs plain"] > 1e-3, r  # PowerSGD really compressed (measured 0.019)


def custom_hook_errors(rank, world):
    import pybridge
    from pybridge.errors import InvalidArgument, PyBridgeError
    pybridge.init(backend="gloo", timeout=30)
    calls = []

    def counting(state, bucket):
        calls.append((bucket.index(), bucket.is_last(), len(bucket.gradients()), len(bucket.parameters())))
        return pybridge.comm.collectives.all_reduce_future(bucket.buffer().div_(world))

    ddp = pybridge.DistributedDataParallel(_model(1), bucket_cap_mb=0.002, first_bucket_cap_mb=0.002)
    ddp.register_comm_hook(None, counting)
    _train(ddp, _data(rank, world)[:2])
    nb = ddp.reducer.num_buckets
    assert nb >= 2 and len(calls) == 2 * nb and calls[:nb] == sorted(calls[:nb]), calls
    assert [c[1] for c in calls[:nb]] == [False] * (nb - 1) + [True]
    assert sum(c[2] for c in calls[:nb]) == 6 and all(c[2] == c[3] for c in calls)

    def broken(state, bucket):
        raise RuntimeError("the hook broke")
    ddp.register_comm_hook(None, broken)
    x, y = _data(rank, world)[0]
    try:
        F.mse_loss(ddp(x), y).backward()
        raise AssertionError("a failing hook was not reported")
    except PyBridgeError as exc:
        assert "bucket" in str(exc) and "the hook broke" in str(exc), exc
    try:
        ddp.register_comm_hook(None, "not callable")
        raise AssertionError("accepted")
    except InvalidArgument:
        pass
    pybridge.finalize()
    return "ok"


def test_custom_hook_contract_and_errors():
    assert run_ranks(custom_hook_errors, 2, timeout=120) == ["ok", "ok"]


def test_builtin_codes_are_checked():
    from pybridge.algorithms import comm_hooks
    from pybridge.errors import InvalidArgument
    for kw in (dict(code=99), dict(code=comm_hooks.HOOK_POWERSGD, rank=0)):
        with pytest.raises(InvalidArgument):
            comm_hooks.builtin(kw.pop("code"), None, **kw)


def hook_start_order(rank, world):
    """Buckets 0..2 whose hooks return futures completed only by hand: which hooks have
    started once every gradient is marked, before any future is done?"""
    import pybridge
    from pybridge.algorithms.comm_hooks import declare_eager
    pybridge.init(backend="gloo", timeout=30)
    started = {}
    for kind in ("default", "eager"):
        calls, futs = [], []

        def held(state, bucket, calls=calls, futs=futs):
            calls.append(bucket.index())
            fut = torch.futures.Future()
            futs.append((fut, bucket.buffer()))
            return fut
        if kind == "eager":
            declare_eager(held)
        red = pybridge.Reducer([(1024, "float32")] * 3, bucket_cap_mb=0.001, first_bucket_cap_mb=0.001,
                               rebuild=False)
        red.register_comm_hook(None, held)
        assert red.num_buckets == 3, red.num_buckets
        for i in (2, 1, 0):  # backward order: the last parameters' bucket fills first
            red.grad(i).fill_(1.0)
            red.mark_ready(i)
        started[kind] = list(calls)
        while len(futs) < 3 or not all(f.done() for f, _ in futs):  # complete what has started
            for f, buf in futs:
                if not f.done():
                    f.set_result(buf)
        red.finalize()
        started[kind + " after"] = list(calls)
        red.close()
    pybridge.finalize()
    return started


def test_hooks_wait_for_the_previous_bucket_unless_declared_eager():
    started = run_ranks(hook_start_order, 1, timeout=60)[0]
    assert started["default"] == [0] and started["default after"] == [0, 1, 2], started
    assert started["eager"] == [0, 1, 2] and started["eager after"] == [0, 1, 2], started


def hooks_bind_their_dtype(rank, world):
    import warnings

    import pybridge
    from pybridge.algorithms import comm_hooks
    pybridge.init(backend="gloo", timeout=30)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctx = comm_hooks.HookContext(pybridge.current(), torch.float32)  # the old way to send float32
    assert any(issubclass(w.category, DeprecationWarning) and "ignored" in str(w.message) for w in caught)
    out = {}
    for name, hook in (("fp16", comm_hooks.fp16_compress_hook), ("bf16", comm_hooks.bf16_compress_hook)):
        buf = torch.full((10,), 1.0 / 3)
        fut = hook(ctx, comm_hooks.GradBucket(0, buf, [buf], None, True))
        fut.wait()
        out[name] = (str(ctx._scratch[0].dtype), buf[0].item())
    pybridge.finalize()
    return out


def test_compress_hooks_bind_their_wire_type():
    out = run_ranks(hooks_bind_their_dtype, 1, timeout=60)[0]
    # The wire type is the hook's whatever the state says, and the values went through it.
    assert out["fp16"] == ("torch.float16", torch.tensor(1.0 / 3).half().item()), out
    assert out["bf16"] == ("torch.bfloat16", torch.tensor(1.0 / 3).bfloat16().item()), out
    assert out["fp16"][1] != out["bf16"][1] != torch.tensor(1.0 / 3).item()


def test_identity_names_the_hook_its_state_and_settings():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from pybridge.algorithms import comm_hooks
    ident = comm_hooks.identity
    assert ident(None, default_hooks.fp16_compress_hook) == \
        "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook"
    assert ident(comm_hooks.HookContext(None), comm_hooks.fp16_compress_hook) == \
        "pybridge.algorithms.default_hooks.fp16_compress_hook(state pybridge.algorithms.contract.HookContext)"
    # A built-in chosen by settings has the identity of the (state, hook) it builds, so
    # Python's, C's and Go's ways of choosing a hook agree across ranks.
    for code in (comm_hooks.HOOK_ALLREDUCE, comm_hooks.HOOK_FP16, comm_hooks.HOOK_BF16):
        spec = comm_hooks.BuiltinHook(code)
        assert spec.identity() == ident(*spec.build(None))
    psgd = comm_hooks.BuiltinHook(comm_hooks.HOOK_POWERSGD, rank=3, warm_start=False, start_iter=5)
    assert psgd.identity() == ident(*comm_hooks.builtin(comm_hooks.HOOK_POWERSGD, None, rank=3,
                                                        warm_start=False, start_iter=5))
    assert "rank 3" in psgd.identity() and "warm_start False" in psgd.identity() and "start_iter 5" in psgd.identity()
    assert psgd.identity() != comm_hooks.BuiltinHook(comm_hooks.HOOK_POWERSGD, rank=2).identity()
    # Settings other hooks ignore do not tell them apart.
    assert comm_hooks.BuiltinHook(comm_hooks.HOOK_FP16, rank=4).identity() == \
        comm_hooks.BuiltinHook(comm_hooks.HOOK_FP16).identity()


def gossip_identity(rank, world):
    import pybridge
    from pybridge.algorithms import comm_hooks
    pybridge.init(backend="gloo", timeout=30)
    spec = comm_hooks.GossipHook("Dissemination", ranks_per_node=1, seed=4, sync_every=3)
    state, hook = spec.build(pybridge.current())
    same = spec.identity() == comm_hooks.identity(state, hook)
    text = spec.identity()
    state.close()
    pybridge.finalize()
    return same, text


def test_gossip_spec_identity_matches_its_state():
    same, text = run_ranks(gossip_identity, 1, timeout=60)[0]
    assert same, text
    assert "topology 'dissemination'" in text and "seed 4" in text and "sync_every 3" in text


def test_hook_step_is_typed():
    from pybridge.algorithms import comm_hooks
    state = comm_hooks.powersgd_state(None)
    assert comm_hooks.hook_step(state) == 0
    comm_hooks.set_hook_step(state, 7)
    assert state.iter == 7 and comm_hooks.hook_step(state) == 7
    for other in (None, comm_hooks.HookContext(None), object()):
        assert comm_hooks.hook_step(other) is None
        comm_hooks.set_hook_step(other, 3)  # ignored


def test_the_builtin_table_is_the_headers_and_gos():
    # One table of built-in hooks (comm_hooks.BUILTIN): the header's PB_HOOK_* codes (the
    # others are hook_flags bits) and Go's Hook constants name exactly its entries.
    import re

    from pybridge import InvalidArgument, abi
    from pybridge.algorithms import comm_hooks
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    table = {name: code for code, (name, _) in comm_hooks.BUILTIN.items()}
    assert all(getattr(abi, name) == code for name, code in table.items())
    header = open(os.path.join(repo, "capi", "pybridge.h")).read()
    codes = {n for n, comment in re.findall(r"#define (PB_HOOK_\w+) +\d+ +/\* *(\S+)", header)
             if comment != "hook_flags:"}
    assert codes == set(table), "header hook codes vs comm_hooks.BUILTIN"
    go = "".join(open(p).read() for p in glob.glob(os.path.join(repo, "go", "*.go")) if not p.endswith("_test.go"))
    assert set(re.findall(r"\bHook\w* +Hook = C\.(PB_HOOK_\w+)", go)) == set(table), "Go Hook constants vs BUILTIN"
    with pytest.raises(InvalidArgument, match="unknown hook code 9; use one of PB_HOOK_ALLREDUCE"):
        comm_hooks.builtin(9, None)
    with pytest.raises(InvalidArgument, match="unknown hook code"):
        comm_hooks.builtin([1], None)


def test_every_built_in_hook_has_its_row_in_the_docs_table():
    # The recipe's written doc line for a built-in hook (docs/design.md, "Adding a built-in
    # hook"): its row in docs/comm-hooks.md's table of built-in hooks, by its C name.
    from pybridge.algorithms import comm_hooks
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    doc = open(os.path.join(repo, "docs", "comm-hooks.md")).read()
    table = doc.split("## Built-in hooks", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for name, _ in comm_hooks.BUILTIN.values():
        assert any(f"`{name}`" in row for row in rows), f"{name}: its row in docs/comm-hooks.md's built-in table"
