"""A rank lost in the middle of a DiLoCo period: the period's sync uses the survivors (their
pseudo-gradients of that period) and no rank applies a partial average; the survivors'
weights equal diloco_reference's run in which that replica stops at the same step.

3 ranks of an elastic job (pybridge.runtime.elastic over a store this test hosts); rank 2
leaves with os._exit after an inner step in the middle of a period. The survivors see the
failure in the sync's collective (MembershipChanged), move onto the new world
(elastic.reset) and DiLoCo.rebind re-runs the sync there. Once for DiLoCo (float32), once
for Streaming DiLoCo (2 fragments, tau 1, int8 with error feedback), whose sync is on its
thread when the rank goes.
"""

import datetime
import os
import sys

import pytest
import torch
import torch.distributed as dist

import diloco_reference as ref
from pybridge.algorithms.quantize import Codec
from ranks import free_port, run_ranks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elastic membership reads /proc")

STEPS, LOST, LOST_AFTER = 20, 2, 7   # rank 2 leaves after inner step 7
PLAIN = dict(sync_every=5)           # syncs after steps 5 (3 ranks), 10, 15, 20 (2 ranks)
STREAM = dict(sync_every=6, fragments=((0, 1), (2, 3)), delay=1, alpha=0.5, codec=Codec("int8", 16),
              error_feedback=True)  # a sync taken after step 8 is under way when rank 2's loss is seen


def elastic_rank(rank, world, port, how):
    import pybridge
    from pybridge.algorithms.diloco import DiLoCo
    from pybridge.errors import MembershipChanged
    from pybridge.runtime import elastic
    g = elastic.init(store_addr=f"127.0.0.1:{port}", timeout=20, lost_after=5)
    net = ref.model()
    opt = ref.inner_optimizer(net)
    how = ref.diloco_kwargs(how)
    d = DiLoCo(list(net.parameters()), group=g, **how)
    changes = []
    for t in range(1, STEPS + 1):
        ref.inner_step(net, opt, rank, t)
        if rank == LOST and t == LOST_AFTER:
            os._exit(3)  # gone, mid-period
        try:
            d.step()
        except MembershipChanged as err:
            changes.append({"step": t, "lost": err.lost, "size": err.new_size})
            g = elastic.reset(err)
            d.rebind(g)
    d.close()
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    out = {"params": flat.tolist(), "changes": changes, "syncs": d.syncs, "size": g.size}
    elastic.session().membership.finish()
    pybridge.finalize()
    return out


def state_rank(rank, world, port, how):
    """The same through elastic.State (DiLoCo in its reducer slot, a commit after each sync)
    and elastic.run: after the loss every survivor rolls back to the commit of step 5 and
    redoes steps 6-10 in the new world."""
    import pybridge
    from pybridge.algorithms.diloco import DiLoCo
    from pybridge.runtime import elastic
    g = elastic.init(store_addr=f"127.0.0.1:{port}", timeout=20, lost_after=5)
    net = ref.model()
    opt = ref.inner_optimizer(net)
    d = DiLoCo(list(net.parameters()), group=g, **how)
    state = elastic.State(model=net, optimizer=opt, reducer=d, step=0)
    resets = []
    state.on_reset(lambda: resets.append(state.step))

    @elastic.run
    def train(state):
        while state.step < STEPS:
            t = state.step + 1
            ref.inner_step(net, opt, rank, t)
            if rank == LOST and t == LOST_AFTER:
                os._exit(3)
            state.step = t
            if d.step():
                state.commit()

    train(state)
    d.close()
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    out = {"params": flat.tolist(), "resets": resets, "syncs": d.syncs, "size": pybridge.size()}
    pybridge.finalize()
    return out


def _three_ranks(fn, how):
    """fn on 3 ranks of an elastic job whose store this process hosts (as the launcher
    would); rank LOST leaves mid-period."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)
    try:
        return run_ranks(fn, 3, port, how, timeout=120, expect_fail={LOST})
    finally:
        del store


def test_a_rank_lost_mid_period_with_elastic_state():
    res = _three_ranks(state_rank, PLAIN)
    want = ref.run(3, STEPS, lost=(LOST, 5), **PLAIN)  # rolled back: rank 2's steps 6 and 7 never count
    for r in (0, 1):
        assert res[r]["resets"] == [5] and res[r]["size"] == 2 and res[r]["syncs"] == STEPS // 5
        assert (torch.tensor(res[r]["params"]) - want[r]).abs().max().item() <= 1e-6


@pytest.mark.parametrize("how", [PLAIN, STREAM], ids=["diloco", "streaming-int8"])
def test_a_rank_lost_mid_period(how):
    res = _three_ranks(elastic_rank, how)
    assert res[LOST] is None
    want = ref.run(3, STEPS, lost=(LOST, LOST_AFTER), **how)
    every = ref.run(3, STEPS, **how)  # had nobody been lost
    interval = how["sync_every"] // len(how.get("fragments", [0]))
    for r in (0, 1):
        out = res[r]
        # seen at the first sync after the loss (DiLoCo: its collectives; streaming: the wait for it)
        seen = next(t for t in range(LOST_AFTER + 1, STEPS + 1) if t % interval == 0)
        assert out["changes"] == [{"step": seen, "lost": [LOST], "size": 2}], out["changes"]
        assert out["size"] == 2 and out["syncs"] == STEPS // interval
        got = torch.tensor(out["params"])
        assert (got - want[r]).abs().max().item() <= 1e-6
        assert (got - every[r]).abs().max().item() > 1e-3  # the lost replica's absence shows
