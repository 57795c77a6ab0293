"""C ABI functions for process groups, collectives, library-owned buffers and async work."""

import torch

from .. import abi, capi
from ..comm import cancel as _cancel
from ..comm import collectives, params
from ..base import dtypes, jobenv
from ..comm import group as _group
from ..comm import world as _world
from ..base.buffers import CPU, check_extent
from ..base.checks import integer
from ..errors import InvalidArgument, PyBridgeError
from . import descriptor_key, ffi_bytes, handles, live_group, put, tensor, text


class Buffer:
    """Library-owned memory that asynchronous operations may use after a call returns."""

    def __init__(self, dtype, count, device):
        want = check_extent(count, dtype, device)
        dev = torch.device("cpu") if device == CPU else torch.device("cuda", device)
        self.tensor = torch.zeros(count, dtype=want, device=dev)
        self.device = device


def _buffer(ptr, what="buffer"):
    return handles.get(ptr, Buffer, what).tensor


# ---- process group -----------------------------------------------------------------

def pb_init(init_method, backend, rank, world_size, local_rank, timeout, out):
    pb_init_v2(init_method, backend, rank, world_size, local_rank, timeout, 0, 0.0, out)


def pb_init_v2(init_method, backend, rank, world_size, local_rank, timeout, flags, watchdog, out):
    if out == capi.ffi.NULL:
        raise InvalidArgument("out (the pointer to store the group handle in) is NULL")
    if flags & ~abi.PB_INIT_CHECKED:
        raise InvalidArgument(f"unknown flags {flags:#x}; valid: PB_INIT_CHECKED")
    if watchdog != watchdog:
        raise InvalidArgument("watchdog_seconds is NaN")
    g = _world.init(init_method=text(init_method), backend=text(backend), rank=rank,
                    world_size=world_size, local_rank=local_rank,
                    timeout=_world.DEFAULT_TIMEOUT if timeout <= 0 else timeout,  # NaN is checked there
                    checked=True if flags & abi.PB_INIT_CHECKED else None,
                    watchdog=None if watchdog == 0 else (False if watchdog < 0 else watchdog))
    handles.add(g, "pb_group *", out)


def pb_finalize(group):
    g = handles.get(group, _group.Group, "group")
    if g.parent is not None:
        raise InvalidArgument("pb_finalize takes the world group; close a subgroup with pb_group_close")
    _prepared.clear()
    if not g.closed:
        _world.finalize()


def pb_rank(group, out):
    put(out, live_group(group).rank)


def pb_size(group, out):
    put(out, live_group(group).size)


def pb_local_rank(group, out):
    put(out, live_group(group).local_rank)


def pb_job_env(rank, world_size, local_rank, local_world_size, master_addr, master_addr_size, master_port):
    job = jobenv.placed()
    put(rank, job.rank, "rank")
    put(world_size, job.world_size, "world_size")
    put(local_rank, job.local_rank, "local_rank")
    put(local_world_size, -1 if job.local_world_size is None else job.local_world_size, "local_world_size")
    put(master_port, -1 if job.master_port is None else job.master_port, "master_port")
    ffi_bytes(master_addr, master_addr_size, (job.master_addr or "").encode(), "master_addr")


def pb_group_abort(group, reason):
    handles.get(group, _group.Group, "group").abort(text(reason))


def pb_init_abort(reason):
    _cancel.abort(text(reason))


def pb_device(group, out):
    dev = live_group(group).device
    put(out, dev.index if dev.type == "cuda" else CPU)


def pb_barrier(group):
    collectives.barrier(group=live_group(group))


# ---- synchronous collectives ---------------------------------------------------------

# Broadcast and all_reduce prepared once per (group, buffer, op or root): a Go or C
# training loop passes the same buffers every step, and checking and wrapping them anew
# cost more than the rest of the call into torch. A bad argument raises before anything
# is remembered. Cleared when full and on pb_finalize.
_prepared = {}
_MAX_PREPARED = 256


def _prepared_call(prepare, group, t, arg):
    """prepare(tensor, arg, group=...) for descriptor t, remembered per (prepare, group,
    descriptor, arg); a libtorch handle is read anew each time (the program may free its
    tensor and make another at the same address)."""
    fields = descriptor_key(t)
    if fields is None:
        return prepare(tensor(t), arg, group=live_group(group))
    key = (prepare, group, *fields, arg)
    run = _prepared.get(key)
    if run is None:
        if len(_prepared) >= _MAX_PREPARED:
            _prepared.clear()
        run = _prepared[key] = prepare(tensor(t), arg, group=live_group(group))
    return run


def pb_broadcast(group, t, root):
    _prepared_call(collectives.prepare_broadcast, group, t, root)()


def pb_all_reduce(group, t, op):
    _prepared_call(collectives.prepare_all_reduce, group, t, op)()


def pb_all_gather(group, inp, out):
    collectives.all_gather(tensor(inp, "input"), tensor(out, "output"), group=live_group(group))


def pb_reduce_scatter(group, inp, out, op):
    collectives.reduce_scatter(tensor(inp, "input"), tensor(out, "output"), op, group=live_group(group))


def pb_send(group, t, dst, tag):
    collectives.send(tensor(t), dst, tag, group=live_group(group))


def pb_recv(group, t, src, tag):
    collectives.recv(tensor(t), src, tag, group=live_group(group))


# ---- buffers -------------------------------------------------------------------------

def pb_buffer_new(dtype, count, device, out):
    if out == capi.ffi.NULL:
        raise InvalidArgument("out (the pointer to store the buffer handle in) is NULL")
    handles.add(Buffer(dtype, count, device), "pb_buffer *", out)


def pb_buffer_tensor(buffer, out):
    b = handles.get(buffer, Buffer, "buffer")
    if out == capi.ffi.NULL:
        raise InvalidArgument("out descriptor is NULL")
    out.data = capi.ffi.cast("void *", b.tensor.data_ptr())
    out.count = b.tensor.numel()
    out.dtype = dtypes.code(b.tensor.dtype)
    out.device = b.device


def pb_buffer_close(buffer):
    handles.remove(buffer, Buffer, "buffer")


pb_buffer_free = pb_buffer_close  # deprecated name (pybridge.h), the same function


# ---- asynchronous operations --------------------------------------------------------------

def pb_broadcast_async(group, buffer, root, work):
    _start(work, collectives.broadcast(_buffer(buffer), root, group=live_group(group), async_op=True))


def pb_all_reduce_async(group, buffer, op, work):
    _start(work, collectives.all_reduce(_buffer(buffer), op, group=live_group(group), async_op=True))


def pb_all_gather_async(group, inp, out, work):
    _start(work, collectives.all_gather(_buffer(inp, "input"), _buffer(out, "output"),
                                        group=live_group(group), async_op=True))


def pb_reduce_scatter_async(group, inp, out, op, work):
    _start(work, collectives.reduce_scatter(_buffer(inp, "input"), _buffer(out, "output"), op,
                                            group=live_group(group), async_op=True))


def pb_isend(group, buffer, dst, tag, work):
    _start(work, collectives.isend(_buffer(buffer), dst, tag, group=live_group(group)))


def pb_irecv(group, buffer, src, tag, work):
    _start(work, collectives.irecv(_buffer(buffer), src, tag, group=live_group(group)))


# ---- asynchronous operations on caller-owned memory ------------------------------------------

def pb_all_reduce_tensor_async(group, t, op, work):
    _start(work, collectives.all_reduce(tensor(t), op, group=live_group(group), async_op=True))


def pb_broadcast_tensor_async(group, t, root, work):
    _start(work, collectives.broadcast(tensor(t), root, group=live_group(group), async_op=True))


def pb_all_gather_tensor_async(group, inp, out, work):
    _start(work, collectives.all_gather(tensor(inp, "input"), tensor(out, "output"),
                                        group=live_group(group), async_op=True))


def pb_reduce_scatter_tensor_async(group, inp, out, op, work):
    _start(work, collectives.reduce_scatter(tensor(inp, "input"), tensor(out, "output"), op,
                                            group=live_group(group), async_op=True))


def pb_isend_tensor(group, t, dst, tag, work):
    _start(work, collectives.isend(tensor(t), dst, tag, group=live_group(group)))


def pb_irecv_tensor(group, t, src, tag, work):
    _start(work, collectives.irecv(tensor(t), src, tag, group=live_group(group)))


def _start(out, w):
    # Checked after starting: a NULL here is a caller bug, but the operation is already
    # matched with the peers, so it is waited for rather than left dangling.
    if out == capi.ffi.NULL:
        w.wait()
        raise InvalidArgument("work (the pointer to store the work handle in) is NULL")
    handles.add(w, "pb_work *", out, "work")


def pb_work_wait(work, timeout):
    handles.get(work, collectives.Work, "work").wait(None if timeout <= 0 else timeout)  # NaN is checked there


def pb_work_test(work, done):
    w = handles.get(work, collectives.Work, "work")
    if done == capi.ffi.NULL:
        raise InvalidArgument("done is NULL")
    try:
        done[0] = int(w.test())
    except PyBridgeError:
        done[0] = 1  # finished, with the error returned as the status
        raise


def pb_work_close(work):
    handles.remove(work, collectives.Work, "work")


pb_work_free = pb_work_close  # deprecated name (pybridge.h), the same function


def pb_broadcast_params(group, n, tensors, root):
    g = live_group(group)
    integer("n", n, low=0)
    if n and tensors == capi.ffi.NULL:
        raise InvalidArgument(f"tensors is NULL with n = {n}")
    ts = [tensor(tensors + i, f"tensors[{i}]") for i in range(n)]
    params.broadcast_parameters(ts, root, group=g)
