"""libtorch tensors by handle: the program's own `at::Tensor`, not a description of it.

Every libtorch binding hands out the same thing: a pointer to an `at::Tensor` in the one
libtorch of the process (gotch's `Tensor.Ctensor()`, GoTorch's `C.Tensor`, Rust tch's
`as_ptr()`, C++'s `&t`). An `at::Tensor` is one intrusive pointer to its `TensorImpl`
(TensorBase's only member, `sizeof(at::Tensor) == sizeof(void*)`), so the core reads that
pointer and gives it to torch's own `torch._C._wrap_tensor_impl`, which takes a reference
and returns the Python tensor of that TensorImpl: the same tensor, with its dtype, device,
sizes, strides, storage and autograd state, read from libtorch. Nothing is compiled
against libtorch's headers for this, so it works with whichever torch the process has.

The returned tensor holds a reference: memory a call keeps (an asynchronous collective, a
reducer) stays alive after the program's binding frees its handle (a Go finalizer, say).
"""

import ctypes

import torch

from ..errors import InvalidArgument
from . import dtypes

_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = (ctypes.py_object, ctypes.c_char_p)


def from_handle(address, what="tensor"):
    """The tensor an `at::Tensor*` at `address` (an int) refers to, checked for use by a
    collective or the reducer: defined, strided, one of the eight dtypes the collectives
    reduce, contiguous, and on the host or this process's CUDA device. Raises
    InvalidArgument naming `what` and the reason."""
    if not address:
        raise InvalidArgument(f"{what}: the at::Tensor* handle is NULL")
    impl = ctypes.c_void_p.from_address(address).value
    try:
        t = torch._C._wrap_tensor_impl(_capsule(impl, None, None))
    except (RuntimeError, ValueError) as exc:
        if impl is None or "undefined" in str(exc):
            raise InvalidArgument(f"{what} is an undefined at::Tensor (default-constructed, moved from or "
                                  "reset): it has no data") from None
        if "sparse" in str(exc):  # torch wraps dense TensorImpls only (its invariant check says so)
            raise InvalidArgument(f"{what} is a sparse tensor; collectives take dense (strided) tensors") from None
        raise
    if t.layout != torch.strided:
        raise InvalidArgument(f"{what} has layout {t.layout}; collectives take dense (strided) tensors")
    if t.dtype not in dtypes.CODE_OF:
        raise InvalidArgument(f"{what} has dtype {t.dtype}, which the collectives do not reduce; "
                              f"supported: {', '.join(dtypes.NAMES)}")
    if not t.is_contiguous():
        raise InvalidArgument(f"{what} is not contiguous (sizes {tuple(t.shape)}, strides {t.stride()}): "
                              "collectives work on one block of memory in place. Pass x.contiguous() "
                              "and copy the result back into x (x.copy_(y)) after the call")
    if t.device.type == "cuda":
        here = torch.cuda.current_device()
        if t.device.index != here:
            raise InvalidArgument(f"{what} is on {t.device}, but this process's device is cuda:{here} "
                                  "(one GPU per process: pybridge-launch sets it from LOCAL_RANK)")
    elif t.device.type != "cpu":
        raise InvalidArgument(f"{what} is on {t.device}; collectives take host (cpu) or CUDA tensors")
    return t


def handle_of(t):
    """An `at::Tensor` for a Python tensor, as a C++ program would hold one: an 8-byte
    block holding its TensorImpl pointer, returned as (ctypes block, address). The block
    borrows `t`'s reference, so it is valid while `t` lives; for tests and Python callers
    that hand a tensor to code written for handles."""
    block = ctypes.c_void_p(_capsule_pointer(torch._C._tensor_impl_raw_handle(t), None))
    return block, ctypes.addressof(block)
