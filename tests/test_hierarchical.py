"""The hierarchical allreduce hook: on 4 loopback ranks pretending to be 2 nodes of 2, it
gives the plain allreduce's sum (up to float reassociation), only node leaders put bytes
into the cross-node collective, it trains like torch DDP on pybridge's wrapper and on
torch's own DDP, and ranks that choose another node size are refused on every rank."""

import torch
import torch.nn.functional as F

from ranks import run_ranks

SPECS = [(300, "float32"), (77, "float32"), (1000, "float32")]
STEPS = 4


def _grads(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(n, generator=g) for n, _ in SPECS]


def _reduce(hook, rank, steps=2):
    """Gradients after `steps` iterations of a reducer with `hook` (each its own input)."""
    from pybridge import Reducer
    red = Reducer(SPECS, hook=hook, bucket_cap_mb=2e-3, first_bucket_cap_mb=2e-3)
    out = []
    for step in range(steps):
        for i, g in enumerate(_grads(rank, step)):
            red.set_grad(i, g)
        red.wait()
        out.append([v.clone() for v in red.grads()])
    state = red._hook.state
    sent = dict(state.sent) if hasattr(state, "sent") else None
    red.close()
    return out, sent


def _model(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 3))


def _train(net, rank):
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(7)
    for _ in range(STEPS):
        x, y = torch.randn(32, 12, generator=g), torch.randn(32, 3, generator=g)
        opt.zero_grad()
        F.mse_loss(net(x[rank * 8:rank * 8 + 8]), y[rank * 8:rank * 8 + 8]).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def _gap(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def hierarchical_ranks(rank, world):
    import pybridge
    from pybridge.algorithms import comm_hooks, hierarchical
    from pybridge.errors import InvalidArgument
    pybridge.init(backend="gloo", timeout=30)
    out = {}
    plain, _ = _reduce(None, rank)
    hier, sent = _reduce(comm_hooks.HierarchicalHook(2), rank)
    half, _ = _reduce(comm_hooks.BuiltinHook(comm_hooks.HOOK_HIERARCHICAL, ranks_per_node=2, compression="fp16"),
                      rank)
    out["hier"] = max(_gap(a, b) for a, b in zip(plain, hier))
    out["fp16"] = max(_gap(a, b) for a, b in zip(plain, half))
    out["changed"] = _gap(plain[0], _grads(rank, 0))  # the reduction did something
    out["sent"] = sent
    # Payload each rank put into plain allreduce's one world collective, for comparison.
    out["bucket_bytes"] = sum(n for n, _ in SPECS) * 4 * 2  # 2 iterations

    # pybridge's wrapper with the hook against torch DDP; torch's DDP with the hook too.
    ref = _train(torch.nn.parallel.DistributedDataParallel(_model()), rank)
    ours = pybridge.DistributedDataParallel(_model())
    ours.register_comm_hook(*comm_hooks.HierarchicalHook(2).build(pybridge.current()))
    out["ddp"] = _gap(_train(ours, rank), ref)
    ours.close()
    theirs = torch.nn.parallel.DistributedDataParallel(_model())
    state = hierarchical.HierarchicalState(ranks_per_node=2)
    theirs.register_comm_hook(state, hierarchical.hierarchical_hook)
    out["torch ddp"] = _gap(_train(theirs, rank), ref)
    state.close()

    # Another node size on ranks 2 and 3: every rank is refused, naming the hook.
    try:
        _reduce(comm_hooks.HierarchicalHook(2 if rank < 2 else 4), rank, steps=1)
        out["mismatch"] = None
    except InvalidArgument as exc:
        out["mismatch"] = str(exc)
    pybridge.finalize()
    return out


def test_hierarchical_hook_on_two_pretend_nodes():
    res = run_ranks(hierarchical_ranks, 4, timeout=120)
    for rank, r in enumerate(res):
        # The same sum as one allreduce, added in another order: float32 reassociation of
        # 4 values of about 1 (measured at most 2.4e-7).
        assert r["hier"] < 1e-5, r
        assert r["changed"] > 0.1, r
        # fp16 on the wire: within half precision of the float32 result (measured 1.0e-3).
        assert 1e-5 < r["fp16"] < 1e-2, r
        # Only the leaders (ranks 0 and 2) cross nodes: one bucket per node, not one per rank.
        leader = rank % 2 == 0
        assert r["sent"]["cross"] == (r["bucket_bytes"] if leader else 0), (rank, r["sent"])
        assert r["ddp"] < 1e-5 and r["torch ddp"] < 1e-5, r
        assert r["mismatch"] is not None and "ranks_per_node 2" in r["mismatch"] \
            and "ranks_per_node 4" in r["mismatch"], r["mismatch"]
    node_cross = [res[0]["sent"]["cross"] + res[1]["sent"]["cross"], res[2]["sent"]["cross"] + res[3]["sent"]["cross"]]
    plain_cross = 2 * res[0]["bucket_bytes"]  # both ranks of a node in the world's allreduce
    assert node_cross == [plain_cross // 2] * 2  # the drop is the ranks per node (2)


def test_settings_and_identity(monkeypatch):
    import pytest

    from pybridge.algorithms import comm_hooks, hierarchical
    from pybridge.errors import InvalidArgument
    spec = comm_hooks.HierarchicalHook(4, compression="bf16")
    assert spec.identity() == comm_hooks.identity(*comm_hooks.builtin(comm_hooks.HOOK_HIERARCHICAL, None,
                                                                      ranks_per_node=4, compression="bf16"))
    assert "ranks_per_node 4" in spec.identity() and "bfloat16" in spec.identity()
    assert spec.identity() != comm_hooks.HierarchicalHook(4).identity()
    assert comm_hooks.prescales(hierarchical.hierarchical_hook) and comm_hooks.is_eager(hierarchical.hierarchical_hook)
    for bad in (dict(ranks_per_node=-1), dict(compression="int8"), dict(ranks_per_node="2")):
        with pytest.raises(InvalidArgument):
            comm_hooks.HierarchicalHook(**bad)
    with pytest.raises(InvalidArgument, match="does not divide"):
        hierarchical.node_size(3, 4)
    # 0: the launcher's LOCAL_WORLD_SIZE, else the whole group as one node.
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert hierarchical.node_size(0, 4) == 4 and hierarchical.node_size(0) is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert hierarchical.node_size(0, 4) == 2 and hierarchical.node_size(0) == 2
    assert comm_hooks.HierarchicalHook().identity() == comm_hooks.HierarchicalHook(2).identity()
