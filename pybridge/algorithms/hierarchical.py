"""Hierarchical allreduce: a comm hook whose bucket crosses node links once per node.

Per bucket (torch's DDP comm-hook contract, so it runs on pybridge's reducer from Python,
C and Go, and on torch's DistributedDataParallel):
  1. sum within the node (allreduce over the node's group),
  2. the node leaders (local rank 0) allreduce the node sums among themselves,
  3. each leader broadcasts the result within its node.
The result is the sum over the whole group, as a plain allreduce gives it, up to the order
in which floats are added. Only the leaders take part in a collective that spans nodes,
so the payload a node puts on its link is one bucket instead of one per rank.

The three steps are a pipeline: each runs on a thread of its own (HookThread) over a group
of its own, in bucket order, so a bucket crosses nodes while the next one is summed in the
node and the previous one broadcast, and backward goes on meanwhile (the hook is eager).
One group per step, not one per node: collectives on one group issued from two threads
could go out in another order on each rank.
The hook sums (comm_hooks.prescales): the reducer folds 1/size for 'avg' into the
gradient copy, or leaves the factor in bucket.scale, applied here.
"""

from typing import Any, Optional, Union, cast

import torch
from torch._C._distributed_c10d import GradBucket as TorchGradBucket  # torch.distributed.GradBucket

from ..comm import collectives, subgroups
from ..comm import group as _group
from ..comm import world as _world
from ..base import jobenv
from ..base.checks import integer
from ..errors import InvalidArgument
from .contract import GradBucket, declare_eager, declare_sums
from .hook_thread import HookThread

# compression= of the hook: float32 buckets travel (all three steps) in this type.
_TORCH = object()  # bucket.scale of torch's GradBucket, which has none

WIRE: dict[Optional[str], Optional[torch.dtype]] = {None: None, "none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def wire_dtype(compression: Optional[str]) -> Optional[torch.dtype]:
    """The wire type for `compression` (None, 'fp16' or 'bf16'); None keeps the bucket's."""
    key = compression.lower() if isinstance(compression, str) else compression
    if key not in WIRE:
        raise InvalidArgument(f"hierarchical compression {compression!r} is unknown; use None, 'fp16' or 'bf16'")
    return WIRE[key]


def node_size(ranks_per_node: int, group_size: Optional[int] = None) -> Optional[int]:
    """Ranks per node: `ranks_per_node` if > 0, else the launcher's LOCAL_WORLD_SIZE or the
    scheduler's ranks on this node (srun, mpirun: jobenv.ranks_per_node), else
    (launched by hand) the whole group as one node. None when that needs group_size and
    it is unknown (a state that is only described)."""
    per: Optional[int] = integer("hierarchical ranks_per_node", ranks_per_node, low=0,
                  expected="an integer >= 0 (0: the launcher's LOCAL_WORLD_SIZE)")
    if per == 0:
        per = jobenv.ranks_per_node() or group_size
    if per is not None and group_size is not None and group_size % per:
        raise InvalidArgument(f"hierarchical ranks_per_node {per} does not divide the group size {group_size} "
                              "(nodes must have equal numbers of ranks)")
    return per


class HierarchicalState:
    """State of the hierarchical hook: the node and leader groups, the hook's thread, and
    what went where (`sent`: bytes this rank put into collectives within its node and
    across nodes, for benchmarks and tests).

    group: the ranks that train together (default: the world). ranks_per_node: nodes are
    consecutive blocks of this many ranks (0: LOCAL_WORLD_SIZE, as pybridge-launch and
    torchrun set it). compression: None, 'fp16' or 'bf16' (float32 buckets travel as that
    type through all three steps). Creating it is a collective over `group` (it creates
    the groups).

    Example::

        >>> import torch, pybridge
        >>> from pybridge.algorithms.hierarchical import HierarchicalState, hierarchical_hook
        >>> ddp_model = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))
        >>> state = HierarchicalState(ranks_per_node=1, compression="fp16")   # a collective
        >>> ddp_model.register_comm_hook(state, hierarchical_hook)
        >>> ddp_model(torch.ones(3, 4)).sum().backward()   # summed in the node, across nodes, broadcast
    """

    group: Optional[_group.Group]  # None for a state that is only described
    ranks_per_node: Optional[int]

    def __init__(self, group: Optional[_group.Group] = None, *, ranks_per_node: int = 0,
                 compression: Optional[str] = None) -> None:
        g: _group.Group = group or _world.current()
        self.group = g
        self.ranks_per_node = node_size(ranks_per_node, g.size)
        self.wire = wire_dtype(compression)
        per = self.ranks_per_node
        assert per is not None  # (known with the group's size)
        # Splits rather than node_groups(): only local rank 0's cross-node group is used, so
        # the other local ranks get none (each group is a backend with its connections).
        # The node has two groups, one for the sum and one for the broadcast (one per thread).
        intra = subgroups.split(g.rank // per, group=g)
        self.leader = g.rank % per == 0
        self.leaders = subgroups.split(0 if self.leader else None, group=g)  # None but on the leaders
        intra_out = subgroups.split(g.rank // per, group=g)
        assert intra is not None and intra_out is not None  # (colors >= 0)
        self.intra, self.intra_out = intra, intra_out
        self.num_nodes = g.size // per
        self.sent = {"intra": 0, "cross": 0}
        self._scratch: dict[int, torch.Tensor] = {}
        self._stages = [HookThread(f"pybridge-hierarchical-{n}") for n in ("node-sum", "leaders", "broadcast")]

    @classmethod
    def described(cls, *, ranks_per_node: int = 0, compression: Optional[str] = None) -> "HierarchicalState":
        """A state that is only described (its settings, for comm_hooks.identity): no group,
        no thread; it cannot run."""
        self = cls.__new__(cls)
        self.group = None
        self.ranks_per_node = node_size(ranks_per_node)
        self.wire = wire_dtype(compression)
        return self

    def settings(self) -> dict[str, Any]:
        """What every rank must share (comm_hooks.identity)."""
        per = self.ranks_per_node
        per_node: Union[int, str] = "LOCAL_WORLD_SIZE or the group size" if per is None else per
        return {"ranks_per_node": per_node,
                "wire": "as the bucket" if self.wire is None else str(self.wire).replace("torch.", "")}

    def close(self) -> None:
        """Stop the hook's thread and free the groups."""
        if self.group is None:
            return
        for t in self._stages:
            t.close()
        for g in (self.intra, self.leaders, self.intra_out):
            if g is not None and not g.closed:
                g.close()

    def _node_sum(self, index: int, buf: torch.Tensor) -> torch.Tensor:
        """Step 1 (its thread): the wire buffer (buf itself, or a half copy), summed in the node."""
        wire = buf
        if self.wire is not None and buf.dtype == torch.float32:
            kept = self._scratch.get(index)
            if kept is None or kept.numel() != buf.numel() or kept.device != buf.device:
                kept = self._scratch[index] = torch.empty(buf.numel(), dtype=self.wire, device=buf.device)
            wire = kept
            wire.copy_(buf)
        if self.intra.size > 1:
            collectives.all_reduce(wire, collectives.SUM, group=self.intra)
            self.sent["intra"] += wire.numel() * wire.element_size()
        return wire

    def _cross(self, wire: torch.Tensor) -> torch.Tensor:
        """Step 2 (its thread): the leaders' allreduce of the node sums."""
        if self.leader and self.leaders is not None and self.leaders.size > 1:
            collectives.all_reduce(wire, collectives.SUM, group=self.leaders)
            self.sent["cross"] += wire.numel() * wire.element_size()
        return wire

    def _broadcast(self, wire: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        """Step 3 (its thread): the leader's result to its node, back into the bucket."""
        if self.intra_out.size > 1:
            collectives.broadcast(wire, 0, group=self.intra_out)
            self.sent["intra"] += wire.numel() * wire.element_size() if self.leader else 0
        if wire is not buf:
            buf.copy_(wire)
        return buf

    def hook(self, bucket: Union[GradBucket, TorchGradBucket]) -> "torch.futures.Future[torch.Tensor]":
        """The hierarchical hook for one bucket (torch's contract, with this state bound)."""
        if self.group is None:
            raise InvalidArgument("this HierarchicalState is only described (HierarchicalState.described); "
                                  "build one over a group to run it")
        buf = bucket.buffer()
        scale = getattr(bucket, "scale", _TORCH)
        if scale is _TORCH:  # torch's DDP: its hooks average
            buf.div_(self.group.size)
        elif scale is not None:  # pybridge's reducer: the 1/size of 'avg' it left to the hook
            buf.mul_(cast(float, scale))
        index = bucket.index()
        summed, crossed, done = self._stages
        # Each stage waits for this bucket's previous one; its thread takes buckets in order.
        node = summed.submit(lambda: self._node_sum(index, buf))
        cross = crossed.submit(lambda: self._cross(node.wait()))
        return done.submit(lambda: self._broadcast(cross.wait(), buf))


@declare_sums
@declare_eager  # its collectives run on the state's threads, in the order it is called
def hierarchical_hook(state: HierarchicalState, bucket: TorchGradBucket) -> torch.futures.Future[torch.Tensor]:
    # (torch's DDP checks these annotations: see gossip_hook)
    """The hierarchical allreduce hook: pass a HierarchicalState as `state`. On pybridge's
    reducer it sums (the reducer divides for 'avg'); on torch's DDP, whose hooks average,
    it averages.

    Example::

        >>> import torch, pybridge
        >>> from pybridge.algorithms.hierarchical import HierarchicalState, hierarchical_hook
        >>> ddp_model = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))
        >>> ddp_model.register_comm_hook(HierarchicalState(ranks_per_node=2), hierarchical_hook)
        >>> ddp_model(torch.ones(3, 4)).sum().backward()
    """
    if not isinstance(state, HierarchicalState):
        raise InvalidArgument(f"hierarchical_hook needs a HierarchicalState as its state, got {type(state).__name__}")
    return state.hook(bucket)


__all__ = ["HierarchicalState", "hierarchical_hook", "node_size", "wire_dtype"]
