"""Bucket communication hooks, with torch's DDP comm-hook contract.

A hook is `hook(state, bucket) -> torch.futures.Future` whose value is the communicated
bucket (a tensor of the bucket's size, or a one-element list of it, as torch's allreduce
futures give). The reducer owns gradient readiness, launch order and bucket rebuilds; it
calls the hook once per full bucket, in bucket order, and when the future is done copies its
value into the bucket (unless the hook wrote the bucket's buffer itself). So torch's own
hooks (torch.distributed.algorithms.ddp_comm_hooks: allreduce_hook, fp16_compress_hook,
bf16_compress_hook, powerSGD_hook) run unmodified on pybridge's reducer, and pybridge's
hooks run on torch's DDP.

The bucket (GradBucket) offers what torch's GradBucket does: buffer(), index(), is_last(),
gradients(), parameters(), set_buffer().

Built-in hooks (also selected by code from C and Go: builtin(), BuiltinHook):
  allreduce_hook      sum (the reducer folds the 1/size of 'avg' into the gradient copy)
  fp16_compress_hook  float32 buckets travel as float16, decompressed into the bucket
  bf16_compress_hook  likewise as bfloat16
  powersgd_hook(...)  torch's PowerSGD with its state, for C and Go callers
  hierarchical_hook   sum within the node, allreduce among node leaders, broadcast in the
                      node (pybridge.hierarchical; HierarchicalHook chooses it by settings)
GossipGraD (pybridge.gossip) is chosen by its settings with GossipHook.

Every rank must use the same hook: the reducer compares identity(state, hook) across
ranks. Adding a built-in hook: docs/comm-hooks.md, "Adding a built-in hook".
"""

import functools
import warnings

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as _torch_hooks

from . import abi
from . import collectives
from .checks import integer
from .hierarchical import HierarchicalState, hierarchical_hook

HOOK_ALLREDUCE = abi.PB_HOOK_ALLREDUCE
HOOK_FP16 = abi.PB_HOOK_FP16
HOOK_BF16 = abi.PB_HOOK_BF16
HOOK_POWERSGD = abi.PB_HOOK_POWERSGD
HOOK_HIERARCHICAL = abi.PB_HOOK_HIERARCHICAL


class GradBucket:
    """One full bucket, as a hook sees it (torch.distributed.GradBucket's methods)."""

    __slots__ = ("_index", "_buffer", "_grads", "_params", "_last", "scale")

    def __init__(self, index, buffer, grads, params, last, scale=None):
        self._index = index
        self._buffer = buffer
        self._grads = grads
        self._params = params
        self._last = last
        # pybridge's own hooks only: a factor the reducer left for the hook to fold into its
        # first pass over the buffer (the 1/size of 'avg'), or None.
        self.scale = scale

    def index(self):
        return self._index

    def buffer(self):
        """The bucket's flat gradients (one dtype, one device)."""
        return self._buffer

    def set_buffer(self, tensor):
        self._buffer = tensor

    def is_last(self):
        """True for the last bucket of the iteration (hooks that count steps use it)."""
        return self._last

    def gradients(self):
        """Each parameter's gradient: views into buffer(), in the bucket's layout order."""
        return list(self._grads)

    def parameters(self):
        if self._params is None:
            from .errors import InvalidArgument
            raise InvalidArgument("this reducer was built from parameter specs (C, Go), not tensors: "
                                  "bucket.parameters() is unknown; use gradients()")
        return list(self._params)


class HookContext:
    """The `state` of pybridge's built-in hooks: the group, and wire buffers per bucket.
    The wire type belongs to the hook (fp16_compress_hook sends float16 whatever the
    state says), as in torch."""

    def __init__(self, group, dtype=None):
        if dtype is not None:
            warnings.warn("HookContext(dtype=...) is ignored: the wire type is bound in the hook "
                          "(fp16_compress_hook, bf16_compress_hook); use HookContext(group)",
                          DeprecationWarning, stacklevel=2)
        self.group = group
        self._scratch = {}

    def scratch(self, index, like, dtype=None):
        """A reusable wire buffer of `dtype` (default: like's) for bucket `index`
        (allocated once per layout)."""
        dtype = like.dtype if dtype is None else dtype
        buf = self._scratch.get(index)
        if buf is None or buf.numel() != like.numel() or buf.device != like.device or buf.dtype != dtype:
            buf = self._scratch[index] = torch.empty(like.numel(), dtype=dtype, device=like.device)
        return buf


def allreduce_hook(ctx, bucket):
    """Sum the bucket over the group (after applying the reducer's pending scale)."""
    buf = bucket.buffer()
    if bucket.scale is not None:
        buf.mul_(bucket.scale)
    return collectives.all_reduce_future(buf, collectives.SUM, group=ctx.group)


def _compress(dtype, ctx, bucket):
    buf = bucket.buffer()
    if buf.dtype != torch.float32:  # only float32 buckets are compressed
        return allreduce_hook(ctx, bucket)
    wire = ctx.scratch(bucket.index(), buf, dtype)
    if bucket.scale is not None:
        # Scaled in float32 first (no overflow), then converted: two vectorised passes,
        # 3.8x faster on CPU than torch.mul(buf, scale, out=wire), whose mixed-dtype
        # output takes a slow path (7.1 against 1.8 ms for 6.3M floats, one thread).
        buf.mul_(bucket.scale)
    wire.copy_(buf)

    def decompress(fut):
        # In the future's callback, as torch's hook does: an early bucket is decompressed
        # while backward still runs, not at finalize.
        return buf.copy_(fut.value()[0])
    return collectives.all_reduce_future(wire, collectives.SUM, group=ctx.group).then(decompress)


def fp16_compress_hook(ctx, bucket):
    """float32 buckets travel as float16 (the type is the hook's, as in torch)."""
    return _compress(torch.float16, ctx, bucket)


def bf16_compress_hook(ctx, bucket):
    """float32 buckets travel as bfloat16."""
    return _compress(torch.bfloat16, ctx, bucket)


def prescales(hook):
    """Does `hook` sum what it is given (so the reducer may pre-divide for 'avg')?"""
    return (hook is allreduce_hook or hook is fp16_compress_hook or hook is bf16_compress_hook
            or hook is hierarchical_hook)


# hierarchical_hook: its collectives run on the state's threads, in the order it is called.
_EAGER = {allreduce_hook, fp16_compress_hook, bf16_compress_hook, hierarchical_hook, _torch_hooks.allreduce_hook, _torch_hooks.fp16_compress_hook,
          _torch_hooks.bf16_compress_hook}


def declare_eager(hook):
    """Declare that `hook` issues all of its collectives before it returns, none from its
    future's callbacks (as torch's allreduce and fp16/bf16 hooks do). The reducer then
    starts each bucket's hook as soon as the bucket is ready, so buckets travel
    concurrently. Any other hook starts once the previous bucket's future is done:
    collectives issued from callbacks (PowerSGD's) could otherwise go out in another order
    on each rank. Returns `hook` (usable as a decorator)."""
    _EAGER.add(hook)
    return hook


def is_eager(hook):
    try:
        return hook in _EAGER
    except TypeError:  # an unhashable callable: not declared
        return False


def powersgd_state(group, rank=1, warm_start=True, start_iter=2, seed=0):
    """torch's PowerSGDState for a pybridge group (None: a state that is only described,
    never run). `start_iter`: iterations of plain allreduce before compression starts
    (torch's start_powerSGD_iter; at least 2, as torch requires when error feedback is
    on); `rank`: the matrix approximation rank."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    for name, v, low in (("PowerSGD rank", rank, 1), ("PowerSGD start iteration", start_iter, 2)):
        integer(name, v, low=low, expected=f"an integer >= {low}")
    return psgd.PowerSGDState(process_group=None if group is None else group.pg,
                              matrix_approximation_rank=rank, start_powerSGD_iter=start_iter,
                              warm_start=bool(warm_start), random_seed=seed)


def powersgd_hook(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    return psgd.powerSGD_hook(state, bucket)


def builtin(code, group, *, rank=1, warm_start=True, start_iter=2, seed=0, ranks_per_node=0,
            compression=None):
    """(state, hook) for a hook code of the C ABI (PB_HOOK_*). group None: a state that is
    only described (its identity), never run."""
    from .errors import InvalidArgument
    if isinstance(code, bool):
        code = None  # True is not PB_HOOK_FP16
    if code == HOOK_ALLREDUCE:
        return HookContext(group), allreduce_hook
    if code == HOOK_FP16:
        return HookContext(group), fp16_compress_hook
    if code == HOOK_BF16:
        return HookContext(group), bf16_compress_hook
    if code == HOOK_POWERSGD:
        return powersgd_state(group, rank, warm_start, start_iter, seed), powersgd_hook
    if code == HOOK_HIERARCHICAL:
        how = {"ranks_per_node": ranks_per_node, "compression": compression}
        state = HierarchicalState.described(**how) if group is None else HierarchicalState(group, **how)
        return state, hierarchical_hook
    raise InvalidArgument(f"unknown hook code {code!r}; use PB_HOOK_ALLREDUCE (0), PB_HOOK_FP16 (1), "
                          "PB_HOOK_BF16 (2), PB_HOOK_POWERSGD (3) or PB_HOOK_HIERARCHICAL (4)")


# ---- hooks chosen by settings (C, Go, the reducer's compression= and hook=) -------------
#
# A reducer must be configured alike on every rank. A built-in hook chosen by settings is
# compared across ranks before it is built: building the gossip state is itself a
# collective (it creates groups), which ranks with other settings would leave hanging.


class BuiltinHook:
    """A built-in hook by code (PB_HOOK_*): `Reducer(..., hook=BuiltinHook(HOOK_POWERSGD,
    rank=2))`. Other codes ignore the PowerSGD settings (rank, warm_start, start_iter,
    seed) and the hierarchical ones (ranks_per_node, compression)."""

    def __init__(self, code=HOOK_ALLREDUCE, *, rank=1, warm_start=True, start_iter=2, seed=0, ranks_per_node=0,
                 compression=None):
        self.code, self.rank, self.warm_start, self.start_iter, self.seed = code, rank, warm_start, start_iter, seed
        self.ranks_per_node, self.compression = ranks_per_node, compression
        self._identity = identity(*self.build(None))  # checks the settings, here and now

    def identity(self):
        return self._identity

    def build(self, group):
        """(state, hook) over `group`."""
        return builtin(self.code, group, rank=self.rank, warm_start=self.warm_start,
                       start_iter=self.start_iter, seed=self.seed, ranks_per_node=self.ranks_per_node,
                       compression=self.compression)

    def __repr__(self):
        return f"BuiltinHook({self._identity})"


class HierarchicalHook(BuiltinHook):
    """Hierarchical allreduce (pybridge.hierarchical) by its settings:
    `Reducer(..., hook=HierarchicalHook(ranks_per_node=2))`, the same hook as
    BuiltinHook(HOOK_HIERARCHICAL, ...). ranks_per_node 0: the launcher's LOCAL_WORLD_SIZE;
    compression 'fp16' or 'bf16': float32 buckets travel as that type. Building it creates
    groups (a collective), after every rank agreed on the settings."""

    def __init__(self, ranks_per_node=0, *, compression=None):
        super().__init__(HOOK_HIERARCHICAL, ranks_per_node=ranks_per_node, compression=compression)

    def __repr__(self):
        return f"HierarchicalHook({self.identity()})"


class GossipHook:
    """GossipGraD (pybridge.gossip) by its settings: `Reducer(..., hook=GossipHook('cube'))`.
    The settings are checked when the state is built, after every rank agreed on them."""

    def __init__(self, topology="cube", *, ranks_per_node=None, seed=0, sync_every=0, rotate=True):
        from . import gossip
        self.settings = {"topology": topology.lower() if isinstance(topology, str) else topology,
                         "ranks_per_node": gossip.ranks_per_node_or_launchers(ranks_per_node), "seed": seed, "rotate": bool(rotate),
                         "sync_every": sync_every}

    def identity(self):
        from . import gossip
        return _describe(gossip.gossip_hook, gossip.GossipState, self.settings)

    def build(self, group):
        """(state, hook): a collective over `group` (the state creates the node groups)."""
        from . import gossip
        state = gossip.GossipState(group, **self.settings)
        return state, gossip.gossip_hook

    def __repr__(self):
        return f"GossipHook({self.identity()})"


def _name(obj):
    if isinstance(obj, functools.partial):
        return f"partial({_name(obj.func)})"
    return f"{getattr(obj, '__module__', None) or '?'}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _describe(hook, state_type, settings):
    if state_type is type(None):
        return _name(hook)
    return f"{_name(hook)}({', '.join([f'state {_name(state_type)}'] + [f'{k} {v!r}' for k, v in settings.items()])})"


def _settings(state):
    """The settings of a known hook state that every rank must share ({} for others): a
    typed dispatch, so a renamed class is an error here and not a silently empty row."""
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    from .gossip import GossipState
    if isinstance(state, HierarchicalState):
        return state.settings()
    if isinstance(state, PostLocalSGDState):
        return {"start_localSGD_iter": state.start_localSGD_iter,
                "post_local_gradient_allreduce": state.post_local_gradient_allreduce}
    if isinstance(state, GossipState):
        return {"topology": state.topology, "ranks_per_node": state.group.size // state.num_nodes,
                "seed": state.seed, "rotate": state.rotate, "sync_every": state.sync_every}
    if isinstance(state, PowerSGDState):
        return {"rank": state.matrix_approximation_rank, "start_iter": state.start_powerSGD_iter,
                "warm_start": state.warm_start, "error_feedback": state.use_error_feedback,
                "min_compression_rate": state.min_compression_rate,
                "batch_same_shape": state.batch_tensors_with_same_shape}
    return {}


def identity(state, hook):
    """What every rank must agree on about a hook, readable: the function by module and
    qualified name, the state's type and, for pybridge's and torch's known states, their
    settings. 'pybridge.comm_hooks.fp16_compress_hook(state pybridge.comm_hooks.HookContext)'."""
    return _describe(hook, type(state), _settings(state))


def _step_attr(state):
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    from .gossip import GossipState
    if isinstance(state, GossipState):
        return "step"
    if isinstance(state, (PowerSGDState, PostLocalSGDState)):
        return "iter"
    return None


def hook_step(state):
    """The step counter of a hook state that a checkpoint keeps (GossipGraD's step, PowerSGD's
    and post-local SGD's iteration), or None for states without one."""
    attr = _step_attr(state)
    return None if attr is None else getattr(state, attr)


def set_hook_step(state, step):
    """Restore hook_step()'s counter; a state without one ignores it."""
    attr = _step_attr(state)
    if attr is not None:
        setattr(state, attr, step)


__all__ = ["GradBucket", "HookContext", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "declare_eager", "powersgd_state", "powersgd_hook", "builtin", "BuiltinHook", "GossipHook",
           "HierarchicalHook", "HierarchicalState", "hierarchical_hook",
           "identity", "hook_step", "set_hook_step"]
