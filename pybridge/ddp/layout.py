"""Bucket layout: what the reducer knows of each parameter (ParamSpec), which parameters
share a bucket (assign_buckets), and the buckets' flat memory with each gradient's view into
it (Layout).

Arithmetic and allocation only: no collective and no hook. The one rebuild's order comes
from rank 0 through the reducer, which then asks for the layout of that order.
"""

from typing import Any, Optional, Sequence, cast

import torch

from ..base import dtypes
from ..base.buffers import check_extent
from ..base.checks import integer
from ..errors import InvalidArgument


class ParamSpec:
    """What the reducer needs to know about one parameter."""

    __slots__ = ("shape", "numel", "dtype", "device")

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        self.shape = shape
        self.numel = 1
        for d in shape:
            self.numel *= d
        self.dtype = dtype
        self.device = device

    @property
    def nbytes(self) -> int:
        """The gradient's size in bytes."""
        return self.numel * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"ParamSpec({tuple(self.shape)}, {self.dtype}, {self.device})"


def parse_spec(i: int, item: Any, default_device: torch.device) -> ParamSpec:
    """Parameter i's ParamSpec from a tensor or (numel or shape, dtype[, device])."""
    if isinstance(item, torch.Tensor):
        return ParamSpec(tuple(item.shape), dtypes.torch_dtype(item.dtype), item.device)
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
        raise InvalidArgument(f"parameter {i}: expected a tensor or (numel or shape, dtype[, device]), "
                              f"got {item!r}")
    size, dt = item[0], item[1]
    device = _device(i, item[2]) if len(item) == 3 and item[2] is not None else default_device
    if isinstance(size, torch.Size):
        size = tuple(size)
    shape = (size,) if isinstance(size, int) and not isinstance(size, bool) else size
    expected = "a non-negative element count or a shape"
    if not isinstance(shape, (tuple, list)):
        raise InvalidArgument(f"parameter {i}: size must be {expected}, got {size!r}")
    shape = [integer(f"parameter {i}: size", d, low=0, expected=expected) for d in shape]
    dt = dtypes.torch_dtype(dt)
    n = 1
    for d in shape:
        n *= d
    check_extent(n, dt)
    if not dt.is_floating_point:
        raise InvalidArgument(f"parameter {i}: gradients must be floating point, got {dt}")
    return ParamSpec(tuple(shape), dt, device)


def _device(i: int, dev: Any) -> torch.device:
    """A torch device from a torch.device, a name, or a C ABI code (-1 CPU, k >= 0 CUDA k)."""
    if isinstance(dev, torch.device):
        return dev
    if isinstance(dev, int) and not isinstance(dev, bool):
        if dev < -1:
            raise InvalidArgument(f"parameter {i}: device code must be -1 (CPU) or a CUDA index, got {dev}")
        return torch.device("cpu") if dev == -1 else torch.device("cuda", dev)
    try:
        return torch.device(dev)
    except (RuntimeError, TypeError):
        raise InvalidArgument(f"parameter {i}: unknown device {dev!r}") from None


def initial_order(n: int) -> list[int]:
    """The order of the first layout: reverse parameter order, roughly the order in which
    backward produces gradients (as torch DDP)."""
    return list(range(n))[::-1]


def assign_buckets(specs: Sequence[ParamSpec], order: Sequence[int], bucket_cap: int,
                   first_bucket_cap: int) -> list[list[int]]:
    """Group parameter indices into buckets: visit them in `order`, keep one open bucket
    per (dtype, device), close a bucket once it holds at least its cap (the first bucket of
    each kind gets `first_bucket_cap`, so the first allreduce starts early). Closing after
    the gradient that fills it (rather than before one that would overflow it) keeps a
    layer's bias and weight, which become ready together, in one bucket. Buckets are
    returned sorted by where their first member appears in `order`."""
    open_: dict[tuple[torch.dtype, torch.device], tuple[list[int], list[int]]] = {}  # members, [bytes]
    closed: list[list[int]] = []
    count: dict[tuple[torch.dtype, torch.device], int] = {}
    for i in order:
        s = specs[i]
        key = (s.dtype, s.device)
        members, size = open_.setdefault(key, ([], [0]))
        members.append(i)
        size[0] += s.nbytes
        cap = first_bucket_cap if count.get(key, 0) == 0 else bucket_cap
        if size[0] >= cap:
            closed.append(members)
            count[key] = count.get(key, 0) + 1
            del open_[key]
    closed.extend(members for members, _ in open_.values())
    pos = {i: k for k, i in enumerate(order)}
    closed.sort(key=lambda members: pos[members[0]])
    return closed


def member_views(flat: torch.Tensor, members: Sequence[int], specs: Sequence[ParamSpec]) -> list[torch.Tensor]:
    """Each member's view into `flat` (a bucket's memory or a tensor of its size), in its
    shape, one after the other in member order."""
    views: list[torch.Tensor] = []
    offset = 0
    for i in members:
        s = specs[i]
        views.append(flat[offset:offset + s.numel].view(s.shape))
        offset += s.numel
    return views


class Bucket:
    """One bucket: its parameter indices (`members`, in layout order), its flat memory and
    that memory's size in bytes."""

    __slots__ = ("index", "members", "flat", "dtype", "device", "nbytes")

    def __init__(self, index: int, members: list[int], specs: Sequence[ParamSpec]) -> None:
        self.index = index
        self.members = members
        first = specs[members[0]]
        self.dtype, self.device = first.dtype, first.device
        total = sum(specs[i].numel for i in members)
        self.flat = torch.zeros(total, dtype=self.dtype, device=self.device)
        self.nbytes = total * self.flat.element_size()


class Layout:
    """The buckets of one assignment (a list of member lists, in launch order) and, per
    parameter, its view into its bucket (`views`) and its bucket's index (`bucket_of`).
    `sizes`: members per bucket; `last`: the last bucket with any elements (-1: none)."""

    __slots__ = ("buckets", "views", "bucket_of", "sizes", "last")

    def __init__(self, specs: Sequence[ParamSpec], assignment: Sequence[list[int]]) -> None:
        self.buckets = [Bucket(b, members, specs) for b, members in enumerate(assignment)]
        self.last = max((b.index for b in self.buckets if b.flat.numel()), default=-1)
        n = len(specs)
        self.bucket_of = [0] * n
        self.views = cast(list[torch.Tensor], [None] * n)  # each set below
        for bucket in self.buckets:
            for i, view in zip(bucket.members, member_views(bucket.flat, bucket.members, specs)):
                self.bucket_of[i] = bucket.index
                self.views[i] = view
        self.sizes = [len(b.members) for b in self.buckets]

    @classmethod
    def first(cls, specs: Sequence[ParamSpec], bucket_cap: int, first_bucket_cap: int) -> "Layout":
        """The layout of the first iteration (initial_order)."""
        return cls(specs, assign_buckets(specs, initial_order(len(specs)), bucket_cap, first_bucket_cap))

    @property
    def indices(self) -> list[list[int]]:
        """Parameter indices of each bucket, in bucket (= launch) order and layout order."""
        return [list(b.members) for b in self.buckets]

    def arranged(self, specs: Sequence[ParamSpec], order: Sequence[int], bucket_cap: int,
                 first_bucket_cap: int) -> Optional["Layout"]:
        """The layout of `order`, holding this layout's gradient values; None when it would
        have the same buckets as this one."""
        assignment = assign_buckets(specs, order, bucket_cap, first_bucket_cap)
        if assignment == self.indices:
            return None
        new = Layout(specs, assignment)
        for view, old in zip(new.views, self.views):
            view.copy_(old)
        return new

    def reshape(self, i: int, shape: Sequence[int]) -> None:
        """Parameter i's view in another shape of the same element count (set_shapes)."""
        self.views[i] = self.views[i].view(shape)


__all__ = ["ParamSpec", "parse_spec", "initial_order", "assign_buckets", "member_views", "Bucket", "Layout"]
