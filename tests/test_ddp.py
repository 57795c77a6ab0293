"""The DDP wrapper on real ranks, against independent references: single-process training
on the same global batch, and torch's own DistributedDataParallel run in the same ranks."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pybridge
from pybridge.ddp import DistributedDataParallel as PDDP
from pybridge.errors import InvalidArgument
from pybridge.reducer import MiB
from ranks import run_ranks

H = 8


class Backwards(nn.Module):
    """Layers defined a, b, c, d but run d, c, b, a: gradients become ready a, b, c, d,
    the reverse of what the initial (reverse definition order) buckets expect."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(H, H) for _ in range(4))

    def forward(self, x):
        return self.a(torch.tanh(self.b(torch.tanh(self.c(torch.tanh(self.d(x)))))))


class Mixed(nn.Module):
    """float32, float16 and bfloat16 parameters, and a BatchNorm buffer."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(12, 16)
        self.bn = nn.BatchNorm1d(16)
        self.l2 = nn.Linear(16, 16).half()
        self.l3 = nn.Linear(16, 4).bfloat16()

    def forward(self, x):
        h = torch.tanh(self.bn(self.l1(x)))
        h = torch.tanh(self.l2(h.half()))
        return self.l3(h.bfloat16()).float()


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)
        self.extra = nn.Linear(8, 4)   # used on rank 0 only
        self.never = nn.Linear(8, 4)   # used nowhere

    def forward(self, x, use_extra):
        h = torch.tanh(self.trunk(x))
        out = self.head(h)
        return out + self.extra(h) if use_extra else out


def mlp(seed, sizes=(12, 32, 32, 32, 4)):
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers += [nn.Linear(a, b)] + ([nn.Tanh()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def batch(n, d_in, d_out, seed=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randn(n, d_out, generator=g)


def shard(t, rank, world):
    n = len(t) // world
    return t[rank * n:(rank + 1) * n]


def close(got, want, atol, what):
    assert (got is None) == (want is None), f"{what}: one gradient is None"
    if got is not None:
        np.testing.assert_allclose(got.double().numpy(), want.double().numpy(), rtol=0, atol=atol,
                                   err_msg=what)


def layer_order(ddp):
    """Layer names in bucket order (first appearance)."""
    seen = []
    for bucket in ddp.reducer.bucket_indices:
        for i in bucket:
            layer = ddp.reducer.names[i].split(".")[0]
            if layer not in seen:
                seen.append(layer)
    return seen


def check_training_matches_single_process(rank, world):
    x, y = batch(12, H, H)
    torch.manual_seed(0)
    ref = Backwards()
    torch.manual_seed(rank)  # ranks start different: the wrapper must broadcast rank 0's
    model = Backwards()
    ddp = PDDP(model, bucket_cap_mb=280 / MiB, first_bucket_cap_mb=280 / MiB)
    assert layer_order(ddp) == ["d", "c", "b", "a"]
    for p, q in zip(ref.parameters(), model.parameters()):
        assert torch.equal(p, q)  # rank 0's initial weights, now on every rank
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    for step in range(20):
        opt_ref.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt_ref.step()
        opt.zero_grad(set_to_none=step % 2 == 0)  # both the None and the zeroed-view path
        F.mse_loss(ddp(xs), ys).backward()        # no extra call: reduced when backward ends
        if step == 0:
            # Rebuilt from the order gradients became ready: execution order.
            assert layer_order(ddp) == ["a", "b", "c", "d"]
            assert ddp.reducer.generation == 1
        for p in model.parameters():  # .grad lives in a bucket: no copy
            assert any(b.flat.data_ptr() <= p.grad.data_ptr() < b.flat.data_ptr() + b.flat.numel() * 4
                       for b in ddp.reducer.buckets)
        opt.step()
    assert ddp.reducer.iterations == 20
    worst = max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    assert worst <= 1e-5, worst
    ddp.close()
    return worst


def check_grads_match_torch_ddp(rank, world):
    from torch.nn.parallel import DistributedDataParallel as TDDP
    x, y = batch(6 * world, 12, 4, seed=11)
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    for model, tol in ((mlp(3), {torch.float32: 1e-6}),
                       (Mixed(), {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2})):
        theirs, ours = copy.deepcopy(model), copy.deepcopy(model)
        tddp, pddp = TDDP(theirs), PDDP(ours)
        for step in range(2):  # the second step runs on rebuilt buckets
            for m, wrapped in ((theirs, tddp), (ours, pddp)):
                m.zero_grad()
                F.mse_loss(wrapped(xs), ys).backward()
            for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
                close(q.grad, p.grad, tol[p.dtype] * max(1.0, p.grad.abs().max().item()),
                      f"{type(model).__name__}.{name} step {step}")
            for b1, b2 in zip(theirs.buffers(), ours.buffers()):
                assert torch.equal(b1, b2)
        pddp.close()


def check_no_sync_equals_big_batch(rank, world):
    k, micro = 3, 2
    x, y = batch(k * micro * world, 12, 4, seed=5)
    model = mlp(4)
    ref = copy.deepcopy(model)
    ref.zero_grad()
    F.mse_loss(ref(x), y).backward()
    ddp = PDDP(model, bucket_cap_mb=2048 / MiB, first_bucket_cap_mb=1024 / MiB)
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    for round_ in range(2):
        model.zero_grad(set_to_none=round_ == 0)
        before = ddp.reducer.iterations
        for m in range(k):
            xm, ym = xs[m * micro:(m + 1) * micro], ys[m * micro:(m + 1) * micro]
            if m < k - 1:
                with ddp.no_sync():
                    (F.mse_loss(ddp(xm), ym) / k).backward()
                assert ddp.reducer.iterations == before  # nothing was reduced
            else:
                (F.mse_loss(ddp(xm), ym) / k).backward()
        assert ddp.reducer.iterations == before + 1
        for (name, p), q in zip(ref.named_parameters(), model.parameters()):
            close(q.grad, p.grad, 1e-6, f"no_sync round {round_} {name}")
    ddp.close()


def check_unused_parameters(rank, world):
    from torch.nn.parallel import DistributedDataParallel as TDDP
    x, y = batch(4 * world, 8, 4, seed=9)
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    torch.manual_seed(2)
    model = Branchy()
    theirs, ours = copy.deepcopy(model), copy.deepcopy(model)
    tddp = TDDP(theirs, find_unused_parameters=True)
    pddp = PDDP(ours, find_unused_parameters=True, bucket_cap_mb=200 / MiB, first_bucket_cap_mb=100 / MiB)
    for step in range(3):
        for m, wrapped in ((theirs, tddp), (ours, pddp)):
            m.zero_grad()
            F.mse_loss(wrapped(xs, use_extra=rank == 0), ys).backward()
        for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
            close(q.grad, p.grad, 1e-6, f"unused step {step} {name}")
        assert ours.never.weight.grad is None and ours.extra.weight.grad is not None
        if world > 1:  # extra only ran on rank 0: its gradient is rank 0's divided by world
            assert ours.extra.weight.grad.abs().max() > 0
    pddp.close()

    # Without find_unused_parameters, the end of backward names what never got a gradient.
    strict = PDDP(copy.deepcopy(model))
    try:
        F.mse_loss(strict(xs, use_extra=True), ys).backward()
    except InvalidArgument as e:
        assert "never.weight" in str(e) and "never.bias" in str(e) and "head" not in str(e), e
        assert "find_unused_parameters" in str(e)
    else:
        raise AssertionError("missing gradients were not reported")
    strict.close()


def check_init_sync_buffers_and_compression(rank, world):
    torch.manual_seed(100 + rank)
    model = Mixed()
    ddp = PDDP(model)
    torch.manual_seed(100)
    ref = Mixed()  # what rank 0 started with
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    # Buffers are broadcast from rank 0 before a forward that will be reduced.
    ddp.eval()
    model.bn.running_mean.fill_(rank + 1.0)
    ddp(torch.randn(4, 12))
    assert model.bn.running_mean.eq(1.0).all()
    with torch.no_grad():  # no backward will follow: no broadcast
        model.bn.running_mean.fill_(rank + 1.0)
        ddp(torch.randn(4, 12))
    assert model.bn.running_mean.eq(rank + 1.0).all()
    ddp.close()
    loose = PDDP(model, broadcast_buffers=False)
    loose.eval()
    model.bn.running_mean.fill_(rank + 1.0)  # construction synced it; diverge again
    loose(torch.randn(4, 12))
    assert model.bn.running_mean.eq(rank + 1.0).all()
    loose.close()

    # fp16/bf16 compression of float32 buckets: close to the uncompressed reduction.
    x, y = batch(8 * world, 12, 4, seed=13)
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    grads = {}
    for comp in (None, "fp16", "bf16"):
        m = mlp(6, sizes=(12, 64, 64, 4))
        w = PDDP(m, compression=comp)
        F.mse_loss(w(xs), ys).backward()
        grads[comp] = [p.grad.clone() for p in m.parameters()]
        w.close()
    for comp, tol in (("fp16", 2e-3), ("bf16", 2e-2)):  # relative to each gradient's max
        for g, exact in zip(grads[comp], grads[None]):
            scale = exact.abs().max().item()
            assert (g - exact).abs().max().item() <= tol * scale, comp


def ddp_suite(rank, world):
    pybridge.init(timeout=30)
    torch.set_num_threads(1)
    worst = check_training_matches_single_process(rank, world)
    check_grads_match_torch_ddp(rank, world)
    check_no_sync_equals_big_batch(rank, world)
    check_unused_parameters(rank, world)
    check_init_sync_buffers_and_compression(rank, world)
    pybridge.barrier()
    pybridge.finalize()
    return worst


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ddp_on_real_ranks(world):
    worst = run_ranks(ddp_suite, world, timeout=80)
    assert max(worst) <= 1e-5
