"""C ABI functions for the gradient reducer (pybridge.ddp.reducer) and parameter broadcast.

Conversion only: the bucketing, hooks, their states and the cross-rank check live in
pybridge/ddp/ (reducer.py and its settings, layout and dispatch modules) and
pybridge/algorithms/comm_hooks.py. What stays here is C's concern: memory of superseded
bucket layouts that C callers may still point at.
"""

import math

from .. import abi, capi
from ..base import dtypes
from ..algorithms import comm_hooks
from ..ddp import reducer as _reducer
from ..ddp import settings as _settings
from ..base.buffers import CPU
from ..base.checks import integer
from ..errors import InvalidArgument
from ..ddp.attach import Attachment
from . import handles, live_group, options, put, tensor, torch_param

# pb_reducer_options: each field and the default pb_reducer_options_init gives it, in
# struct order. A field that ends past the caller's `size` takes its default.
_DEFAULTS = {"op": abi.PB_AVG, "bucket_cap_mb": 0.0, "first_bucket_cap_mb": 0.0, "flags": 0,
             "hook": abi.PB_HOOK_ALLREDUCE, "hook_rank": 1, "hook_flags": 0,
             "gossip_topology": abi.PB_GOSSIP_NONE, "gossip_ranks_per_node": 0, "gossip_seed": 0,
             "gossip_sync_every": 0, "hook_start_iter": 2, "ndims": None, "dims": None,
             "hook_ranks_per_node": 0, "hook_name": None}


class CReducer:
    """A Reducer plus the bucket memory of superseded layouts: C callers hold raw pointers
    into the buckets, so memory they may still point at is kept until pb_reducer_close
    (the buckets are rebuilt at most once, so this is bounded by one extra copy). The
    hook's state belongs to the Reducer, which closes it."""

    def __init__(self, reducer, attachment=None):
        self.reducer = reducer
        self.attachment = attachment  # pb_reducer_attach: autograd's hooks drive the reducer
        self.retired = []

    def manual(self, call):
        """The reducer, for a call that drives it by hand: refused when autograd drives it."""
        if self.attachment is not None:
            raise InvalidArgument(f"{call} on a reducer from pb_reducer_attach: libtorch's backward marks and "
                                  "reduces the gradients itself")
        return self.reducer


def _get(ptr):
    return handles.get(ptr, CReducer, "reducer")


def _describe(out, view):
    out.data = capi.ffi.cast("void *", view.data_ptr())
    out.count = view.numel()
    out.dtype = dtypes.code(view.dtype)
    out.device = view.device.index if view.device.type == "cuda" else CPU


def _options(ptr):
    """The fields of a pb_reducer_options (NULL: defaults), honouring the caller's size."""
    got = options.read(ptr, "pb_reducer_options", _DEFAULTS)
    for name in ("ndims", "dims"):
        if got[name] is not None and got[name] == capi.ffi.NULL:
            got[name] = None
    return got


def _specs(nparams, counts, dtype_codes, ndims=None, dims=None):
    """(count or shape, dtype) per gradient; shapes from ndims/dims must hold counts[i]."""
    ffi = capi.ffi
    integer("nparams", nparams, low=0)
    if nparams and (counts == ffi.NULL or dtype_codes == ffi.NULL):
        raise InvalidArgument(f"{'counts' if counts == ffi.NULL else 'dtypes'} is NULL "
                              f"with nparams = {nparams}")
    if (ndims is None) != (dims is None):
        raise InvalidArgument(f"pb_reducer_options.{'dims' if dims is None else 'ndims'} is NULL; "
                              "give both ndims and dims, or neither")
    specs, at = [], 0
    for i in range(nparams):
        n = int(counts[i])
        if n < 0:
            raise InvalidArgument(f"counts[{i}] is negative ({n})")
        size = n
        if ndims is not None:
            shape, at = _shape(i, ndims, dims, at)
            if shape is not None:
                if math.prod(shape) != n:
                    raise InvalidArgument(f"parameter {i}: shape {shape} holds {math.prod(shape)} "
                                          f"elements, counts[{i}] is {n}")
                size = shape
        specs.append((size, int(dtype_codes[i])))
    return specs


def _shape(i, ndims, dims, at):
    """(gradient i's shape or None for flat, the next index into dims)."""
    k = int(ndims[i])
    if k < 0:
        raise InvalidArgument(f"ndims[{i}] is negative ({k})")
    return (tuple(int(dims[at + j]) for j in range(k)) if k else None), at + k


def _hook(o):
    """The hook the options choose: by name (a registered hook, or a built-in taking the
    hook_* settings), else by code (ddp.settings.hook_of checks them)."""
    name = options.name(o["hook_name"], "pb_reducer_options.hook_name")
    if name is not None:
        if o["hook"] != _DEFAULTS["hook"] or o["gossip_topology"] != _DEFAULTS["gossip_topology"]:
            raise InvalidArgument(f"pb_reducer_options.hook_name is {name!r} but hook or gossip_topology is set "
                                  "too; choose the hook one way")
        spec = comm_hooks.by_name(name)
        if isinstance(spec, comm_hooks.NamedHook):
            return spec
        o = dict(o, hook=spec.code)
    return _settings.hook_of(o["hook"], rank=o["hook_rank"], flags=o["hook_flags"], start_iter=o["hook_start_iter"],
                             ranks_per_node=o["hook_ranks_per_node"], topology=o["gossip_topology"],
                             gossip_ranks_per_node=o["gossip_ranks_per_node"], seed=o["gossip_seed"],
                             sync_every=o["gossip_sync_every"])


def _build(g, params, o, cap_mb, attach=False):
    """The core Reducer over `params` (specs or tensors) with the options' settings, and
    whether the parameters' .grad become bucket views (pb_reducer_attach)."""
    keywords, bucket_view = _settings.flag_keywords(o["flags"], attach)
    first = o["first_bucket_cap_mb"]
    r = _reducer.Reducer(params, group=g, bucket_cap_mb=cap_mb, first_bucket_cap_mb=None if first == 0 else first,
                         op=o["op"], hook=_hook(o), **keywords)
    return r, bucket_view


def _create(group, nparams, counts, dtype_codes, o, out, cap_mb):
    """pb_reducer_create and pb_reducer_new: one path to one core call."""
    g = live_group(group)
    if out == capi.ffi.NULL:
        raise InvalidArgument("out (the pointer to store the reducer handle in) is NULL")
    specs = _specs(nparams, counts, dtype_codes, o["ndims"], o["dims"])
    handles.add(CReducer(_build(g, specs, o, cap_mb)[0]), "pb_reducer *", out)


def pb_reducer_attach(group, n, params, options, out):
    g = live_group(group)
    integer("n", n, low=0)
    if n and params == capi.ffi.NULL:
        raise InvalidArgument(f"params is NULL with n = {n}")
    if out == capi.ffi.NULL:
        raise InvalidArgument("out (the pointer to store the reducer handle in) is NULL")
    o = _options(options)
    if o["ndims"] is not None:
        raise InvalidArgument("pb_reducer_options.ndims/dims: pb_reducer_attach reads each parameter's shape "
                              "from libtorch; leave them NULL")
    ts = [torch_param(params + i, f"params[{i}]") for i in range(n)]
    cap = o["bucket_cap_mb"]
    r, bucket_view = _build(g, ts, o, None if cap == 0 else cap, attach=True)
    try:
        a = Attachment(r, ts, bucket_view=bucket_view)
    except BaseException:
        r.close()
        raise
    handles.add(CReducer(r, a), "pb_reducer *", out)


def pb_reducer_create(group, nparams, counts, dtype_codes, options, out):
    o = _options(options)
    cap = o["bucket_cap_mb"]
    _create(group, nparams, counts, dtype_codes, o, out, None if cap == 0 else cap)  # < 0, NaN: refused there


def pb_reducer_new(group, nparams, counts, dtype_codes, bucket_cap_mb, op, compression, flags, out):
    o = dict(_DEFAULTS, op=op, hook=_settings.compression_hook(compression), flags=flags)
    cap = None if bucket_cap_mb <= 0 else bucket_cap_mb  # <= 0: the default here; NaN is checked there
    _create(group, nparams, counts, dtype_codes, o, out, cap)


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
    _get(reducer).manual("pb_reducer_mark_ready").mark_ready(index)


def pb_reducer_wait(reducer, timeout):
    c = _get(reducer)
    r = c.reducer
    if c.attachment is not None:  # backward finished the reduction; say how it went
        err = c.attachment.take_error()
        if err is not None:
            raise err  # first: an elastic world's change closes the reducer's group with it
        r.grads()  # raises Closed for a closed reducer
        return
    before, flats = r.generation, [b.flat for b in r.buckets]
    try:
        r.wait(None if timeout <= 0 else timeout)  # NaN is checked there
    finally:
        if r.generation != before:
            c.retired.extend(flats)


def pb_reducer_poll(reducer, timeout, done):
    c = _get(reducer)
    r = c.reducer
    if done == capi.ffi.NULL:
        raise InvalidArgument("done is NULL")
    if c.attachment is not None:  # backward finished the reduction: as pb_reducer_wait
        pb_reducer_wait(reducer, 0.0)
        put(done, 1, "done")
        return
    before, flats = r.generation, [b.flat for b in r.buckets]
    try:
        put(done, 1 if r.poll(timeout) else 0, "done")  # a negative or NaN timeout is refused there
    finally:
        if r.generation != before:
            c.retired.extend(flats)


def pb_reducer_join(reducer, root, shadowed):
    c = _get(reducer)
    r = c.reducer
    before, flats = r.generation, [b.flat for b in r.buckets]
    try:
        got_root, got_shadowed = r.join()
    finally:
        if r.generation != before:  # a rank that joined before its first wait rebuilds here
            c.retired.extend(flats)
    if root != capi.ffi.NULL:
        put(root, got_root)
    if shadowed != capi.ffi.NULL:
        put(shadowed, got_shadowed)


def pb_reducer_set_hook(reducer, hook, rank, flags):
    r = _get(reducer).reducer
    spec = _hook(dict(_DEFAULTS, hook=hook, hook_rank=rank, hook_flags=flags))
    r.register_comm_hook(*spec.build(r.group))


def pb_reducer_set_gossip(reducer, topology, ranks_per_node, seed, sync_every):
    r = _get(reducer).reducer
    if topology == abi.PB_GOSSIP_NONE:
        raise InvalidArgument("pb_reducer_set_gossip needs a gossip topology, got PB_GOSSIP_NONE; choose a hook "
                              "with pb_reducer_set_hook instead")
    spec = _hook(dict(_DEFAULTS, gossip_topology=topology, gossip_ranks_per_node=ranks_per_node,
                      gossip_seed=seed, gossip_sync_every=sync_every))
    r.register_comm_hook(*spec.build(r.group))


def pb_reducer_set_shapes(reducer, nparams, ndims, dims):
    ffi = capi.ffi
    r = _get(reducer).reducer
    if nparams != r.num_params:
        raise InvalidArgument(f"nparams is {nparams} but the reducer has {r.num_params} gradients")
    if nparams and (ndims == ffi.NULL or dims == ffi.NULL):
        raise InvalidArgument(f"{'ndims' if ndims == ffi.NULL else 'dims'} is NULL")
    shapes, at = [], 0
    for i in range(nparams):
        shape, at = _shape(i, ndims, dims, at)
        shapes.append(shape)
    r.set_shapes(shapes)


def pb_reducer_bind_grads(reducer, n, grads):
    r = _get(reducer).manual("pb_reducer_bind_grads")
    if n == 0:
        r.bind_grads(None)
        return
    if n != r.num_params:
        raise InvalidArgument(f"n is {n} but the reducer has {r.num_params} gradients (0 unbinds)")
    if grads == capi.ffi.NULL:
        raise InvalidArgument(f"grads is NULL with n = {n}")
    r.bind_grads([tensor(grads + i, f"grads[{i}]") for i in range(n)])


def pb_reducer_zero(reducer):
    _get(reducer).reducer.zero_grad()


def pb_reducer_close(reducer):
    c = handles.remove(reducer, CReducer, "reducer")
    if c.attachment is not None:
        c.attachment.close()  # hooks removed; bucket views become the parameters' own
    c.reducer.close()  # closes the hook's state too
    c.retired = []


pb_reducer_free = pb_reducer_close  # Deprecated in the header: the one destructor is named _close
