"""C ABI functions for DLPack tensors (capi/pybridge.h, section "DLPack").

Conversion only: reading the DLPack structs lives in pybridge/base/dlpack.py.
"""

from .. import capi
from ..base import dlpack
from ..base.buffers import check_extent
from ..errors import InvalidArgument


def _describe(src, out, versioned):
    if out == capi.ffi.NULL:
        raise InvalidArgument("out descriptor is NULL")
    data, count, dtype, device = dlpack.describe(int(capi.ffi.cast("uintptr_t", src)), versioned)
    check_extent(count, dtype, device)  # a CUDA device this process does not have, a size beyond memory
    out.data = capi.ffi.cast("void *", data)
    out.count = count
    out.dtype = dtype
    out.device = device


def pb_tensor_from_dlpack(src, out):
    _describe(src, out, versioned=False)


def pb_tensor_from_dlpack_versioned(src, out):
    _describe(src, out, versioned=True)
