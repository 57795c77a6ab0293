"""DLPack: describe another framework's tensor (torch, JAX/XLA, CuPy, TVM...) as one block of
memory the collectives can work on in place, without copying it.

The C ABI hands over a `DLManagedTensor` or (DLPack 1.0) `DLManagedTensorVersioned` by
address; `describe` reads it with ctypes, using the layout of dlpack.h (stable since 0.6;
the versioned struct since 1.0). Ownership stays with the caller: nothing here calls the
deleter. Python objects with `__dlpack__` go through torch.from_dlpack (buffers.as_tensor).
"""

import ctypes

from .. import abi
from ..errors import InvalidArgument

# dlpack.h's DLDeviceType and DLDataTypeCode values.
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3
_DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan", 8: "kDLMetal",
                 9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost", 12: "kDLExtDev", 13: "kDLCUDAManaged",
                 14: "kDLOneAPI", 15: "kDLWebGPU", 16: "kDLHexagon", 17: "kDLMAIA", 18: "kDLTrn"}
_CODE_NAMES = {0: "kDLInt", 1: "kDLUInt", 2: "kDLFloat", 3: "kDLOpaqueHandle", 4: "kDLBfloat",
               5: "kDLComplex", 6: "kDLBool"}
# (type code, bits) -> pybridge dtype code; lanes must be 1.
_DTYPES = {(2, 32): abi.PB_FLOAT32, (2, 64): abi.PB_FLOAT64, (2, 16): abi.PB_FLOAT16,
           (4, 16): abi.PB_BFLOAT16, (0, 8): abi.PB_INT8, (1, 8): abi.PB_UINT8,
           (0, 32): abi.PB_INT32, (0, 64): abi.PB_INT64}
FLAG_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
MAJOR_VERSION = 1   # the DLPack major version whose versioned layout this reads


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


def describe(address, versioned=False):
    """(data address, element count, dtype code, device code) of the DLPack tensor at
    `address` (a DLManagedTensor, or a DLManagedTensorVersioned when `versioned`).
    Refuses, naming the field: a NULL tensor, another major version, a read-only
    tensor, vector lanes, a dtype or device the collectives do not support, and strides
    that are not one compact row-major block."""
    if not address:
        raise InvalidArgument("DLPack tensor is NULL")
    if versioned:
        managed = _ManagedVersioned.from_address(address)
        if managed.version.major != MAJOR_VERSION:
            raise InvalidArgument(f"DLPack version {managed.version.major}.{managed.version.minor} is not "
                                  f"supported (major version {MAJOR_VERSION} is)")
        if managed.flags & FLAG_READ_ONLY:
            raise InvalidArgument("DLPack tensor is read-only (flags has DLPACK_FLAG_BITMASK_READ_ONLY); "
                                  "collectives write their result in place")
    else:
        managed = _Managed.from_address(address)
    t = managed.dl_tensor
    dtype = _dtype(t.dtype)
    device = _device(t.device)
    if t.ndim < 0:
        raise InvalidArgument(f"DLPack tensor: ndim is negative ({t.ndim})")
    shape = [t.shape[i] for i in range(t.ndim)] if t.ndim else []
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"DLPack tensor: shape {shape} has a negative dimension")
    count = 1
    for d in shape:
        count *= d
    if t.strides and count:
        _check_compact(shape, [t.strides[i] for i in range(t.ndim)])
    data = (t.data or 0) + t.byte_offset
    if count and not t.data:
        raise InvalidArgument(f"DLPack tensor: data is NULL but the shape {shape} holds {count} elements")
    return data, count, dtype, device


def _dtype(dt):
    if dt.lanes != 1:
        raise InvalidArgument(f"DLPack dtype has {dt.lanes} lanes; only scalar types (lanes 1) are supported")
    code = _DTYPES.get((dt.code, dt.bits))
    if code is None:
        name = _CODE_NAMES.get(dt.code, f"type code {dt.code}")
        raise InvalidArgument(f"DLPack dtype {name} with {dt.bits} bits is not supported; use float32, "
                              "float64, float16, bfloat16, int8, uint8, int32 or int64")
    return code


def _device(dev):
    kind = dev.device_type
    if kind in (KDL_CPU, KDL_CUDA_HOST):  # pinned host memory is host memory
        return abi.PB_CPU
    if kind == KDL_CUDA:
        if dev.device_id < 0:
            raise InvalidArgument(f"DLPack device: kDLCUDA with a negative device_id ({dev.device_id})")
        return dev.device_id
    name = _DEVICE_NAMES.get(kind, f"device type {kind}")
    raise InvalidArgument(f"DLPack device {name} is not supported; use kDLCPU, kDLCUDAHost or kDLCUDA")


def _check_compact(shape, strides):
    """Strides (in elements) must be those of a compact row-major array; dimensions of
    size 1 may have any stride (as DLPack producers such as torch leave them)."""
    expect = 1
    for d in range(len(shape) - 1, -1, -1):
        if shape[d] != 1 and strides[d] != expect:
            raise InvalidArgument(f"DLPack tensor is not contiguous: strides {strides} for shape {shape} "
                                  "(collectives need one compact row-major block; make it contiguous first)")
        expect *= shape[d]
