"""The DDP wrapper on real ranks, against independent references: single-process training
on the same global batch, and torch's own DistributedDataParallel run in the same ranks."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pybridge
from pybridge.ddp.wrapper import DistributedDataParallel as PDDP
from pybridge.errors import InvalidArgument, InvalidState, NotSupported
from pybridge.ddp.reducer import MiB
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
        # By index and rank too, with torch's phrase; a RuntimeError, as torch's error is.
        assert f"did not receive grad for rank {rank}: 6 7;" in str(e), e
        assert "Expected to have finished reduction in the prior iteration" in str(e), e
        assert isinstance(e, RuntimeError)
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


class NoGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3), requires_grad=False)


def refused(fn, kind, *words):
    try:
        fn()
    except kind as e:
        assert isinstance(e, pybridge.PyBridgeError), type(e)
        assert all(w in str(e) for w in words), e
        return e
    raise AssertionError(f"expected {kind.__name__}")


def check_torch_keywords(rank, world):
    """torch's constructor keywords: accepted with torch's meaning or refused, never a TypeError."""
    import torch.distributed as dist
    m = mlp(1, sizes=(4, 4))
    refused(lambda: PDDP(NoGrad()), InvalidState, "doesn't have any parameter that requires a gradient")
    assert issubclass(InvalidState, RuntimeError)  # what torch raises there
    refused(lambda: PDDP(m, device_ids=[0]), InvalidArgument, "device_ids", "CPU")
    refused(lambda: PDDP(m, output_device=1), InvalidArgument, "output_device")
    refused(lambda: PDDP(m, device_ids=[0, 1]), InvalidArgument, "single element")
    refused(lambda: PDDP(m, mixed_precision=object()), NotSupported, "mixed_precision")
    refused(lambda: PDDP(m, delay_all_reduce_named_params=[], param_to_hook_all_reduce=m[0].weight),
            NotSupported, "delay_all_reduce_named_params")
    refused(lambda: PDDP(m, delay_all_reduce_named_params=[]), InvalidArgument, "at the same time")
    refused(lambda: PDDP(m, bucket_cap_mb_list=[1, 2]), NotSupported, "bucket_cap_mb_list")
    refused(lambda: PDDP(m, group=pybridge.current(), process_group=dist.group.WORLD), InvalidArgument,
            "group=", "process_group=")
    with pytest.warns(FutureWarning, match="check_reduction"):
        PDDP(m, check_reduction=True).close()
    # torch's positional order, torch's default group, a torch subgroup (adopted), a pybridge Group.
    w = PDDP(m, None, None, 0, True, True, dist.group.WORLD)
    assert w._pb_group is pybridge.current() and w.device_ids is None and w.output_device is None
    w.close()
    sub = dist.new_group(list(range(world)))
    w = PDDP(m, process_group=sub, skip_all_reduce_unused_params=True, batched_grad_copy=True)
    assert w._pb_group.pg is sub and w._pb_group.size == world
    w(torch.ones(2, 4)).sum().backward()
    assert PDDP(m, process_group=sub)._pb_group is w._pb_group  # one wrapper per torch group
    w.close()
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    w = PDDP(m, device_mesh=mesh)
    assert w._pb_group.pg is mesh.get_group(0) and w._pb_group.size == world
    w.close()
    refused(lambda: PDDP(m, device_mesh=mesh, process_group=sub), InvalidArgument, "device_mesh=")

    # Buffers, torch 2.13's rule: broadcast_buffers=False skips the construction-time sync too;
    # forward_sync_buffers=False syncs them at construction only.
    for kw, at_init in (({"broadcast_buffers": False}, False), ({"forward_sync_buffers": False}, True)):
        model = Mixed()
        model.bn.running_mean.fill_(rank + 1.0)
        w = PDDP(model, **kw)
        assert model.bn.running_mean.eq(1.0 if at_init else rank + 1.0).all(), kw
        w.eval()  # running statistics unchanged by forward
        model.bn.running_mean.fill_(rank + 1.0)
        w(torch.randn(4, 12))
        assert model.bn.running_mean.eq(rank + 1.0).all(), kw  # not synced before forward
        w.close()


def check_torch_surface(rank, world):
    """gradient_as_bucket_view=False, static_graph, state_dict, pickling and create_graph
    against torch's DDP in the same ranks."""
    import io
    from torch.nn.parallel import DistributedDataParallel as TDDP
    x, y = batch(4 * world, 8, 4, seed=21)
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    torch.manual_seed(3)
    model = Branchy()
    for kw in ({"gradient_as_bucket_view": False, "find_unused_parameters": True}, {"static_graph": True}):
        theirs, ours = copy.deepcopy(model), copy.deepcopy(model)
        tddp, pddp = TDDP(theirs, **kw), PDDP(ours, **kw)
        for step in range(3):
            for m, wrapped in ((theirs, tddp), (ours, pddp)):
                m.zero_grad(set_to_none=step == 1)
                F.mse_loss(wrapped(xs, use_extra=True), ys).backward()
            for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
                close(q.grad, p.grad, 1e-6, f"{kw} step {step} {name}")
        if "gradient_as_bucket_view" in kw:  # .grad is the program's own tensor, not bucket memory
            flats = [(b.flat.data_ptr(), b.flat.data_ptr() + b.flat.nbytes) for b in pddp.reducer.buckets]
            assert not any(lo <= p.grad.data_ptr() < hi for p in ours.parameters() if p.grad is not None
                           for lo, hi in flats)
            refused(pddp._set_static_graph, InvalidState, "should be called before training loop starts")
            assert "should be called before" in pddp._get_ddp_logging_data()["error"]
        else:
            with pytest.warns(UserWarning, match="no need to set it again"):
                pddp._set_static_graph()
        pddp.close()

    # state_dict keys as torch's, loadable both ways.
    theirs, ours = copy.deepcopy(model), copy.deepcopy(model)
    tddp, pddp = TDDP(theirs, find_unused_parameters=True), PDDP(ours, find_unused_parameters=True)
    assert list(tddp.state_dict()) == list(pddp.state_dict()) and all(k.startswith("module.") for k in
                                                                        pddp.state_dict())
    with torch.no_grad():
        ours.head.weight.add_(1.0)
    tddp.load_state_dict(pddp.state_dict())
    assert torch.equal(theirs.head.weight, ours.head.weight)
    with torch.no_grad():
        theirs.trunk.bias.add_(1.0)
    pddp.load_state_dict(tddp.state_dict())
    assert torch.equal(theirs.trunk.bias, ours.trunk.bias)

    # torch.save / torch.load of the wrapper: the loaded one trains on, equal to torch's.
    F.mse_loss(pddp(xs, use_extra=True), ys).backward()
    buf = io.BytesIO()
    torch.save(pddp, buf)
    pddp.close()
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    theirs.load_state_dict(loaded.module.state_dict())
    for m, wrapped in ((theirs, tddp), (loaded.module, loaded)):
        m.zero_grad()
        F.mse_loss(wrapped(xs, use_extra=True), ys).backward()
    for (name, p), q in zip(theirs.named_parameters(), loaded.module.parameters()):
        close(q.grad, p.grad, 1e-6, f"after torch.load {name}")
    loaded.close()
    sub = pybridge.new_group(list(range(world)))
    on_sub = PDDP(copy.deepcopy(model), group=sub)
    refused(lambda: torch.save(on_sub, io.BytesIO()), InvalidState, "default process group")
    on_sub.close()
    sub.close()

    # backward(create_graph=True), against one process on the whole batch (torch's DDP fails
    # here on this model: "a leaf Variable that requires grad is being used in an in-place
    # operation"), and double backward (a gradient penalty), against torch's DDP.
    ref, ours = mlp(5, sizes=(8, 16, 4)), mlp(5, sizes=(8, 16, 4))
    F.mse_loss(ref(x), y).backward()
    pddp = PDDP(ours)
    F.mse_loss(pddp(xs), ys).backward(create_graph=True)
    for (name, p), q in zip(ref.named_parameters(), ours.parameters()):
        close(q.grad.detach(), p.grad, 1e-6, f"create_graph {name}")
    pddp.close()
    theirs, ours = mlp(5, sizes=(8, 16, 4)), mlp(5, sizes=(8, 16, 4))
    tddp, pddp = TDDP(theirs), PDDP(ours)
    for m, wrapped in ((theirs, tddp), (ours, pddp)):
        loss = F.mse_loss(wrapped(xs), ys)
        gs = torch.autograd.grad(loss, list(m.parameters()), create_graph=True)
        (loss + sum(g.pow(2).sum() for g in gs)).backward()
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
        close(q.grad, p.grad, 1e-6, f"double backward {name}")
    pddp.close()

    # torch's logging data keys (torch's own test reads them too: tests/test_torch_ddp.py).
    w = PDDP(mlp(2, sizes=(4, 4)))
    for _ in range(2):
        w(torch.ones(2, 4)).sum().backward()
    data = w._get_ddp_logging_data()
    assert data["world_size"] == world and data["rank"] == rank and data["iteration"] == 1
    assert data["module_name"] == "Sequential" and data["dtypes"] == "float" and data["has_rebuilt_buckets"] == 1
    assert data["avg_backward_compute_time"] >= 1 and data["num_parameter_tensors"] == 2
    w.close()


def check_a_dropped_wrapper_is_freed(rank, world):
    # The program keeps its model and drops the wrapper: the model's gradient hooks must not
    # keep the wrapper (its reducer, buckets and group) alive, as torch's hooks do not.
    import gc
    import weakref
    model = torch.nn.Linear(4, 2)
    ddp = pybridge.DistributedDataParallel(model)
    ddp(torch.ones(3, 4)).sum().backward()
    gone = weakref.ref(ddp)
    del ddp
    gc.collect()
    assert gone() is None, gc.get_referrers(gone())
    model(torch.ones(1, 4)).sum().backward()  # its hooks are inert now: no collective, no error


def ddp_suite(rank, world):
    pybridge.init(timeout=30)
    torch.set_num_threads(1)
    worst = check_training_matches_single_process(rank, world)
    check_grads_match_torch_ddp(rank, world)
    check_no_sync_equals_big_batch(rank, world)
    check_unused_parameters(rank, world)
    check_init_sync_buffers_and_compression(rank, world)
    check_a_dropped_wrapper_is_freed(rank, world)
    if world == 2:  # the torch surface once, beside torch DDP
        check_torch_keywords(rank, world)
        check_torch_surface(rank, world)
    pybridge.barrier()
    pybridge.finalize()
    return worst


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ddp_on_real_ranks(world):
    worst = run_ranks(ddp_suite, world, timeout=80)
    assert max(worst) <= 1e-5
