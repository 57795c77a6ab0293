"""DiLoCo and Streaming DiLoCo on real ranks against the plain single-process transcription
in diloco_reference.py (50 steps, 2 and 4 ranks, float32 and quantized with error
feedback), the quantized average against the float32 mean within the codecs' bounds, a
checkpoint taken while a sync is under way, and torchft's own DiLoCo on the same data."""

import io

import pytest
import torch

import diloco_reference as ref
from pybridge.algorithms.quantize import Codec
from ranks import run_ranks

STEPS = 50
PLAIN = dict(sync_every=5)                                               # DiLoCo: all of it every 5 steps
STREAM = dict(sync_every=6, fragments=((0, 1), (2, 3)), delay=1, alpha=0.5)  # 2 fragments, tau 1


def _flat(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).clone()


def _train(rank, steps, **how):
    """This rank's run of `steps` inner steps; the flat parameters and the DiLoCo."""
    from pybridge.algorithms.diloco import DiLoCo
    net = ref.model()
    opt = ref.inner_optimizer(net)
    how = ref.diloco_kwargs(how)
    d = DiLoCo(list(net.parameters()), **how)
    applied = []
    for t in range(1, steps + 1):
        ref.inner_step(net, opt, rank, t)
        if d.step():
            applied.append(t)
    return net, opt, d, applied


def _quantized_averages(rank, world):
    """Each format's average of 1001 values (odd, not whole blocks) against the exact mean:
    within the bound of both quantizations, the same bits on every rank."""
    import pybridge
    from pybridge.algorithms import quantized_average as qa
    from pybridge.algorithms.quantize import FORMATS
    n = 1001
    g = torch.Generator().manual_seed(7 + rank)
    x = torch.randn(n, generator=g) * torch.logspace(-2, 2, n)
    every = torch.empty(world * n)
    pybridge.all_gather(x, every)
    xs = every.view(world, n)
    mean = xs.sum(0) / world
    out = {}
    for name in FORMATS:
        c = Codec(name, 64)
        got = qa.average(x, c)
        first = sum(c.bound(xs[r]) for r in range(world)) / world  # each rank's quantization
        second = c.bound(mean.abs() + first)  # the mean's, with its scale from |mean| + that
        err = (got.value - mean).abs()
        slack = 1e-6 * mean.abs().max()
        check = torch.empty(world * n)
        pybridge.all_gather(got.value, check)
        out[name] = {"within": bool((err <= first + second + slack).all()), "err": err.max().item(),
                     "same": bool((check.view(world, n) == got.value).all()),
                     "sent": got.sent_bytes, "formula": qa.sent_bytes(n, world, c)}
    return out


def _checkpoint_under_way(rank):
    """Streaming int8 with error feedback: save after step 14 (a sync started at step 14 is
    still travelling), load into new objects, go on to step 20; the same as not stopping."""
    how = dict(STREAM, codec=Codec("int8", 16), error_feedback=True)
    whole, _, d0, _ = _train(rank, 20, **how)
    net, opt, d, _ = _train(rank, 14, **how)
    under_way = d._pending is not None
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "diloco": d.state_dict()}, buf)
    d.close()
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    from pybridge.algorithms.diloco import DiLoCo
    net2 = ref.model()
    opt2 = ref.inner_optimizer(net2)
    how2 = dict(how)
    how2["fragments"] = [list(f) for f in how2["fragments"]]
    codec = how2.pop("codec")
    d2 = DiLoCo(list(net2.parameters()), quantization=codec.name, block_size=codec.block, **how2)
    net2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    d2.load_state_dict(saved["diloco"])
    for t in range(15, 21):
        ref.inner_step(net2, opt2, rank, t)
        d2.step()
    out = {"under_way": under_way, "diff": (_flat(net2) - _flat(whole)).abs().max().item(),
           "syncs": (d2.syncs, d0.syncs)}
    d0.close()
    d2.close()
    return out


def diloco_ranks(rank, world):
    import pybridge
    pybridge.init(backend="gloo", timeout=60)
    out = {}
    net, _, d, out["plain_applied"] = _train(rank, STEPS, **PLAIN)
    out["plain"] = _flat(net).tolist()  # plain lists: tensors would travel as shared memory
    out["plain_bytes"] = (d.bytes_sent, d.bytes_per_sync())
    d.close()
    net, _, d, out["stream_applied"] = _train(rank, STEPS, **STREAM)
    out["stream"] = _flat(net).tolist()
    d.close()
    net, _, d, _ = _train(rank, STEPS, **STREAM, codec=Codec("int4", 8), error_feedback=True)
    out["int4"] = _flat(net).tolist()
    d.close()
    out["averages"] = _quantized_averages(rank, world)
    if world == 2:
        out["checkpoint"] = _checkpoint_under_way(rank)
    pybridge.finalize()
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_diloco_equals_the_reference(world):
    res = run_ranks(diloco_ranks, world, timeout=240)
    want = ref.run(world, STEPS, **PLAIN)
    stream = ref.run(world, STEPS, **STREAM)
    int4 = ref.run(world, STEPS, **STREAM, codec=Codec("int4", 8), error_feedback=True)
    for out in res:
        for k in ("plain", "stream", "int4"):
            out[k] = torch.tensor(out[k])
    for r, out in enumerate(res):
        assert (out["plain"] - want[r]).abs().max().item() <= 1e-6
        assert (out["stream"] - stream[r]).abs().max().item() <= 1e-6
        assert (out["int4"] - int4[r]).abs().max().item() <= 1e-6
        assert out["plain_applied"] == list(range(5, STEPS + 1, 5))
        assert out["stream_applied"] == list(range(3, STEPS + 1, 3))
    # Plain DiLoCo ends each sync with equal replicas (step 50 is a sync); streaming's mixing does not.
    assert all((res[0]["plain"] == out["plain"]).all() for out in res)
    assert not (res[0]["stream"] == res[1]["stream"]).all()
    # The runs trained: the replicas moved away from the start.
    assert (want[0] - ref.run(world, 0, **PLAIN)[0]).abs().max() > 0.05
    for name, a in res[0]["averages"].items():
        assert a["within"] and a["same"], (name, a)
        assert a["sent"] == a["formula"]
    # int4's error is larger than int8's, which is larger than fp32's (exact but for the sum order).
    errs = {k: v["err"] for k, v in res[0]["averages"].items()}
    assert errs["fp32"] < 1e-5 < errs["bf16"] and errs["int8"] < errs["int4"], errs
    sent, per_sync = res[0]["plain_bytes"]
    assert sent == per_sync * (STEPS // 5) and per_sync > 0
    if world == 2:
        for out in res:
            c = out["checkpoint"]
            assert c["under_way"] and c["diff"] == 0.0 and c["syncs"][0] == c["syncs"][1], c


def bad_settings_rank(rank, world):
    import re

    import pybridge
    from pybridge.algorithms.diloco import DiLoCo
    from pybridge.errors import InvalidArgument
    net = ref.model()
    ps = list(net.parameters())
    cases = [
        (dict(sync_every=0), "sync_every must be a positive integer"),
        (dict(sync_every=5, fragments=2), "sync_every 5 is not a multiple of the 2 fragments"),
        (dict(sync_every=4, fragments=2, delay=2), "delay 2 must be below sync_every / fragments = 2"),
        (dict(sync_every=4, fragments=5), "5 fragments of 4 tensors"),
        (dict(sync_every=4, fragments=[[0, 1], [1, 2, 3]]), "tensor 1 is in fragments 0 and 1"),
        (dict(sync_every=4, fragments=[[0, 1]]), "tensors [2, 3] are in no fragment"),
        (dict(sync_every=4, alpha=1.5), "alpha must be a number in [0, 1]"),
        (dict(sync_every=4, quantization="int3"), "quantization 'int3' is unknown"),
        (dict(sync_every=4, error_feedback=True), "error_feedback needs a lossy quantization"),
        (dict(sync_every=4, outer_optimizer=lambda p: None), "outer_optimizer returned a NoneType"),
    ]
    pybridge.init(backend="gloo", timeout=30)
    try:
        for kw, words in cases:
            with pytest.raises(InvalidArgument, match=re.escape(words)):
                DiLoCo(ps, **kw)
        with pytest.raises(InvalidArgument, match="params is empty"):
            DiLoCo([], sync_every=2)
        d = DiLoCo(ps, sync_every=2)
        with pytest.raises(InvalidArgument, match="this DiLoCo was made for"):
            d.step(ps[:2])
        with pytest.raises(InvalidArgument, match="DiLoCo state of other settings: sync_every 3"):
            d.load_state_dict(DiLoCo(ps, sync_every=3).state_dict())
        # one rank: the average is the rank's own pseudo-gradient; the outer step still applies
        before = _flat(net)
        ref.inner_step(net, torch.optim.SGD(ps, lr=0.1), 0, 1)
        moved = _flat(net) - before
        ref.inner_step(net, torch.optim.SGD(ps, lr=0.0), 0, 2)
        assert d.step() is False and d.step() is True
        # Nesterov's first step: anchor - 0.7 (g + 0.9 g), g = -moved
        assert torch.allclose(_flat(net), before + 0.7 * 1.9 * moved, atol=1e-6)
    finally:
        pybridge.finalize()


def test_diloco_refuses_bad_settings():
    """Settings refused by name; on one rank the outer step applies the rank's own pseudo-gradient."""
    run_ranks(bad_settings_rank, 1, timeout=60)


def settings_mismatch_rank(rank, world):
    import pybridge
    from pybridge.algorithms.diloco import DiLoCo
    from pybridge.errors import InvalidArgument
    pybridge.init(backend="gloo", timeout=30)
    net = ref.model()
    out = {}
    try:
        DiLoCo(list(net.parameters()), sync_every=4, quantization="int8" if rank else "int4")
    except InvalidArgument as exc:
        out["settings"] = str(exc)
    # Replicas whose counts differ after a world change (one finished a sync the other did
    # not): step() refuses until a state is loaded.
    d = DiLoCo(list(net.parameters()), sync_every=4)
    saved = d.state_dict()
    if rank == 1:
        d.step_count, d.syncs = 4, 1
    d.rebind(pybridge.current())
    try:
        d.step()
    except pybridge.InvalidState as exc:
        out["diverged"] = str(exc)
    d.load_state_dict(saved)
    out["after_load"] = d.step()  # usable again: step 1, no sync
    with torch.no_grad():
        next(net.parameters()).add_(rank)  # replicas that were not broadcast
    try:
        DiLoCo(list(net.parameters()), sync_every=4)
    except InvalidArgument as exc:
        out["weights"] = str(exc)
    pybridge.finalize()
    return out


def test_ranks_with_other_settings_or_weights_are_refused():
    res = run_ranks(settings_mismatch_rank, 2, timeout=120)
    for out in res:
        assert "rank 0 sync_every 4, 1 fragments, delay 0, alpha 0.0, int4" in out["settings"]
        assert "(quantization differs)" in out["settings"]
        assert "(initial weights differs)" in out["weights"] and "broadcast them first" in out["weights"]
        assert "DiLoCo replicas disagree after the world changed (step, syncs applied by rank: " \
               "[(0, 0), (4, 1)])" in out["diverged"] and out["after_load"] is False


def torchft_rank(rank, world):
    """torchft's DiLoCo (its Manager replaced by the least it needs: an allreduce that
    averages over the pybridge world, and commits that always succeed) and pybridge's, on
    the same model, inner optimizer and data."""
    import pybridge
    from torchft.local_sgd import DiLoCo as TorchftDiLoCo
    from torchft.work import _DummyWork

    class Manager:  # the calls torchft.local_sgd.DiLoCo makes
        _use_async_quorum = False

        def __init__(self):
            self.step = 0

        def allreduce(self, tensor, should_quantize=False, reduce_op=None):
            pybridge.all_reduce(tensor, pybridge.SUM)
            tensor /= pybridge.size()  # torchft's Manager: a SUM, then / participants
            return _DummyWork(tensor)

        def should_commit(self, timeout=None):
            self.step += 1
            return True

        def current_step(self):
            return self.step

        def start_quorum(self, *a, **k):
            pass

        def register_state_dict_fn(self, *a, **k):
            pass

        def allow_state_dict_read(self):
            pass

        def disallow_state_dict_read(self):
            pass

    pybridge.init(backend="gloo", timeout=60)
    out = {}
    for name, how in (("plain", PLAIN), ("stream", STREAM)):
        net = ref.model()
        inner = ref.inner_optimizer(net)
        frags = how.get("fragments", ((0, 1, 2, 3),))
        modules = [net] if len(frags) == 1 else [net[0], net[2]]  # tensors (0, 1) and (2, 3)
        outer = [torch.optim.SGD(m.parameters(), lr=0.7, momentum=0.9, nesterov=True) for m in modules]
        with TorchftDiLoCo(Manager(), modules, inner, outer, sync_every=how["sync_every"],
                           fragment_sync_delay=how.get("delay", 0), fragment_update_alpha=how.get("alpha", 0.0)):
            for t in range(1, STEPS + 1):
                ref.inner_step(net, inner, rank, t)  # its hooks on inner.step() sync
        theirs = _flat(net)
        mine, _, d, _ = _train(rank, STEPS, **how)
        d.close()
        out[name] = (_flat(mine) - theirs).abs().max().item()
    pybridge.finalize()
    return out


def test_same_weights_as_torchft_diloco():
    pytest.importorskip("torchft.local_sgd", reason="torchft is not installed (pip install torchft: a test-only "
                                                    "comparison, not a dependency)")
    res = run_ranks(torchft_rank, 2, timeout=180)
    for out in res:
        print("max |pybridge - torchft| per weight:", out)
        assert out["plain"] <= 1e-6 and out["stream"] <= 1e-6, out
