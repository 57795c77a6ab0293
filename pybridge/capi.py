"""The Python side of the C ABI (capi/pybridge.h).

Each `pb_NAME` of the header is implemented here by a function of the same name that
converts C arguments, calls the core, and writes out-parameters. `install` registers
them with cffi; every exception becomes a status code plus a thread-local message,
so none escapes into C. No training logic lives here.
"""

import itertools

import torch

from . import collectives, dtypes
from . import group as _group
from .buffers import CPU, PointerViews
from .errors import INTERNAL, Closed, InvalidArgument, NotInitialized, PyBridgeError, classify

ffi = None  # set by install(): the embedding module's FFI
_views = PointerViews()


class Handles:
    """Opaque handles are keys into this table, never raw object addresses, so a stale,
    foreign or garbage pointer is rejected instead of dereferenced."""

    def __init__(self):
        self._objects = {}
        self._ids = itertools.count(0x5042_0000, 16)  # next() is atomic under the GIL

    def add(self, obj, ctype, out, what="out"):
        if out == ffi.NULL:
            raise InvalidArgument(f"{what} (the pointer to store the handle in) is NULL")
        key = next(self._ids)
        self._objects[key] = obj
        out[0] = ffi.cast(ctype, key)

    def get(self, ptr, kind, what):
        obj = self._objects.get(int(ffi.cast("uintptr_t", ptr)))
        if not isinstance(obj, kind):
            if ptr == ffi.NULL:
                raise InvalidArgument(f"{what} is NULL")
            raise InvalidArgument(f"{what} is not a live {kind.__name__} handle (freed or foreign)")
        return obj

    def remove(self, ptr, kind, what):
        obj = self.get(ptr, kind, what)
        del self._objects[int(ffi.cast("uintptr_t", ptr))]
        return obj


_handles = Handles()


class Buffer:
    """Library-owned memory that asynchronous operations may use after a call returns."""

    def __init__(self, dtype, count, device):
        if count < 0:
            raise InvalidArgument(f"count must be >= 0, got {count}")
        dev = torch.device("cpu") if device == CPU else torch.device("cuda", device)
        self.tensor = torch.zeros(count, dtype=dtypes.torch_dtype(dtype), device=dev)
        self.device = device


# ---- argument conversion ---------------------------------------------------------

def _live_group(ptr):
    if ptr == ffi.NULL and not _group.is_initialized():
        raise NotInitialized("process group is not initialized: call pb_init first")
    g = _handles.get(ptr, _group.Group, "group")
    g.check_open()
    return g


def _tensor(desc, what="tensor"):
    if desc == ffi.NULL:
        raise InvalidArgument(f"{what} descriptor is NULL")
    return _views.get(int(ffi.cast("uintptr_t", desc.data)), desc.count, desc.dtype, desc.device)


def _buffer(ptr, what="buffer"):
    return _handles.get(ptr, Buffer, what).tensor


def _put(out, value, what="out"):
    if out == ffi.NULL:
        raise InvalidArgument(f"{what} is NULL")
    out[0] = value


def _text(cstr):
    return None if cstr == ffi.NULL else ffi.string(cstr).decode()


# ---- process group -----------------------------------------------------------------

def pb_init(init_method, backend, rank, world_size, local_rank, timeout, out):
    if out == ffi.NULL:
        raise InvalidArgument("out (the pointer to store the group handle in) is NULL")
    g = _group.init(init_method=_text(init_method), backend=_text(backend), rank=rank,
                    world_size=world_size, local_rank=local_rank,
                    timeout=timeout if timeout > 0 else _group.DEFAULT_TIMEOUT)
    _handles.add(g, "pb_group *", out)


def pb_finalize(group):
    g = _handles.get(group, _group.Group, "group")
    if not g.closed:
        _group.finalize()


def pb_rank(group, out):
    _put(out, _live_group(group).rank)


def pb_size(group, out):
    _put(out, _live_group(group).size)


def pb_local_rank(group, out):
    _put(out, _live_group(group).local_rank)


def pb_device(group, out):
    dev = _live_group(group).device
    _put(out, dev.index if dev.type == "cuda" else CPU)


def pb_barrier(group):
    collectives.barrier(group=_live_group(group))


# ---- synchronous collectives ---------------------------------------------------------

def pb_broadcast(group, t, root):
    collectives.broadcast(_tensor(t), root, group=_live_group(group))


def pb_all_reduce(group, t, op):
    collectives.all_reduce(_tensor(t), op, group=_live_group(group))


def pb_all_gather(group, inp, out):
    collectives.all_gather(_tensor(inp, "input"), _tensor(out, "output"), group=_live_group(group))


def pb_reduce_scatter(group, inp, out, op):
    collectives.reduce_scatter(_tensor(inp, "input"), _tensor(out, "output"), op, group=_live_group(group))


def pb_send(group, t, dst, tag):
    collectives.send(_tensor(t), dst, tag, group=_live_group(group))


def pb_recv(group, t, src, tag):
    collectives.recv(_tensor(t), src, tag, group=_live_group(group))


# ---- buffers -------------------------------------------------------------------------

def pb_buffer_new(dtype, count, device, out):
    if out == ffi.NULL:
        raise InvalidArgument("out (the pointer to store the buffer handle in) is NULL")
    _handles.add(Buffer(dtype, count, device), "pb_buffer *", out)


def pb_buffer_tensor(buffer, out):
    b = _handles.get(buffer, Buffer, "buffer")
    if out == ffi.NULL:
        raise InvalidArgument("out descriptor is NULL")
    out.data = ffi.cast("void *", b.tensor.data_ptr())
    out.count = b.tensor.numel()
    out.dtype = dtypes.code(b.tensor.dtype)
    out.device = b.device


def pb_buffer_free(buffer):
    _handles.remove(buffer, Buffer, "buffer")


# ---- asynchronous operations --------------------------------------------------------------

def pb_broadcast_async(group, buffer, root, work):
    _start(work, collectives.broadcast(_buffer(buffer), root, group=_live_group(group), async_op=True))


def pb_all_reduce_async(group, buffer, op, work):
    _start(work, collectives.all_reduce(_buffer(buffer), op, group=_live_group(group), async_op=True))


def pb_all_gather_async(group, inp, out, work):
    _start(work, collectives.all_gather(_buffer(inp, "input"), _buffer(out, "output"),
                                        group=_live_group(group), async_op=True))


def pb_reduce_scatter_async(group, inp, out, op, work):
    _start(work, collectives.reduce_scatter(_buffer(inp, "input"), _buffer(out, "output"), op,
                                            group=_live_group(group), async_op=True))


def pb_isend(group, buffer, dst, tag, work):
    _start(work, collectives.isend(_buffer(buffer), dst, tag, group=_live_group(group)))


def pb_irecv(group, buffer, src, tag, work):
    _start(work, collectives.irecv(_buffer(buffer), src, tag, group=_live_group(group)))


def _start(out, w):
    # Checked after starting: a NULL here is a caller bug, but the operation is already
    # matched with the peers, so it is waited for rather than left dangling.
    if out == ffi.NULL:
        w.wait()
        raise InvalidArgument("work (the pointer to store the work handle in) is NULL")
    _handles.add(w, "pb_work *", out, "work")


def pb_work_wait(work, timeout):
    _handles.get(work, collectives.Work, "work").wait(timeout if timeout > 0 else None)


def pb_work_test(work, done):
    w = _handles.get(work, collectives.Work, "work")
    if done == ffi.NULL:
        raise InvalidArgument("done is NULL")
    try:
        done[0] = int(w.test())
    except PyBridgeError:
        done[0] = 1  # finished, with the error returned as the status
        raise


def pb_work_free(work):
    _handles.remove(work, collectives.Work, "work")


# ---- registration ------------------------------------------------------------------------

def _fail(lib, name, err):
    lib._pb_set_error(f"{name}: {err}".encode("utf-8", "replace")[:4000])
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
    ffi = embedding_ffi
    for name, fn in list(globals().items()):
        if name.startswith("pb_") and callable(fn):
            _export(lib, name, fn)
