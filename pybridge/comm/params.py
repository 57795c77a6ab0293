"""broadcast_parameters: copy tensors from one rank to every rank, coalesced per dtype.

What a DDP wrapper or a reducer's user calls before training (and a joined rank's last
step, with Join's root); it needs only collectives, so it sits in the communication core
and neither the reducer nor the C and Go layers hold a copy.
"""

from typing import Iterable, Optional, Sequence

import torch

from ..base import agree
from . import collectives
from . import group as _group
from . import world as _world
from ..base.checks import positive_finite
from ..errors import InvalidArgument

MiB = 1024 * 1024


def broadcast_parameters(tensors: Iterable[torch.Tensor], root: int = 0, *, group: Optional[_group.Group] = None,
                         chunk_mb: float = 64.0) -> None:
    """Copy `tensors` (parameters, buffers, or any writable tensors) from rank `root` to every
    rank, coalesced into a few broadcasts per dtype. Synchronous: nothing is kept afterwards,
    so it is safe on caller-owned memory. A collective: every rank passes the same dtypes
    and counts in the same order (checked).

    Example::

        >>> import torch, pybridge
        >>> model = torch.nn.Linear(4, 2)
        >>> pybridge.broadcast_parameters(model.parameters())   # every replica starts equal
    """
    ts = list(tensors)  # iterated twice below: a generator (model.parameters()) would be empty the second time
    g = group or _world.current()
    g.check_open()
    g.check_rank("root", root)
    cap = max(1, int(min(positive_finite("chunk_mb", chunk_mb, " of MiB"), 1 << 30) * MiB))
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in ts:
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(f"broadcast_parameters expects tensors, got {type(t).__name__}")
        if t.numel():
            groups.setdefault((t.dtype, t.device), []).append(t)
    if g.size == 1:
        return
    _check_same_tensors(ts, root, g)
    for (dt, _), same in groups.items():
        chunk: list[torch.Tensor] = []
        nbytes = 0
        for t in same:
            chunk.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= cap:
                _broadcast_chunk(chunk, root, g)
                chunk, nbytes = [], 0
        if chunk:
            _broadcast_chunk(chunk, root, g)


def _check_same_tensors(tensors: Sequence[torch.Tensor], root: int, g: _group.Group) -> None:
    """One small allgather of (root, number of tensors, hash of their dtypes and counts):
    ranks passing other tensors would otherwise get garbage, or abort inside gloo."""
    items = [(str(t.dtype), t.numel()) for t in tensors]
    collectives.agree([root, len(items), agree.signature(items)], "broadcast_parameters: ranks pass different "
                      "tensors", group=g, describe=lambda r: f"pass {r[1]} tensors (root {r[0]})",
                      fields=("root", "number of tensors", "dtypes and counts"),
                      hint=". Every rank must pass the same dtypes and counts in the same order and the same root")


def _broadcast_chunk(ts: Sequence[torch.Tensor], root: int, g: _group.Group) -> None:
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1) for t in ts])
        # gloo has no bool type; its bytes travel as uint8.
        wire = flat.view(torch.uint8) if flat.dtype == torch.bool else flat
        collectives.broadcast(wire, root, group=g)
        offset = 0
        for t in ts:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view(t.shape))
            offset += n


__all__ = ["broadcast_parameters"]
