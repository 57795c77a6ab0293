"""Subgroups that need a collective to be made: split (MPI_Comm_split) and node_groups.

Above the collectives (this module imports group and collectives; group.py imports
neither), so group.py stays below collectives.py. `Group.split` is defined here, on the
class group.py defines: the package's __init__ imports this module, so any import of the
communication core has it. pybridge.split and pybridge.node_groups are the public names
(new_group needs no collective: it is group.new_group).
"""

from typing import Optional

import torch

from . import collectives
from ..base import jobenv
from ..base.checks import integer, positive_seconds
from ..errors import InvalidArgument
from .group import Group
from .world import current, pick_backend


def split(color: Optional[int], key: Optional[int] = None, *, group: Optional[Group] = None,
          timeout: Optional[float] = None, backend: Optional[str] = None) -> Optional[Group]:
    """MPI_Comm_split over `group` (default: the world): every member calls it (a collective
    over the group); members that pass the same color form one subgroup, ranked by (key,
    rank in the group). A negative or None color joins no group and gets None. key
    defaults to the rank in the group. timeout (seconds) bounds the subgroup's operations;
    default: the group's. backend: the subgroup's ("gloo" or "nccl"); default: the group's.
    A gloo subgroup of an NCCL group carries CPU tensors beside it (small control
    messages, for example).

    Example::

        >>> import pybridge
        >>> evens = pybridge.split(pybridge.rank() % 2)   # ranks 0, 2, ... and 1, 3, ...
        >>> evens.size == (pybridge.size() + 1 - pybridge.rank() % 2) // 2
        True
    """
    g = group or current()
    g.check_open()
    timeout = g.timeout if timeout is None else positive_seconds("timeout", timeout)
    backend = g.backend if backend is None else pick_backend(backend)
    color = -1 if color is None else integer("color", color)
    key = g.rank if key is None else integer("key", key)
    mine = torch.tensor([color, key], dtype=torch.int64, device=g.device)
    every = torch.zeros(2 * g.size, dtype=torch.int64, device=g.device)
    collectives.all_gather(mine, every, group=g)
    pairs = every.view(g.size, 2).tolist()
    members: Optional[list[int]] = None if color < 0 else [r for _, r in sorted((k, r) for r, (c, k) in enumerate(pairs) if c == color)]
    sub: Optional[Group] = g.subgroup(members, timeout=timeout, backend=backend)
    return sub


def node_groups(ranks_per_node: Optional[int] = None, *,
                group: Optional[Group] = None) -> tuple[Optional[Group], Optional[Group]]:
    """(intra-node group, cross-node group) for this rank: the members on this node, and the
    members with this rank's local rank on every node. Nodes are consecutive blocks of
    `ranks_per_node` ranks of `group` (default: LOCAL_WORLD_SIZE, as torchrun and
    pybridge-launch set it, else srun's or mpirun's ranks on this node (jobenv.ranks_per_node);
    pass it to pretend, e.g. nodes of 2 ranks on one machine).
    A collective over `group`: every member calls it."""
    g = group or current()
    if ranks_per_node is None:
        ranks_per_node = jobenv.ranks_per_node() or g.size
    per = integer("ranks_per_node", ranks_per_node)
    if per < 1 or g.size % per:
        raise InvalidArgument(f"ranks_per_node {per} does not divide the group size {g.size} "
                              "(nodes must have equal numbers of ranks)")
    intra = split(g.rank // per, g.rank, group=g)
    cross = split(g.rank % per, g.rank, group=g)
    return intra, cross


def _group_split(self: Group, color: Optional[int], key: Optional[int] = None, *, timeout: Optional[float] = None,
                 backend: Optional[str] = None) -> Optional[Group]:
    """MPI_Comm_split over this group: pybridge.split(color, key, group=self, ...), a
    collective over its members (the rules: pybridge.comm.subgroups.split)."""
    return split(color, key, group=self, timeout=timeout, backend=backend)


_group_split.__name__ = _group_split.__qualname__ = "split"
_group_split.__qualname__ = "Group.split"
Group.split = _group_split  # type: ignore[attr-defined]  # (the seam the module's docstring names)

__all__ = ["split", "node_groups"]
