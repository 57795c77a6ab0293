"""A reducer's settings: how each one is given (names, codes, torch dtypes), checked, and
agreed on by every rank.

Creating a reducer is a collective: one small allgather compares the parameter count, the
total element count and a hash per setting; ranks that differ would otherwise deadlock or
mix up gradients later. On a mismatch a second allgather exchanges the readable values, so
every rank raises the same InvalidArgument naming each differing setting (agree.check).
"""

import torch

from .. import abi
from ..algorithms import comm_hooks
from ..base import agree
from ..base.checks import positive_finite
from ..comm import collectives
from ..comm.collectives import AVG, SUM
from ..errors import InvalidArgument

MiB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25.0
DEFAULT_FIRST_BUCKET_CAP_MB = 1.0

# The C ABI's compression codes (PB_COMPRESS_* in capi/pybridge.h): names of built-in hooks.
COMPRESS_NONE, COMPRESS_FP16, COMPRESS_BF16 = abi.PB_COMPRESS_NONE, abi.PB_COMPRESS_FP16, abi.PB_COMPRESS_BF16
_COMPRESSION = {None: COMPRESS_NONE, "none": COMPRESS_NONE, "fp16": COMPRESS_FP16,
                "float16": COMPRESS_FP16, "half": COMPRESS_FP16, "bf16": COMPRESS_BF16,
                "bfloat16": COMPRESS_BF16}
_COMPRESSION_HOOK = {COMPRESS_NONE: comm_hooks.HOOK_ALLREDUCE, COMPRESS_FP16: comm_hooks.HOOK_FP16,
                     COMPRESS_BF16: comm_hooks.HOOK_BF16}

# What the ranks compare, by name (the order of the allgathered row).
NAMES = ("parameters", "op", "bucket caps", "flags", "hook")
_SHOWN = 400  # bytes of each differing setting's value exchanged for the error message


def resolve_compression(c):
    """A COMPRESS_* code from a code, a name ('fp16', 'bf16', ...), a torch dtype or None."""
    if isinstance(c, torch.dtype):
        c = {torch.float16: COMPRESS_FP16, torch.bfloat16: COMPRESS_BF16}.get(c, c)
    if isinstance(c, str):
        c = _COMPRESSION.get(c.lower(), c)
    elif c is None:
        c = COMPRESS_NONE
    if isinstance(c, bool) or c not in (COMPRESS_NONE, COMPRESS_FP16, COMPRESS_BF16):
        raise InvalidArgument(f"unknown compression {c!r}; use None, 'fp16' or 'bf16' (codes 0..2)")
    return c


def hook_choice(hook, state, compression):
    """(a hook chosen by settings or by name, or None; (state, hook) of a callable, or None).
    compression= is another name for a built-in hook: 'fp16' is hook=HOOK_FP16."""
    alias = _COMPRESSION_HOOK[compression]
    if hook is None:
        spec, pair = comm_hooks.BuiltinHook(alias), None
    elif isinstance(hook, (comm_hooks.BuiltinHook, comm_hooks.GossipHook, comm_hooks.NamedHook)):
        spec, pair = hook, None
    elif isinstance(hook, str):  # a name of comm_hooks.HOOKS: a built-in's or a registered one
        spec, pair = comm_hooks.by_name(hook), None
    elif isinstance(hook, int) and not isinstance(hook, bool):
        spec, pair = comm_hooks.BuiltinHook(hook), None
    elif callable(hook):
        spec, pair = None, (state, hook)
    else:
        raise InvalidArgument(f"hook must be callable as hook(state, bucket), a hook's name, a PB_HOOK_* code, "
                              f"or a comm_hooks.BuiltinHook or GossipHook, got {hook!r}")
    if spec is not None and state is not None:
        raise InvalidArgument("hook_state goes with a callable hook; a built-in hook makes its own state")
    if compression != COMPRESS_NONE and not (isinstance(spec, comm_hooks.BuiltinHook) and spec.code == alias):
        raise InvalidArgument(f"compression={compression} names the built-in hook {alias} (PB_HOOK_*), but "
                              f"hook={hook!r} was given too; give one of them")
    return spec, pair


def resolve_op(op):
    """AVG or SUM from a code or a name ('avg', 'mean', 'sum')."""
    code = {"avg": AVG, "mean": AVG, "sum": SUM}.get(op.lower()) if isinstance(op, str) else op
    if isinstance(code, bool) or code not in (AVG, SUM):
        raise InvalidArgument(f"reducer op must be 'avg' or 'sum' (codes {AVG}, {SUM}), got {op!r}")
    return code


# ---- the C ABI's words for the settings: pb_reducer_options, which Go's options fill too ------


def _named(prefix):
    """{header name: value} of the ABI's constants that start with `prefix`."""
    return {name: getattr(abi, name) for name in dir(abi) if name.startswith(prefix)}


def _listing(named):
    return ", ".join(f"{name} ({value})" for name, value in named.items())


def _mask(named):
    mask = 0
    for value in named.values():
        mask |= value
    return mask


REDUCER_FLAGS = _named("PB_REDUCER_")
# What each reducer flag sets: a Reducer keyword and the value the flag gives it (the other
# when it is clear); PB_REDUCER_BUCKET_VIEW is the attachment's (flag_keywords).
_FLAG_KEYWORDS = {"PB_REDUCER_ALLOW_UNUSED": ("allow_unused", True), "PB_REDUCER_NO_REBUILD": ("rebuild", False),
                  "PB_REDUCER_JOIN": ("join", True),
                  "PB_REDUCER_JOIN_DIVIDE_BY_ACTIVE": ("divide_by_initial_world_size", False)}
WIRES = _named("PB_HOOK_WIRE_")  # hook_flags: the hierarchical hook's wire type, named by its suffix
HOOK_FLAGS = {"PB_HOOK_NO_WARM_START": abi.PB_HOOK_NO_WARM_START, **WIRES}
TOPOLOGIES = {name: code for name, code in _named("PB_GOSSIP_").items() if code != abi.PB_GOSSIP_NONE}


def flag_keywords(flags, attach=False):
    """(Reducer keywords, bucket_view) from a word of PB_REDUCER_* flags (C's
    pb_reducer_options.flags; Go's With... options set them). bucket_view is for
    pb_reducer_attach (`attach`), the one call that takes PB_REDUCER_BUCKET_VIEW. An unknown
    bit is refused, naming the flags the header defines."""
    if isinstance(flags, bool) or not isinstance(flags, int) or flags & ~_mask(REDUCER_FLAGS):
        raise InvalidArgument(f"unknown reducer flags {flags if isinstance(flags, bool) else hex(flags)}; "
                              f"valid: {_listing(REDUCER_FLAGS)}")
    keywords = {keyword: value if flags & REDUCER_FLAGS[name] else not value
                for name, (keyword, value) in _FLAG_KEYWORDS.items()}
    bucket_view = bool(flags & abi.PB_REDUCER_BUCKET_VIEW)
    if bucket_view and not attach:
        raise InvalidArgument("flags: PB_REDUCER_BUCKET_VIEW goes with pb_reducer_attach (the parameters' .grad "
                              "become bucket views); pb_reducer_create's gradients are bucket views already")
    return keywords, bucket_view


def hook_of(hook=abi.PB_HOOK_ALLREDUCE, *, rank=1, flags=0, start_iter=2, ranks_per_node=0,
            topology=abi.PB_GOSSIP_NONE, gossip_ranks_per_node=0, seed=0, sync_every=0):
    """The built-in hook C's reducer options choose: `hook` (a PB_HOOK_* code) with its
    settings and hook_flags `flags` (PB_HOOK_NO_WARM_START for PowerSGD, one PB_HOOK_WIRE_*
    for the hierarchical hook), a comm_hooks.BuiltinHook; or, when `topology` is a gossip
    topology (not PB_GOSSIP_NONE), gossip with its settings, a comm_hooks.GossipHook:
    gossip takes the hook's place, so `hook` must stay PB_HOOK_ALLREDUCE."""
    if isinstance(flags, bool) or not isinstance(flags, int) or flags & ~_mask(HOOK_FLAGS):
        raise InvalidArgument(f"unknown hook flags {flags if isinstance(flags, bool) else hex(flags)}; "
                              f"valid: {_listing(HOOK_FLAGS)}")
    wires = [name for name, bit in WIRES.items() if flags & bit]
    if len(wires) > 1:
        raise InvalidArgument(f"hook_flags has {' and '.join(wires)}; choose one")
    if wires and hook != abi.PB_HOOK_HIERARCHICAL:
        raise InvalidArgument(f"hook_flags {wires[0]} goes with PB_HOOK_HIERARCHICAL, but hook is {hook}; "
                              "for a plain allreduce on a half wire use PB_HOOK_FP16 or PB_HOOK_BF16")
    if topology == abi.PB_GOSSIP_NONE:
        return comm_hooks.BuiltinHook(hook, rank=rank, start_iter=start_iter,
                                      warm_start=not flags & abi.PB_HOOK_NO_WARM_START, ranks_per_node=ranks_per_node,
                                      compression=wires[0][len("PB_HOOK_WIRE_"):].lower() if wires else None)
    if topology not in TOPOLOGIES.values() or isinstance(topology, bool):
        raise InvalidArgument(f"unknown gossip topology {topology}; use PB_GOSSIP_NONE ({abi.PB_GOSSIP_NONE}), "
                              f"{_listing(TOPOLOGIES)}")
    if hook != abi.PB_HOOK_ALLREDUCE:
        raise InvalidArgument(f"gossip (gossip_topology {topology}) takes the hook's place, but hook is {hook}: "
                              "leave hook at PB_HOOK_ALLREDUCE, or gossip_topology at PB_GOSSIP_NONE")
    name = next(n for n, code in TOPOLOGIES.items() if code == topology)
    return comm_hooks.GossipHook(name[len("PB_GOSSIP_"):].lower(), ranks_per_node=gossip_ranks_per_node, seed=seed,
                                 sync_every=sync_every)


COMPRESSIONS = _named("PB_COMPRESS_")


def compression_hook(code):
    """The PB_HOOK_* code a PB_COMPRESS_* code stands for (pb_reducer_new's compression)."""
    if isinstance(code, bool) or code not in COMPRESSIONS.values():
        raise InvalidArgument(f"unknown compression {code}; use {_listing(COMPRESSIONS)}")
    return _COMPRESSION_HOOK[code]


def bucket_caps(bucket_cap_mb=None, first_bucket_cap_mb=None):
    """(bucket cap, first bucket cap) in MiB, by torch DDP's rule (torch 2.13): with the
    default bucket cap the first bucket is small (1 MiB), so the first allreduce starts
    early; a bucket cap the caller chose applies to the first bucket too, unless that is
    given as well. (Same buckets as torch DDP for the same arguments; on bench/reducer.py's
    model (a), one 13 MiB bucket took 25.5 ms per step against 27.8 with a 1 MiB first
    bucket, and 31.8 against 38.7 with PowerSGD.)"""
    cap = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
    if first_bucket_cap_mb is None:
        first_bucket_cap_mb = DEFAULT_FIRST_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
    return cap, first_bucket_cap_mb


def resolve_cap(mb, what):
    """A cap in MiB as bytes (at least 1; caps above 1 PiB are 1 PiB)."""
    return max(1, int(min(positive_finite(what, mb, " of MiB"), 1 << 30) * MiB))


def describe(specs, *, op, bucket_cap, first_bucket_cap, allow_unused, rebuild, join,
             divide_by_initial_world_size, hook):
    """Every setting the ranks must share, by name (NAMES), as readable text. `hook`: the
    hook's identity (comm_hooks.identity)."""
    shapes = [(s.shape, str(s.dtype).replace("torch.", ""), s.device.type) for s in specs]
    params = f"{len(shapes)} parameters, {sum(s.numel for s in specs)} elements: {shapes}"
    joined = f", join=True, divide_by_initial_world_size={divide_by_initial_world_size}" if join else ""
    return (params, "avg" if op == AVG else "sum",
            f"{bucket_cap} bytes, first bucket {first_bucket_cap} bytes",
            f"allow_unused={allow_unused}, rebuild={rebuild}{joined}", hook)


def agree_on(group, specs, values):
    """COLLECTIVE over `group` (none on one rank): every rank passes its describe() texts;
    raises InvalidArgument on every rank when any differ, naming each differing setting
    and each rank's value."""
    if group.size == 1:
        return
    mine = [len(specs), sum(s.numel for s in specs)] + [agree.signature(v) for v in values]
    rows = collectives.gather_rows(mine, group=group)
    differ = [k for k in range(len(NAMES)) if len({row[2 + k] for row in rows}) > 1]
    if differ:
        names = [NAMES[k] for k in differ]
        agree.check("reducer settings differ across ranks", _values(group, [values[k] for k in differ]),
                    describe=lambda row: "; ".join(f"{n}: {v}" for n, v in zip(names, row)),
                    fields=names, hint=". Every rank must create the reducer with the same parameter "
                    "shapes, dtypes and options, and register the same hook")


def _values(group, values):
    """Every rank's `values` (texts, the first _SHOWN bytes of each), by rank: one
    all_gather of fixed size, so it cannot upset the backend."""
    mine = []
    for v in values:
        b = v.encode()[:_SHOWN]
        mine += list(b) + [0] * (_SHOWN - len(b))
    rows = collectives.gather_rows(mine, group=group)
    return [tuple(bytes(row[k * _SHOWN:(k + 1) * _SHOWN]).rstrip(b"\0").decode(errors="replace")
                  for k in range(len(values))) for row in rows]


__all__ = ["MiB", "DEFAULT_BUCKET_CAP_MB", "DEFAULT_FIRST_BUCKET_CAP_MB",
           "COMPRESS_NONE", "COMPRESS_FP16", "COMPRESS_BF16", "NAMES",
           "resolve_compression", "hook_choice", "resolve_op", "bucket_caps", "resolve_cap",
           "describe", "agree_on", "REDUCER_FLAGS", "WIRES", "HOOK_FLAGS", "TOPOLOGIES", "COMPRESSIONS", "flag_keywords", "hook_of",
           "compression_hook"]
