"""Zero-copy views: turn torch tensors, numpy arrays, writable buffers and raw
pointers into torch tensors that share the caller's memory."""

import ctypes
from collections import OrderedDict
from typing import Any, Callable, Hashable, Optional, Protocol, Union

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack
from typing_extensions import Buffer

from .. import abi
from . import dtypes
from .checks import integer
from ..errors import InvalidArgument

CPU = abi.PB_CPU  # device code for host memory; >= 0 is a CUDA device index


class SupportsDLPack(Protocol):
    """An array that hands its memory over by DLPack (JAX, CuPy, ...)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...


# What the collectives take, in place: a torch tensor, a numpy array, a DLPack array or any
# writable buffer (bytearray, memoryview, array.array, ...).
BufferLike = Union[torch.Tensor, np.ndarray[Any, Any], SupportsDLPack, Buffer]


def as_tensor(obj: BufferLike, dtype: Optional[dtypes.DTypeLike] = None) -> torch.Tensor:
    """A contiguous tensor viewing `obj`'s memory, so in-place collectives write back.

    `obj` is a torch tensor, a numpy array, any object with `__dlpack__` (JAX, CuPy...;
    torch.from_dlpack shares its memory) or any writable buffer (bytearray,
    memoryview, array.array, ...). `dtype` reinterprets the bytes, e.g. a uint16
    numpy array as bfloat16, which numpy lacks.
    """
    if isinstance(obj, torch.Tensor):
        t = obj
    elif isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise InvalidArgument("numpy array is not C-contiguous; collectives need one block of memory")
        if not obj.flags.writeable:
            raise InvalidArgument("numpy array is read-only; collectives write their result in place")
        t = torch.from_numpy(obj) if obj.dtype.name in dtypes.NAMES else _from_buffer(obj, dtype or obj.dtype)
    elif hasattr(obj, "__dlpack__"):  # JAX, CuPy, TVM...: their memory, shared
        try:
            t = from_dlpack(obj)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"cannot use {type(obj).__name__} through DLPack: {exc}") from None
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise InvalidArgument(
                f"expected a torch tensor, numpy array, DLPack object or writable buffer, got {type(obj).__name__}") from None
        t = _from_buffer(view, dtype or _format_dtype(view))
    if not t.is_contiguous():
        raise InvalidArgument("tensor is not contiguous; collectives need one block of memory")
    if dtype is not None:
        want = dtypes.torch_dtype(dtype)
        if t.dtype != want:
            if t.element_size() != want.itemsize:
                raise InvalidArgument(f"cannot view {t.dtype} data as {want}: element sizes differ")
            t = t.view(want)
    if t.dtype not in dtypes.CODE_OF:
        dtypes.torch_dtype(t.dtype)  # raises: unsupported, such as complex or bool
    return t


def _format_dtype(view: memoryview) -> np.dtype[Any]:
    try:
        return np.dtype(view.format)
    except TypeError:
        raise InvalidArgument(f"buffer format {view.format!r} is not a supported element type") from None


def _from_buffer(view: Union[Buffer, np.ndarray[Any, Any]], dtype: dtypes.DTypeLike) -> torch.Tensor:
    mem = memoryview(view)
    if mem.readonly:
        raise InvalidArgument("buffer is read-only; collectives write their result in place")
    if not mem.c_contiguous:
        raise InvalidArgument("buffer is not contiguous; collectives need one block of memory")
    want = dtypes.torch_dtype(dtype)
    if mem.nbytes % want.itemsize:
        raise InvalidArgument(f"buffer of {mem.nbytes} bytes is not a whole number of {want} elements")
    if mem.nbytes == 0:
        return torch.empty(0, dtype=want)
    return torch.frombuffer(mem.cast("B"), dtype=want)


class _CudaArray:
    """Just enough of __cuda_array_interface__ for torch.as_tensor to wrap a device pointer."""

    _TYPESTR = {torch.float32: "<f4", torch.float64: "<f8", torch.float16: "<f2",
                torch.bfloat16: "<V2", torch.int8: "|i1", torch.uint8: "|u1",
                torch.int32: "<i4", torch.int64: "<i8"}

    def __init__(self, address: int, count: int, dtype: torch.dtype) -> None:
        # bfloat16 has no typestr: wrap as int16 and reinterpret afterwards.
        typestr = "<i2" if dtype == torch.bfloat16 else self._TYPESTR[dtype]
        self.__cuda_array_interface__ = {
            "data": (address, False), "shape": (count,), "typestr": typestr, "version": 3}


class PointerViews:
    """Tensors over raw memory, cached by (address, count, dtype, device).

    A view holds no ownership, so reusing one for the same address and size is exactly
    as safe as making it anew; the cache only saves the wrapping cost on hot paths.
    Addresses may be any hashable stand-in (a cffi pointer, say) that `address_of`
    turns into an int when a view must be made.
    """

    def __init__(self, capacity: int = 256, address_of: Callable[[Any], int] = int) -> None:
        self._cache: "OrderedDict[tuple[Hashable, int, Any, int], torch.Tensor]" = OrderedDict()
        self._capacity = capacity
        self._address_of = address_of

    def get(self, address: Hashable, count: int, dtype: dtypes.DTypeLike, device: int = CPU) -> torch.Tensor:
        """The tensor over `count` elements of `dtype` at `address` (from_pointer), cached."""
        key = (address, count, dtype, device)
        t = self._cache.get(key)
        if t is not None:
            self._cache.move_to_end(key)
            return t
        t = from_pointer(self._address_of(address), count, dtype, device)
        self._cache[key] = t
        if len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return t


MAX_BYTES = 1 << 47  # 128 TiB: more than any machine's memory, far from overflowing a size


def check_extent(count: int, dtype: dtypes.DTypeLike, device: int = CPU) -> torch.dtype:
    """Check an element count and a device code (C ABI conventions) before anything is
    allocated or wrapped; returns the torch dtype. Bad values are InvalidArgument naming
    them, never an overflow deeper down."""
    want = dtypes.torch_dtype(dtype)
    count = integer("element count", count, low=0)
    if count * want.itemsize > MAX_BYTES:
        raise InvalidArgument(f"element count {count} of {want} is {count * want.itemsize} bytes, more than "
                              f"any memory (the limit is 2^47 bytes)")
    device = integer("device", device, low=CPU, expected="-1 (CPU) or a CUDA device index >= 0")
    if device >= 0:
        _check_cuda_device(device)
    return want


def from_pointer(address: int, count: int, dtype: dtypes.DTypeLike, device: int = CPU) -> torch.Tensor:
    """A tensor over `count` elements of `dtype` at `address` (host or CUDA memory)."""
    want = check_extent(count, dtype, device)
    if count == 0:
        return torch.empty(0, dtype=want, device="cpu" if device == CPU else f"cuda:{device}")
    if not address:
        raise InvalidArgument(f"data pointer is NULL but element count is {count}")
    if device == CPU:
        raw = (ctypes.c_byte * (count * want.itemsize)).from_address(address)
        return torch.frombuffer(raw, dtype=want)
    with torch.cuda.device(device):
        t = torch.as_tensor(_CudaArray(address, count, want), device=f"cuda:{device}")
    return t.view(torch.bfloat16) if want == torch.bfloat16 else t


def _check_cuda_device(device: int) -> None:
    if not torch.cuda.is_available():
        raise InvalidArgument(f"CUDA device {device} requested but CUDA is not available")
    if device >= torch.cuda.device_count():
        raise InvalidArgument(
            f"CUDA device {device} requested but only {torch.cuda.device_count()} device(s) exist")
