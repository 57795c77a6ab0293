"""C ABI functions for the gradient reducer (pybridge.reducer) and parameter broadcast.

Conversion only: the bucketing, hooks and reduction live in pybridge/reducer.py.
"""

from .. import abi, capi, comm_hooks, dtypes, gossip
from .. import reducer as _reducer
from ..buffers import CPU
from ..errors import InvalidArgument
from . import handles, live_group, put, tensor

ALLOW_UNUSED, NO_REBUILD = abi.PB_REDUCER_ALLOW_UNUSED, abi.PB_REDUCER_NO_REBUILD


class CReducer:
    """A Reducer plus the bucket memory of superseded layouts: C callers hold raw pointers
    into the buckets, so memory they may still point at is kept until pb_reducer_free
    (the buckets are rebuilt at most once, so this is bounded by one extra copy)."""

    def __init__(self, reducer):
        self.reducer = reducer
        self.retired = []
        self.hook_state = None  # a GossipState owns a thread and groups: closed with the reducer

    def set_hook_state(self, state):
        self.close_hook_state()
        self.hook_state = state

    def close_hook_state(self):
        state, self.hook_state = self.hook_state, None
        if state is not None:
            state.close()


def _get(ptr):
    return handles.get(ptr, CReducer, "reducer")


def _describe(out, view):
    out.data = capi.ffi.cast("void *", view.data_ptr())
    out.count = view.numel()
    out.dtype = dtypes.code(view.dtype)
    out.device = view.device.index if view.device.type == "cuda" else CPU


def pb_reducer_new(group, nparams, counts, dtype_codes, bucket_cap_mb, op, compression, flags, out):
    ffi = capi.ffi
    g = live_group(group)
    if out == ffi.NULL:
        raise InvalidArgument("out (the pointer to store the reducer handle in) is NULL")
    if nparams < 0:
        raise InvalidArgument(f"nparams must be >= 0, got {nparams}")
    if nparams and (counts == ffi.NULL or dtype_codes == ffi.NULL):
        raise InvalidArgument(f"{'counts' if counts == ffi.NULL else 'dtypes'} is NULL "
                              f"with nparams = {nparams}")
    if flags & ~(ALLOW_UNUSED | NO_REBUILD):
        raise InvalidArgument(f"unknown reducer flags 0x{flags:x}; valid: PB_REDUCER_ALLOW_UNUSED (1), "
                              "PB_REDUCER_NO_REBUILD (2)")
    specs = []
    for i in range(nparams):
        n = int(counts[i])
        if n < 0:
            raise InvalidArgument(f"counts[{i}] is negative ({n})")
        specs.append((n, int(dtype_codes[i])))
    cap = None if bucket_cap_mb <= 0 else bucket_cap_mb  # <= 0: the default; NaN is checked there
    r = _reducer.Reducer(specs, group=g, bucket_cap_mb=cap, op=op, compression=compression,
                         rebuild=not flags & NO_REBUILD, allow_unused=bool(flags & ALLOW_UNUSED))
    handles.add(CReducer(r), "pb_reducer *", out)


def pb_reducer_grad(reducer, index, out):
    view = _get(reducer).reducer.grad(index)
    if out == capi.ffi.NULL:
        raise InvalidArgument("out descriptor is NULL")
    _describe(out, view)


def pb_reducer_grads(reducer, n, out):
    r = _get(reducer).reducer
    views = r.grads()
    if n != len(views):
        raise InvalidArgument(f"n is {n} but the reducer has {len(views)} gradients")
    if n and out == capi.ffi.NULL:
        raise InvalidArgument("out (the descriptor array) is NULL")
    for i, view in enumerate(views):
        _describe(out + i, view)


def pb_reducer_generation(reducer, out):
    r = _get(reducer).reducer
    r.grads()  # raises Closed for a closed reducer
    put(out, r.generation)


def pb_reducer_mark_ready(reducer, index):
    _get(reducer).reducer.mark_ready(index)


def pb_reducer_wait(reducer, timeout):
    c = _get(reducer)
    r = c.reducer
    before, flats = r.generation, [b.flat for b in r.buckets]
    try:
        r.finalize(None if timeout <= 0 else timeout)  # NaN is checked there
    finally:
        if r.generation != before:
            c.retired.extend(flats)


def pb_reducer_set_hook(reducer, hook, rank, flags):
    r = _get(reducer).reducer
    if flags & ~abi.PB_HOOK_NO_WARM_START:
        raise InvalidArgument(f"unknown hook flags 0x{flags:x}; valid: PB_HOOK_NO_WARM_START (1)")
    state, fn = comm_hooks.builtin(hook, r.group, rank=rank,
                                   warm_start=not flags & abi.PB_HOOK_NO_WARM_START)
    r.register_comm_hook(state, fn)
    _get(reducer).set_hook_state(None)


_TOPOLOGIES = {abi.PB_GOSSIP_CUBE: "cube", abi.PB_GOSSIP_DISSEMINATION: "dissemination"}


def pb_reducer_set_gossip(reducer, topology, ranks_per_node, seed, sync_every):
    c = _get(reducer)
    if topology not in _TOPOLOGIES:
        raise InvalidArgument(f"unknown gossip topology {topology}; use PB_GOSSIP_CUBE (0) or "
                              "PB_GOSSIP_DISSEMINATION (1)")
    state = gossip.GossipState(c.reducer.group, topology=_TOPOLOGIES[topology],
                               ranks_per_node=ranks_per_node, seed=seed, sync_every=sync_every)
    c.reducer.register_comm_hook(state, gossip.gossip_hook)
    c.set_hook_state(state)


def pb_reducer_set_shapes(reducer, nparams, ndims, dims):
    r = _get(reducer).reducer
    if nparams != r.num_params:
        raise InvalidArgument(f"nparams is {nparams} but the reducer has {r.num_params} gradients")
    if nparams and (ndims == capi.ffi.NULL or dims == capi.ffi.NULL):
        raise InvalidArgument(f"{'ndims' if ndims == capi.ffi.NULL else 'dims'} is NULL")
    shapes, at = [], 0
    for i in range(nparams):
        k = int(ndims[i])
        if k < 0:
            raise InvalidArgument(f"ndims[{i}] is negative ({k})")
        shapes.append(tuple(int(dims[at + j]) for j in range(k)) if k else None)
        at += k
    r.set_shapes(shapes)


def pb_reducer_zero(reducer):
    _get(reducer).reducer.zero_grad()


def pb_reducer_free(reducer):
    c = handles.remove(reducer, CReducer, "reducer")
    c.reducer.close()
    c.close_hook_state()
    c.retired = []


def pb_broadcast_params(group, n, tensors, root):
    g = live_group(group)
    if n < 0:
        raise InvalidArgument(f"n must be >= 0, got {n}")
    if n and tensors == capi.ffi.NULL:
        raise InvalidArgument(f"tensors is NULL with n = {n}")
    ts = [tensor(tensors + i, f"tensors[{i}]") for i in range(n)]
    _reducer.broadcast_parameters(ts, root, group=g)
