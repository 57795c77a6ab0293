"""The average of a flat float32 tensor over a group, sent quantized (INTELLECT-1's all-reduce).

An all_gather of every rank's quantized tensor would send (p-1) x n elements a rank, more
than a ring all-reduce of float32 at 8 ranks once scales count. Here each element is
summed by one rank, as in a reduce-scatter:

1. each rank splits its tensor into p chunks (chunk r: elements [r*C, (r+1)*C), C a whole
   number of quantization blocks) and quantizes each;
2. an all_to_all sends chunk r to rank r;
3. rank r decodes the p versions of its chunk, sums them in float32 in rank order and
   divides by p;
4. rank r quantizes that mean again, and an all_gather hands every rank every chunk's
   quantized mean, which every rank decodes the same way: all ranks end with the same
   values, bit for bit.

Each rank sends (p-1) chunk payloads in step 2 and forwards (p-1) in step 4 (a ring
all_gather): 2 (p-1) x nbytes(C) bytes, about 2 (p-1)/p x n x (bytes an element + scales),
what a ring all-reduce of the quantized type would send. float32 ("fp32") takes the same
path and is exact but for the order of the sum.

Error: each rank's contribution is quantized once (bounded as quantize.py says) and the
mean once more; the result is within bound(x_r) averaged over ranks plus bound(mean) of
the float32 mean. Error feedback applies to the first quantization (each rank's own):
what it lost is handed back (`Averaged.residual`) for the caller to keep once it uses the
result.
"""

from typing import NamedTuple, Optional

import torch

from ..comm import collectives
from ..comm import world as _world
from .quantize import Codec


class Averaged(NamedTuple):
    value: torch.Tensor                # the group's mean, n float32 elements (the same on every rank)
    sent_bytes: int                    # what this rank sent: 2 (p-1) chunk payloads
    residual: Optional[torch.Tensor]   # x_in - what this rank's quantized contribution decodes to


def chunk_elements(n, size, codec):
    """Elements per chunk: n / size rounded up to whole quantization blocks."""
    per = -(-n // size)
    if codec.scaled:
        per = -(-per // codec.block) * codec.block
    return per


def sent_bytes(n, size, codec):
    """The bytes one rank sends to average n elements over `size` ranks."""
    if size <= 1 or n == 0:
        return 0
    return 2 * (size - 1) * codec.nbytes(chunk_elements(n, size, codec))


def average(x, codec, *, group=None, feedback=None):
    """The mean over `group` (default: the world) of flat float32 tensor `x`, sent as
    `codec` says. A collective (an all_to_all and an all_gather): every member calls it with
    the same n and codec, in the same order as its other collectives on the group.
    feedback: an ErrorFeedback whose residual is added to x first; it is not changed (the
    residual to keep comes back in the result)."""
    g = group or _world.current()
    if not isinstance(codec, Codec):
        raise TypeError("codec must be a quantize.Codec")
    x = x.detach().reshape(-1).to(torch.float32)
    x_in = feedback.add(x) if feedback is not None else x
    n, p = x_in.numel(), g.size
    if p == 1 or n == 0:  # nothing to send: the mean is the value itself
        zero = torch.zeros_like(x_in) if feedback is not None else None
        return Averaged(x_in.clone(), 0, zero)
    c = chunk_elements(n, p, codec)
    s = codec.nbytes(c)
    padded = x_in.new_zeros(p * c)
    padded[:n] = x_in
    send = torch.empty(p * s, dtype=torch.uint8, device=x_in.device)
    for r in range(p):
        codec.encode(padded[r * c:(r + 1) * c], out=send[r * s:(r + 1) * s])
    residual = None
    if feedback is not None:
        mine = torch.empty(p * c, dtype=torch.float32, device=x_in.device)
        for r in range(p):
            codec.decode(send[r * s:(r + 1) * s], c, out=mine[r * c:(r + 1) * c])
        residual = x_in - mine[:n]
    recv = torch.empty_like(send)
    collectives.all_to_all(send, recv, group=g)
    total = torch.zeros(c, dtype=torch.float32, device=x_in.device)
    part = torch.empty_like(total)
    for r in range(p):  # in rank order: the same sum on every run
        total += codec.decode(recv[r * s:(r + 1) * s], c, out=part)
    total /= p
    gathered = torch.empty(p * s, dtype=torch.uint8, device=x_in.device)
    collectives.all_gather(codec.encode(total), gathered, group=g)
    value = torch.empty(p * c, dtype=torch.float32, device=x_in.device)
    for r in range(p):
        codec.decode(gathered[r * s:(r + 1) * s], c, out=value[r * c:(r + 1) * c])
    return Averaged(value[:n], 2 * (p - 1) * s, residual)


__all__ = ["Averaged", "average", "chunk_elements", "sent_bytes"]
