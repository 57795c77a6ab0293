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
           "describe", "agree_on"]
