"""GossipGraD: gradient averaging with one partner per step instead of an all-ranks allreduce.

A communication hook (torch's DDP comm-hook contract), so it runs on pybridge's reducer
(Python wrapper, C, Go) and on torch's own DistributedDataParallel. Per bucket:
  1. average within the node (ranks_per_node > 1),
  2. the node's master exchanges the bucket with its gossip peer over the cross-node
     group (receive posted, send, wait both) and keeps (bucket + received) / 2,
  3. the master broadcasts the result within the node.
Peers come from pybridge.algorithms.gossip_schedule: cube or dissemination over a virtual topology
redrawn every period from (seed, period index). The step advances once per backward pass
(after the iteration's last bucket), so every bucket of a step uses the same peers.

Communication per step is one bucket-sized message per node instead of an allreduce's
2(p-1)/p; gradients still reach every node within ceil(log2 N) steps. Replicas are no
longer exactly equal (gradients, not parameters, are gossiped): `sync_every=K` averages
the parameters over the whole group every K steps, and average_parameters() does it on
demand (before evaluation or a checkpoint).

The hook works on a background thread, in bucket order, so communication overlaps the
rest of backward; the future it returns completes when the bucket is mixed.
"""

from typing import Any, Iterable, Optional, Union

import torch
from torch._C._distributed_c10d import GradBucket as TorchGradBucket  # torch.distributed.GradBucket

from ..comm import collectives, subgroups
from .contract import GradBucket, declare_eager
from ..comm import group as _group
from ..comm import world as _world
from ..base import jobenv
from ..base.checks import integer
from ..errors import InvalidArgument
from .gossip_schedule import check_topology, peers
from .hook_thread import HookThread


def ranks_per_node_or_launchers(ranks_per_node: Optional[int]) -> int:
    """ranks_per_node checked; None or 0 is the launcher's (LOCAL_WORLD_SIZE, which
    pybridge-launch and torchrun set) or the scheduler's (srun, mpirun: jobenv.ranks_per_node),
    or 1 when nothing says: the ranks of one
    machine then average among themselves and gossip across machines."""
    if ranks_per_node is None or (type(ranks_per_node) is int and ranks_per_node == 0):
        ranks_per_node = jobenv.ranks_per_node() or 1
    return integer("gossip ranks_per_node", ranks_per_node, low=1)


class GossipState:
    """State of the gossip hook for one model.

    group: the ranks that train together (default: the world). ranks_per_node: nodes are
    consecutive blocks of this many ranks (1: every rank is a node; None or 0: the
    launcher's ranks per node, LOCAL_WORLD_SIZE, or 1 without a launcher). topology: 'cube' or
    'dissemination'. seed: the virtual topology's private generator. rotate: redraw the
    topology every period (False keeps the identity, for tests and analysis). sync_every:
    average parameters over the group every K steps (0: never).

    Creating it is a collective over `group` (it creates the node and cross-node groups).

    Example::

        >>> import torch, pybridge
        >>> from pybridge.algorithms.gossip import GossipState, gossip_hook
        >>> ddp_model = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))
        >>> state = GossipState(ranks_per_node=1, sync_every=8)   # a collective: every rank makes one
        >>> ddp_model.register_comm_hook(state, gossip_hook)      # the wrapper closes it
        >>> ddp_model(torch.ones(3, 4)).sum().backward()          # each bucket mixed with one peer
    """

    def __init__(self, group: Optional[_group.Group] = None, *, topology: str = "cube",
                 ranks_per_node: Optional[int] = None, seed: int = 0, rotate: bool = True,
                 sync_every: int = 0) -> None:
        self.group: _group.Group = group or _world.current()
        g = self.group
        self.topology = check_topology(topology)
        ranks_per_node = ranks_per_node_or_launchers(ranks_per_node)
        seed = integer("gossip seed", seed, low=0)
        sync_every = integer("gossip sync_every", sync_every, low=0)
        if g.size % ranks_per_node:
            raise InvalidArgument(f"gossip ranks_per_node {ranks_per_node} does not divide the group size "
                                  f"{g.size} (ranks_per_node 0 takes the launcher's LOCAL_WORLD_SIZE)")
        self.seed, self.rotate, self.sync_every = seed, bool(rotate), sync_every
        self.num_nodes = g.size // ranks_per_node
        self.node = g.rank // ranks_per_node
        # Separate groups even for one rank per node: the exchanges run on the hook's thread
        # and must not share a process group with the caller's own collectives.
        intra, cross = subgroups.node_groups(ranks_per_node, group=g)
        everyone = subgroups.split(0, group=g)  # for sync_every's exact steps
        assert intra is not None and cross is not None and everyone is not None  # (colors >= 0)
        self.intra, self.cross, self.everyone = intra, cross, everyone
        self.master = self.intra.rank == 0
        self.step = 0
        self._params: list[torch.Tensor] = []   # parameters seen this step (for sync_every)
        self._scratch: dict[int, torch.Tensor] = {}
        self._worker = HookThread("pybridge-gossip")

    STEP_ATTR = "step"  # the counter a checkpoint keeps (contract.hook_step)

    def settings(self) -> dict[str, Any]:
        """What every rank must share (contract.identity)."""
        return {"topology": self.topology, "ranks_per_node": self.group.size // self.num_nodes,
                "seed": self.seed, "rotate": self.rotate, "sync_every": self.sync_every}

    def peers(self, step: Optional[int] = None) -> tuple[Optional[int], Optional[int]]:
        """(send to, receive from) node numbers at `step` (default: the current step)."""
        return peers(self.topology, self.num_nodes, self.seed, self.step if step is None else step,
                     self.node, self.rotate)

    def close(self) -> None:
        """Stop the hook's thread and free the node groups."""
        self._worker.close()
        for g in (self.intra, self.cross, self.everyone):
            if not g.closed:
                g.close()

    # ---- the work, on the hook's thread ---------------------------------------------------

    def _mix(self, index: int, buf: torch.Tensor, send_to: Optional[int], recv_from: Optional[int]) -> torch.Tensor:
        if self.intra.size > 1:
            collectives.all_reduce(buf, collectives.AVG, group=self.intra)
        if self.master and send_to is not None:
            got = self._scratch.get(index)
            if got is None or got.shape != buf.shape or got.dtype != buf.dtype:
                got = self._scratch[index] = torch.empty_like(buf)
            assert recv_from is not None  # (peers come in pairs)
            recv = collectives.irecv(got, recv_from, tag=index, group=self.cross)
            send = collectives.isend(buf, send_to, tag=index, group=self.cross)
            recv.wait()
            send.wait()  # before buf changes: it is what was sent
            buf.add_(got).mul_(0.5)
        if self.intra.size > 1:
            collectives.broadcast(buf, 0, group=self.intra)
        return buf

    def _sync(self, buf: torch.Tensor, params: Optional[list[torch.Tensor]]) -> torch.Tensor:
        collectives.all_reduce(buf, collectives.AVG, group=self.everyone)  # exact, this step
        if params:
            average_parameters(params, group=self.everyone)
        return buf

    # ---- the hook, on the caller's thread -------------------------------------------------

    def hook(self, bucket: Union[GradBucket, TorchGradBucket]) -> "torch.futures.Future[torch.Tensor]":
        """The GossipGraD communication hook for one bucket (torch's contract, with this
        state bound): queue its exchange on the state's thread and return its future."""
        buf = bucket.buffer()
        send_to, recv_from = self.peers()
        # A sync step averages every bucket exactly (not only the last one: a gossiped bucket
        # would leave its parameters different after the optimizer step) and, with the last
        # bucket, the parameters seen this step.
        sync = bool(self.sync_every) and (self.step + 1) % self.sync_every == 0
        if sync:
            try:
                self._params.extend(bucket.parameters())
            except InvalidArgument:
                pass  # specs only (C, Go): the caller averages its own parameters
        index = bucket.index()
        if sync:
            params: Optional[list[torch.Tensor]] = None
            if bucket.is_last():
                params, self._params = self._params, []

            def work() -> torch.Tensor:
                return self._sync(buf, params)
        else:
            def work() -> torch.Tensor:
                return self._mix(index, buf, send_to, recv_from)
        if bucket.is_last():
            self.step += 1
        return self._worker.submit(work)


# torch's DDP checks these annotations (bucket: torch.distributed.GradBucket, a Future[Tensor]) when
# the hook is registered there; pybridge's reducer hands it its own GradBucket, which has the same methods.
def gossip_hook(state: GossipState, bucket: TorchGradBucket) -> torch.futures.Future[torch.Tensor]:
    """The GossipGraD communication hook: pass a GossipState as `state` (GossipState.hook).

    Example::

        >>> import torch, pybridge
        >>> from pybridge.algorithms.gossip import GossipState, gossip_hook
        >>> ddp_model = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))
        >>> ddp_model.register_comm_hook(GossipState(topology="dissemination"), gossip_hook)
        >>> ddp_model(torch.ones(3, 4)).sum().backward()
    """
    if not isinstance(state, GossipState):
        raise InvalidArgument(f"gossip_hook needs a GossipState as its state, got {type(state).__name__}")
    return state.hook(bucket)


# Its collectives run on the state's own thread in the order the hook is called (bucket
# order), so the next bucket need not wait for this one's future.
declare_eager(gossip_hook)


def average_parameters(params: Union[torch.nn.Module, Iterable[torch.Tensor]], *,
                       group: Optional[_group.Group] = None) -> None:
    """Average tensors (a module's parameters, or any list) over `group`, in place: replicas
    trained with gossip drift apart; call this before evaluating or saving."""
    g = group or _world.current()
    tensors = list(params.parameters()) if isinstance(params, torch.nn.Module) else list(params)
    with torch.no_grad():
        for dtype in sorted({p.dtype for p in tensors}, key=str):
            same = [p for p in tensors if p.dtype == dtype]
            flat = torch.cat([p.detach().reshape(-1) for p in same])
            collectives.all_reduce(flat, collectives.AVG if dtype.is_floating_point else collectives.SUM,
                                   group=g)
            offset = 0
            for p in same:
                n = p.numel()
                p.copy_(flat[offset:offset + n].view_as(p))
                offset += n


__all__ = ["GossipState", "gossip_hook", "average_parameters"]
