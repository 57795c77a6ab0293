"""Periodic model averaging: pybridge's averagers give torch's averagers' parameters on the
same data (periodic and hierarchical, 4 ranks), and post-local SGD (torch's
post_localSGD_hook on pybridge's DDP wrapper, then the averager) ends where torch DDP with
the same hook and torch's averager ends."""

import pytest
import torch
import torch.nn.functional as F

from ranks import run_ranks

STEPS = 6


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _batches(rank):
    g = torch.Generator().manual_seed(50 + rank)  # each rank its own data: replicas drift
    return [(torch.randn(8, 10, generator=g), torch.randn(8, 2, generator=g)) for _ in range(STEPS)]


def _run(net, averager, rank):
    """Train `net` locally, averaging after each optimizer step; the parameters after each step."""
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.5)
    after = []
    for x, y in _batches(rank):
        opt.zero_grad()
        F.mse_loss(net(x), y).backward()
        opt.step()
        averager.average_parameters(net.parameters())
        after.append(torch.cat([p.detach().reshape(-1) for p in net.parameters()]).clone())
    return after


def _spread(flat):
    """How far this rank's parameters are from the group's mean (0: all replicas equal)."""
    import pybridge
    mean = flat.clone()
    pybridge.all_reduce(mean, pybridge.AVG)
    return (flat - mean).abs().max().item()


def averagers_vs_torch(rank, world):
    from torch.distributed.algorithms.model_averaging import averagers
    from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import HierarchicalModelAverager

    import pybridge
    from pybridge.algorithms import local_sgd
    out = {}
    ours = _run(_model(), local_sgd.PeriodicModelAverager(period=3, warmup_steps=2), rank)
    theirs = _run(_model(), averagers.PeriodicModelAverager(period=3, warmup_steps=2), rank)
    out["periodic"] = max((a - b).abs().max().item() for a, b in zip(ours, theirs))
    # Averaged at steps 2 and 5 (counting from 0): replicas equal there, apart in between.
    out["spread"] = [_spread(p) for p in ours]

    levels = {2: 2, 4: 4}  # every 2nd step within pairs of ranks, every 4th over all four
    ours_h = local_sgd.HierarchicalModelAverager(levels, warmup_steps=1)
    theirs_h = HierarchicalModelAverager(levels, warmup_steps=1)
    a, b = _run(_model(), ours_h, rank), _run(_model(), theirs_h, rank)
    out["hierarchical"] = max((x - y).abs().max().item() for x, y in zip(a, b))
    pair = a[2].clone()  # step 2: averaged within pairs of ranks only
    every = torch.zeros(world * pair.numel())
    pybridge.all_gather(pair, every)
    rows = every.view(world, -1)
    out["pairs"] = ((rows[0] - rows[1]).abs().max().item(), (rows[0] - rows[2]).abs().max().item())
    ours_h.close()
    return out


def local_sgd_ranks(rank, world):
    """Both comparisons in one job: starting 4 ranks costs more than either."""
    import pybridge
    pybridge.init(backend="gloo", timeout=30)
    out = {**averagers_vs_torch(rank, world), **post_local_sgd(rank, world)}
    pybridge.finalize()
    return out


def test_local_sgd_matches_torch():
    res = run_ranks(local_sgd_ranks, 4, timeout=150)
    for r in res:
        # The same arithmetic (divide, then sum) on the same values: measured 0.0.
        assert r["periodic"] < 1e-6 and r["hierarchical"] < 1e-6, r
        spread = r["spread"]
        assert all(spread[s] < 1e-6 for s in (2, 5)), spread
        assert all(spread[s] > 1e-4 for s in (0, 1, 3, 4)), spread
        within, across = r["pairs"]
        assert within < 1e-6 < across, r["pairs"]
        # Post-local SGD on pybridge's wrapper against torch DDP, same hook, same averaging.
        assert r["subgroup"] < 1e-6 and r["local"] < 1e-6, r  # measured 6e-8
        assert r["vs plain ddp"] > 1e-4, r  # local steps really happened
        assert r["local iter"] == 3 and "start_localSGD_iter 3" in r["local identity"], r


def _ddp_steps(ddp, averager, rank):
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
    for x, y in _batches(rank):
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
        averager.average_parameters(ddp.parameters())
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])


def post_local_sgd(rank, world):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
    from torch.distributed.algorithms.model_averaging import averagers

    import pybridge
    from pybridge.algorithms import comm_hooks, local_sgd
    warmup = 3
    # torch's default after the warm-up: gradients still averaged within a subgroup (here
    # pairs of ranks, a pretend node); and without any gradient allreduce after it.
    sub, _ = dist.new_subgroups(group_size=2)
    out = {}
    for name, kw in (("subgroup", {"subgroup": sub}), ("local", {"post_local_gradient_allreduce": False})):
        state = PostLocalSGDState(process_group=None, start_localSGD_iter=warmup, **{"subgroup": None, **kw})
        ours = pybridge.DistributedDataParallel(_model())
        ours.register_comm_hook(state, post_localSGD_hook)
        a = _ddp_steps(ours, local_sgd.PeriodicModelAverager(period=4, warmup_steps=warmup), rank)
        out[name + " iter"] = state.iter
        out[name + " identity"] = comm_hooks.identity(state, post_localSGD_hook)
        ours.close()
        state = PostLocalSGDState(process_group=None, start_localSGD_iter=warmup, **{"subgroup": None, **kw})
        theirs = torch.nn.parallel.DistributedDataParallel(_model())
        theirs.register_comm_hook(state, post_localSGD_hook)
        b = _ddp_steps(theirs, averagers.PeriodicModelAverager(period=4, warmup_steps=warmup), rank)
        out[name] = (a - b).abs().max().item()
    plain = _ddp_steps(torch.nn.parallel.DistributedDataParallel(_model()),
                       averagers.PeriodicModelAverager(period=10**6, warmup_steps=10**6), rank)
    out["vs plain ddp"] = (a - plain).abs().max().item()
    return out


def test_averager_arguments():
    from pybridge.algorithms import local_sgd
    from pybridge.errors import InvalidArgument
    for bad, what in (((0,), "period"), ((2, -1), "warmup_steps"), ((2, 0, "world"), "process_group")):
        with pytest.raises(InvalidArgument, match=what):
            local_sgd.PeriodicModelAverager(*bad)
    with pytest.raises(InvalidArgument, match="params"):
        local_sgd.params_to_average([1])
    p = torch.nn.Parameter(torch.ones(2))
    assert local_sgd.params_to_average([p]) == []  # no gradient: not averaged (torch's rule)
    p.grad = torch.zeros(2)
    t = torch.ones(3)
    assert len(local_sgd.params_to_average([{"params": [p]}, t])) == 2
    with pytest.raises(InvalidArgument, match="floating"):
        local_sgd.params_to_average([torch.ones(2, dtype=torch.int32)])
