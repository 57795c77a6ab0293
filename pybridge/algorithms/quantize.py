"""Quantizers for outer gradients (DiLoCo's pseudo-gradients): fp32, bf16, fp8, int8, int4.

A `Codec` turns a flat float32 tensor of n elements into a uint8 payload of `nbytes(n)`
bytes and back. The payload's size depends only on n, so ranks can exchange payloads in
fixed-size slots (quantized_average.py). Tensors of any shape go through `quantize` /
`dequantize` (flattened, shape kept); n may be anything, 0 and 1 included.

Formats and their error bounds (per element, x the input, q(x) the decoded value; a block
is `block` consecutive elements of the flat tensor, the last one possibly shorter, and
s = (the block's largest |x|) / qmax is its scale):

  fp32  exact.                                           4 bytes an element
  bf16  |x - q(x)| <= 2^-8 |x|  (round to nearest even;  2 bytes an element
        |x| >= 2^-126, below it <= 2^-134)
  fp8   e4m3 (qmax 448) per block:                       1 byte + 4/block
        |x - q(x)| <= max(2^-4 |x|, 2^-10 s)
  int8  symmetric, qmax 127, per block:                  1 byte + 4/block
        |x - q(x)| <= s/2
  int4  symmetric, qmax 7, per block, two a byte:        1/2 byte + 4/block
        |x - q(x)| <= s/2

The block formats' bounds hold up to float32 rounding of x/s and q*s (under 2^-22 |x|).
Scales travel as float32. A block holding a non-finite element decodes as NaN on every
rank (as a float32 average would show it), instead of failing on one rank and leaving the
others waiting in a collective.

`ErrorFeedback` keeps what quantization lost (x - q(x)) and adds it to the next input
(error feedback, as in 1-bit SGD): a float32 residual per tensor (views of one flat
buffer), committed only when the caller says the quantized value was used.
"""

import math

import torch

from ..base.checks import integer
from ..errors import InvalidArgument

FORMATS = ("fp32", "bf16", "fp8", "int8", "int4")
DEFAULT_BLOCK = 128
_SCALE_BYTES = 4  # float32 scales
_FP8_MAX = 448.0  # largest finite float8_e4m3fn
_QMAX = dict(fp8=_FP8_MAX, int8=127, int4=7)  # the largest magnitude each scaled format holds (not ABI codes)
_BYTES = dict(fp32=4, bf16=2, fp8=1, int8=1, int4=0.5)  # bytes per element, before the blocks' scales


def _align4(n):
    return (n + 3) & ~3  # payloads are padded to 4 bytes, so float32 scales in them stay aligned


class Codec:
    """One format (`name`, one of FORMATS) with its block size (the scale's span, for fp8,
    int8 and int4). encode(x) -> uint8 payload of nbytes(x.numel()); decode(payload, n) ->
    float32 tensor of n elements."""

    def __init__(self, name="int8", block=DEFAULT_BLOCK):
        if name not in FORMATS:
            raise InvalidArgument(f"quantization {name!r} is unknown; choose one of {', '.join(FORMATS)}")
        self.name = name
        self.block = integer("block size", block, low=1, high=1 << 24)
        self.qmax = _QMAX.get(name)

    @property
    def scaled(self):
        """Whether the format carries per-block scales."""
        return self.qmax is not None

    def __repr__(self):
        return f"Codec({self.name!r}, block={self.block})" if self.scaled else f"Codec({self.name!r})"

    def nblocks(self, n):
        return -(-n // self.block) if self.scaled else 0

    def data_bytes(self, n):
        if self.name == "fp32":
            return 4 * n
        if self.name == "bf16":
            return 2 * n
        if self.name == "int4":
            return (n + 1) // 2
        return n  # fp8, int8

    def nbytes(self, n):
        """The payload's size for n elements: data, then float32 scales, padded to 4 bytes."""
        return _align4(self.data_bytes(n)) + _SCALE_BYTES * self.nblocks(n)

    def bytes_per_element(self):
        """What an element costs on the wire, scales included (the padding aside)."""
        data = _BYTES[self.name]
        return data + (_SCALE_BYTES / self.block if self.scaled else 0)

    # -- encoding ---------------------------------------------------------------------

    def encode(self, x, out=None):
        """The payload of flat float32 tensor `x` (into `out`, a uint8 tensor of nbytes, if given)."""
        x = _flat32(x)
        n = x.numel()
        size = self.nbytes(n)
        if out is None:
            out = torch.empty(size, dtype=torch.uint8, device=x.device)
        elif out.dtype != torch.uint8 or out.numel() != size:
            raise InvalidArgument(f"payload buffer holds {out.numel()} {out.dtype} elements; "
                                  f"{self.name} of {n} elements needs {size} uint8")
        if self.name == "fp32":
            out.view(torch.float32).copy_(x)
            return out
        if self.name == "bf16":
            data = out[:2 * n].view(torch.bfloat16)
            data.copy_(x)
            out[2 * n:].zero_()
            return out
        blocks, scales = self._scales(x)
        d = self.data_bytes(n)
        out[_align4(d):].view(torch.float32).copy_(scales)
        out[d:_align4(d)].zero_()
        safe = torch.where(torch.isfinite(scales) & (scales > 0), scales, torch.ones_like(scales))
        y = (blocks / safe[:, None]).reshape(-1)[:n]
        if self.name == "fp8":
            out[:n].view(torch.float8_e4m3fn).copy_(y.clamp_(-_FP8_MAX, _FP8_MAX))
        elif self.name == "int8":
            out[:n].view(torch.int8).copy_(y.round_().clamp_(-127, 127))
        else:  # int4: q + 8 in [1, 15], low nibble first
            u = y.round_().clamp_(-7, 7).add_(8).to(torch.uint8)
            if n % 2:
                u = torch.cat([u, u.new_full((1,), 8)])  # the pad nibble decodes as 0
            out[:d].copy_(u[0::2] | (u[1::2] << 4))
        return out

    def _scales(self, x):
        """x padded to whole blocks, (nblocks, block), and each block's scale: its largest
        |x| / qmax; NaN where the block holds a non-finite element."""
        n, b = x.numel(), self.block
        nb = self.nblocks(n)
        if n == nb * b:
            blocks = x.view(nb, b)
        else:
            blocks = x.new_zeros(nb * b)
            blocks[:n] = x
            blocks = blocks.view(nb, b)
        amax = blocks.abs().amax(dim=1) if nb else blocks.new_zeros(0)  # inf or NaN where a value is
        scales = torch.where(torch.isfinite(amax), amax / self.qmax, torch.full_like(amax, math.nan))
        return blocks, scales

    # -- decoding ---------------------------------------------------------------------

    def decode(self, payload, n, out=None):
        """The float32 values of a payload of n elements (into `out`, float32 of n, if given)."""
        n = integer("element count", n, low=0)
        if payload.dtype != torch.uint8 or payload.numel() != self.nbytes(n):
            raise InvalidArgument(f"a {self.name} payload of {n} elements is {self.nbytes(n)} uint8, "
                                  f"got {payload.numel()} {payload.dtype}")
        if out is None:
            out = torch.empty(n, dtype=torch.float32, device=payload.device)
        if self.name == "fp32":
            return out.copy_(payload.view(torch.float32))
        if self.name == "bf16":
            return out.copy_(payload[:2 * n].view(torch.bfloat16))
        d = self.data_bytes(n)
        scales = payload[_align4(d):].view(torch.float32)
        if self.name == "fp8":
            out.copy_(payload[:n].view(torch.float8_e4m3fn))
        elif self.name == "int8":
            out.copy_(payload[:n].view(torch.int8))
        else:
            packed = payload[:d]
            both = torch.stack([packed & 15, packed >> 4], dim=1).reshape(-1)[:n]
            out.copy_(both).sub_(8)
        whole = n // self.block * self.block  # scale block by block, the short last one apart
        out[:whole].view(-1, self.block).mul_(scales[:whole // self.block, None])
        if whole < n:
            out[whole:].mul_(scales[-1])
        return out

    # -- what a round trip may lose ---------------------------------------------------

    def bound(self, x):
        """The largest |x - decode(encode(x))| the format allows, per element of flat `x`
        (the module's table; float32 rounding of the block formats not included)."""
        x = _flat32(x)
        if self.name == "fp32":
            return torch.zeros_like(x)
        if self.name == "bf16":
            return torch.maximum(x.abs() * 2.0 ** -8, torch.full_like(x, 2.0 ** -134))
        _, scales = self._scales(x)
        s = scales.repeat_interleave(self.block)[:x.numel()]
        if self.name == "fp8":
            return torch.maximum(x.abs() * 2.0 ** -4, s * 2.0 ** -10)
        return s / 2


def codec(quantization, block=DEFAULT_BLOCK):
    """A Codec from a name (or a Codec, returned as it is)."""
    if isinstance(quantization, Codec):
        return quantization
    if not isinstance(quantization, str):
        raise InvalidArgument(f"quantization must be one of {', '.join(FORMATS)}, got {quantization!r}")
    return Codec(quantization, block)


def _flat32(x):
    if not isinstance(x, torch.Tensor):
        raise InvalidArgument(f"expected a tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise InvalidArgument(f"only floating-point tensors are quantized, got {x.dtype}")
    return x.detach().reshape(-1).to(torch.float32)


def quantize(x, quantization="int8", block=DEFAULT_BLOCK):
    """The payload (uint8) of tensor `x`, of any shape; dequantize(payload, x.shape, ...) decodes it."""
    return codec(quantization, block).encode(x)


def dequantize(payload, shape, quantization="int8", block=DEFAULT_BLOCK):
    """A float32 tensor of `shape` from quantize()'s payload."""
    shape = torch.Size(shape)
    return codec(quantization, block).decode(payload, shape.numel()).view(shape)


class ErrorFeedback:
    """Error feedback over tensors laid end to end in one flat float32 buffer (a DiLoCo
    fragment's): add(x) is x plus the residual; once the quantized value went out,
    commit(x_in, sent) keeps x_in - sent as the next residual. views(shapes) shows the
    residual tensor by tensor. Zero at the start."""

    def __init__(self, n, device="cpu"):
        self.residual = torch.zeros(integer("element count", n, low=0), dtype=torch.float32, device=device)

    def add(self, x):
        return x.to(torch.float32) + self.residual

    def commit(self, x_in, sent):
        torch.sub(x_in, sent, out=self.residual)

    def views(self, shapes):
        out, at = [], 0
        for s in shapes:
            n = torch.Size(s).numel()
            out.append(self.residual[at:at + n].view(s))
            at += n
        return out

    def state_dict(self):
        return {"residual": self.residual.clone()}

    def load_state_dict(self, state):
        got = state["residual"]
        if not isinstance(got, torch.Tensor) or got.shape != self.residual.shape:
            raise InvalidArgument(f"error-feedback residual of {tuple(getattr(got, 'shape', ()))} elements; "
                                  f"this one holds {self.residual.numel()}")
        self.residual.copy_(got)


__all__ = ["Codec", "ErrorFeedback", "FORMATS", "DEFAULT_BLOCK", "codec", "quantize", "dequantize"]
