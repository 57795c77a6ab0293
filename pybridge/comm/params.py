"""broadcast_parameters: copy tensors from one rank to every rank, coalesced per dtype.

What a DDP wrapper or a reducer's user calls before training (and a joined rank's last
step, with Join's root); it needs only collectives, so it sits in the communication core
and neither the reducer nor the C and Go layers hold a copy.
"""

import torch

from ..base import agree
from . import collectives
from . import world as _world
from ..base.checks import positive_finite
from ..errors import InvalidArgument

MiB = 1024 * 1024


def broadcast_parameters(tensors, root=0, *, group=None, chunk_mb=64.0):
    """Copy `tensors` (parameters, buffers, or any writable tensors) from rank `root` to every
    rank, coalesced into a few broadcasts per dtype. Synchronous: nothing is kept afterwards,
    so it is safe on caller-owned memory."""
    g = group or _world.current()
    g.check_open()
    g.check_rank("root", root)
    cap = max(1, int(min(positive_finite("chunk_mb", chunk_mb, " of MiB"), 1 << 30) * MiB))
    groups = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(f"broadcast_parameters expects tensors, got {type(t).__name__}")
        if t.numel():
            groups.setdefault((t.dtype, t.device), []).append(t)
    if g.size == 1:
        return
    _check_same_tensors(tensors, root, g)
    for (dt, _), ts in groups.items():
        chunk, nbytes = [], 0
        for t in ts:
            chunk.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= cap:
                _broadcast_chunk(chunk, root, g)
                chunk, nbytes = [], 0
        if chunk:
            _broadcast_chunk(chunk, root, g)


def _check_same_tensors(tensors, root, g):
    """One small allgather of (root, number of tensors, hash of their dtypes and counts):
    ranks passing other tensors would otherwise get garbage, or abort inside gloo."""
    items = [(str(t.dtype), t.numel()) for t in tensors]
    collectives.agree([root, len(items), agree.signature(items)], "broadcast_parameters: ranks pass different "
                      "tensors", group=g, describe=lambda r: f"pass {r[1]} tensors (root {r[0]})",
                      fields=("root", "number of tensors", "dtypes and counts"),
                      hint=". Every rank must pass the same dtypes and counts in the same order and the same root")


def _broadcast_chunk(ts, root, g):
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
