"""The Python side of the C ABI (capi/pybridge.h).

Each `pb_NAME` of the header is implemented by a function of the same name in one of
this package's modules (core: groups, collectives, buffers, work; and one module per
further feature)
that converts C arguments, calls the core, and writes out-parameters. `install`
registers them with cffi; every exception becomes a status code plus a thread-local
message, so none escapes into C, in C's names (names.py). No training logic lives here.
"""

import importlib
import itertools
import pkgutil

from .. import abi
from ..base import at_tensor
from ..comm import group as _group
from ..comm import world as _world
from . import libtorch, names
from ..base.buffers import PointerViews
from ..errors import INTERNAL, InvalidArgument, NotInitialized, PyBridgeError, classify

ffi = None  # set by install(): the embedding module's FFI


def _address(ptr):
    return int(ffi.cast("uintptr_t", ptr))


# Keyed by the descriptor's data pointer as cffi gives it: cdata pointers hash and
# compare by address, and skipping the conversion to int saves a third of a
# microsecond per call on the collectives' hot path.
_views = PointerViews(address_of=_address)


class Handles:
    """Opaque handles are keys into this table, never raw object addresses, so a stale,
    foreign or garbage pointer is rejected instead of dereferenced. The keys are the
    handle pointers themselves: cdata pointers of any type hash and compare by address,
    so a lookup needs no conversion to int."""

    def __init__(self):
        self._objects = {}
        self._ids = itertools.count(0x5042_0000, 16)  # next() is atomic under the GIL

    def add(self, obj, ctype, out, what="out"):
        if out == ffi.NULL:
            raise InvalidArgument(f"{what} (the pointer to store the handle in) is NULL")
        handle = ffi.cast(ctype, next(self._ids))
        self._objects[handle] = obj
        out[0] = handle

    def get(self, ptr, kind, what):
        obj = self._objects.get(ptr)
        if not isinstance(obj, kind):
            if ptr == ffi.NULL:
                raise InvalidArgument(f"{what} is NULL")
            raise InvalidArgument(f"{what} is not a live {names.handle_type(kind)} handle (freed or foreign)")
        return obj

    def remove(self, ptr, kind, what):
        obj = self.get(ptr, kind, what)
        del self._objects[ptr]
        return obj


handles = Handles()


# ---- argument conversion ---------------------------------------------------------

def live_group(ptr):
    if ptr == ffi.NULL and not _world.is_initialized():
        raise NotInitialized("process group is not initialized: call pb_init first")
    g = handles.get(ptr, _group.Group, "group")
    g.check_open()
    return g


def tensor(desc, what="tensor"):
    """The memory a pb_tensor describes, as a tensor: raw memory wrapped in place, or for a
    PB_TORCH_TENSOR handle the program's libtorch tensor itself (detached: collectives write
    its storage, autograd does not record them), which holds a reference to it."""
    if desc == ffi.NULL:
        raise InvalidArgument(f"{what} descriptor is NULL")
    if desc.dtype == abi.PB_TORCH_TENSOR:
        return at_tensor.from_handle(_address(desc.data), what).detach()
    return _views.get(desc.data, desc.count, desc.dtype, desc.device)


def tensor_array(n, array, what):
    """The n tensors of a pb_tensor array named `what` (see tensor)."""
    from ..base.checks import integer
    integer("n", n, low=0)
    if n and array == ffi.NULL:
        raise InvalidArgument(f"{what} is NULL with n = {n}")
    return [tensor(array + i, f"{what}[{i}]") for i in range(n)]


def torch_param(desc, what):
    """The libtorch tensor a PB_TORCH_TENSOR descriptor names, not detached (its autograd state
    is what the reducer attaches to)."""
    if desc == ffi.NULL:
        raise InvalidArgument(f"{what} descriptor is NULL")
    if desc.dtype != abi.PB_TORCH_TENSOR:
        raise InvalidArgument(f"{what} is not a libtorch tensor handle (dtype {desc.dtype}, not PB_TORCH_TENSOR): "
                              "attaching needs the parameter's autograd state; for raw gradient memory use "
                              "pb_reducer_create")
    return at_tensor.from_handle(_address(desc.data), what)


def descriptor_key(desc):
    """A pb_tensor's fields as a hashable key (empty for NULL), read without converting
    the data pointer: cffi pointers hash and compare by address. None for a libtorch handle:
    what it names is read anew at each call (the program may free the at::Tensor and make
    another at the same address)."""
    if desc == ffi.NULL:
        return ()
    if desc.dtype == abi.PB_TORCH_TENSOR:
        return None
    return desc.data, desc.count, desc.dtype, desc.device


def put(out, value, what="out"):
    if out == ffi.NULL:
        raise InvalidArgument(f"{what} is NULL")
    out[0] = value


def ffi_bytes(out, size, data, what):
    """Copy `data` and a terminating NUL into the C buffer `out` of `size` bytes (NULL with
    size 0: not wanted); InvalidArgument naming `what` when it does not fit."""
    if out == ffi.NULL and size == 0:
        return
    if out == ffi.NULL:
        raise InvalidArgument(f"{what} is NULL")
    if len(data) + 1 > size:
        raise InvalidArgument(f"{what}: {len(data) + 1} bytes (with the NUL) do not fit in {what}_size {size}")
    ffi.memmove(out, data + b"\0", len(data) + 1)


def text(cstr):
    return None if cstr == ffi.NULL else ffi.string(cstr).decode()


def flag(value, what):
    """A C int used as a boolean: 0 or 1, nothing else."""
    if value not in (0, 1):
        raise InvalidArgument(f"{what} must be 0 or 1, got {value}")
    return bool(value)


# ---- registration ------------------------------------------------------------------------

def _fail(lib, name, err):
    """The status of a failed call; its message, in C's names, becomes the thread's."""
    lib._pb_set_error(names.c_message(name, str(err)).encode("utf-8", "replace")[:4000])
    return err.code


def _export(lib, name, fn):
    def entry(*args):
        try:
            fn(*args)
            return 0
        except PyBridgeError as err:
            return _fail(lib, name, err)
        except BaseException as exc:  # noqa: BLE001 - nothing may escape into C
            return _fail(lib, name, classify(exc))

    ffi.def_extern(name=f"_pb_py_{name[3:]}", error=INTERNAL)(entry)


def install(embedding_ffi, lib):
    """Register every pb_* implementation with the embedding module."""
    global ffi
    libtorch.check()  # a host program linked against another libtorch: refuse to start, naming it
    ffi = embedding_ffi
    exported = set()
    for info in pkgutil.iter_modules(__path__):  # core, reducer, recordio, ...
        if info.name.startswith("_"):  # __main__: the build command, not part of the ABI
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name, fn in vars(module).items():
            if name.startswith("pb_") and callable(fn):
                _export(lib, name, fn)
                exported.add(f"_pb_py_{name[3:]}")
    # cffi makes an unimplemented extern "Python" function return 0 (PB_OK): refuse to start.
    missing = sorted(n for n in dir(lib) if n.startswith("_pb_py_") and n not in exported)
    if missing:
        raise RuntimeError(f"C ABI functions without a Python implementation: {', '.join(missing)}")
