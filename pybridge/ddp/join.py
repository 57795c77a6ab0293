"""Uneven inputs: ranks that run out of batches early keep the others going (torch's Join).

A rank with no more batches "joins": until every rank has joined, it shadows each iteration
of the ranks still training with the collectives they issue, contributing zeros to the
gradient buckets, so nobody waits for a partner that will never come. Which iteration to
shadow and whether anyone is still training is one small allreduce per iteration: each rank
still training adds 1, a joined rank 0; when it sums to 0 every rank has joined.

The divisor of the averaged gradients follows torch: the world size
(`divide_by_initial_world_size=True`, every sample weighs the same) or the number of ranks
still training (False). When everyone has joined, the model of the last rank to join (the
largest such rank) is everyone's: the caller broadcasts from the rank `join` returns
(the DDP wrapper's join hook does it itself, as torch's does).

Two front ends share this: the DDP wrapper under torch's `Join` context (torch's context
runs the per-iteration count; `DDPJoinHook` below is the wrapper's join hook), and a
reducer created with `join=True` (C `PB_REDUCER_JOIN`, Go `WithJoin`), whose iterations
start with the count and whose `Reducer.join()` is `join_reducer` below.
"""

from collections import namedtuple

import torch
from torch.distributed.algorithms.join import JoinHook

from ..comm import collectives
from ..comm.collectives import MAX, SUM


def count_active(group, active, async_op=False):
    """How many ranks are still training: one allreduce (sum) of 1 per such rank. Every
    rank of the group calls it once per iteration, joined ranks with active=False.
    async_op: return the collective's Work instead (None on one rank), for a rank that
    only takes part and waits for it later."""
    t = torch.tensor([1.0 if active else 0.0], device=group.device)
    if group.size > 1:
        work = collectives.all_reduce(t, SUM, group=group, async_op=async_op)
        if async_op:
            return work
    return None if async_op else int(t.item())


def common_rank(group, candidate):
    """The largest rank whose `candidate` is true (torch DDP's _find_common_rank): the
    model everyone takes after a join, or the buffers' source while some ranks are joined."""
    t = torch.tensor([group.rank if candidate else -1], dtype=torch.int64, device=group.device)
    if group.size > 1:
        collectives.all_reduce(t, MAX, group=group)
    return int(t.item())


def iteration_flags(group, sync, buffers):
    """What this iteration of the ranks still training holds, for the joined ones: (gradients
    are reduced, buffers are broadcast, from which rank). One allreduce (max) of
    [sync, buffers, rank]; a joined rank passes False, False and gets the others' answer.
    (torch sends the gradient flag and the buffers' rank in two allreduces; one is enough.)"""
    active = sync or buffers
    t = torch.tensor([int(sync), int(buffers), group.rank if active else -1], dtype=torch.int64,
                     device=group.device)
    if group.size > 1:
        collectives.all_reduce(t, MAX, group=group)
    s, b, root = t.tolist()
    return bool(s), bool(b), max(root, 0)


JoinResult = namedtuple("JoinResult", "root shadowed")
JoinResult.__doc__ = """What join() tells a rank: `root`, the rank whose parameters every rank should take
(the largest of those that joined last), and `shadowed`, the iterations this rank shadowed."""


def join_reducer(reducer):
    """Shadow the iterations of the ranks still training until every rank has joined
    (a JoinResult). For a reducer created with join=True, between iterations."""
    group = reducer.group
    shadowed = 0
    while count_active(group, False):
        reducer.shadow()
        shadowed += 1
    return JoinResult(common_rank(group, shadowed == 0), shadowed)


def work_count(work):
    """The sum an asynchronous count allreduce (torch's Join.notify_join_context) produced."""
    value = work.get_future().wait()
    return int((value[0] if isinstance(value, (list, tuple)) else value).item())


class DDPJoinHook(JoinHook):
    """pybridge.DistributedDataParallel's join hook (torch's _DDPJoinHook's contract): while
    some rank trains, a joined rank shadows the wrapper's forward (buffer broadcast) and
    backward (bucket allreduces through the reducer's hook, the unused-parameter map);
    once all have joined, every rank takes the last joiner's parameters and buffers."""

    def __init__(self, ddp, divide_by_initial_world_size=True):
        self.ddp = ddp
        ddp._join_divide_by_initial = bool(divide_by_initial_world_size)
        super().__init__()

    def main_hook(self):
        ddp = self.ddp
        group = ddp._pb_group
        sync, buffers, root = iteration_flags(group, False, False)
        if buffers:
            ddp._join_broadcast(ddp._sync_buffers_list(), root)
        if not sync:
            return
        ddp.reducer.shadow()
        if ddp._join_exchanges_used():
            # The wrapper's used-parameter map. torch's joined rank sends its last reduced map
            # (kept, and reduced again in place), so a parameter used anywhere in its last
            # iteration counts as used (a zero gradient, not None) until all have joined.
            used = ddp._join_used
            if used is None:
                used = ddp._join_used = torch.zeros(len(ddp._params), dtype=torch.uint8, device=group.device)
            collectives.all_reduce(used, MAX, group=group)

    def post_hook(self, is_last_joiner):
        ddp = self.ddp
        root = common_rank(ddp._pb_group, is_last_joiner)
        states = [p for n, p in ddp.module.named_parameters() if n not in ddp.parameters_to_ignore]
        if ddp.forward_sync_buffers:
            states += ddp._sync_buffers_list()
        ddp._join_broadcast(states, root)


__all__ = ["JoinResult", "count_active", "common_rank", "iteration_flags", "join_reducer", "DDPJoinHook"]
