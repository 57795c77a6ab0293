"""The built-in hooks, by code (PB_HOOK_*, from C and Go) and by settings: the one registry
of built-in hooks, and the public module of the hook API (it re-exports the contract and
the simple hooks).

Built-in hooks (also selected by code from C and Go: builtin(), BuiltinHook):
  allreduce_hook      sum (the reducer folds the 1/size of 'avg' into the gradient copy)
  fp16_compress_hook  float32 buckets travel as float16, decompressed into the bucket
  bf16_compress_hook  likewise as bfloat16
  powersgd_hook(...)  torch's PowerSGD with its state, for C and Go callers
  hierarchical_hook   sum within the node, allreduce among node leaders, broadcast in the
                      node (pybridge.algorithms.hierarchical; HierarchicalHook chooses it by settings)
GossipGraD (pybridge.algorithms.gossip) is chosen by its settings with GossipHook.

Every rank must use the same hook: the reducer compares identity(state, hook) across
ranks. Adding a built-in hook: docs/comm-hooks.md, "Adding a built-in hook".
"""

from .. import abi
from ..errors import InvalidArgument
from . import gossip
from .contract import (GradBucket, HookContext, _describe, declare_eager, declare_sums, hook_step, identity,
                       is_eager, prescales, set_hook_step)
from .default_hooks import allreduce_hook, bf16_compress_hook, fp16_compress_hook, powersgd_hook, powersgd_state
from .hierarchical import HierarchicalState, hierarchical_hook

HOOK_ALLREDUCE = abi.PB_HOOK_ALLREDUCE
HOOK_FP16 = abi.PB_HOOK_FP16
HOOK_BF16 = abi.PB_HOOK_BF16
HOOK_POWERSGD = abi.PB_HOOK_POWERSGD
HOOK_HIERARCHICAL = abi.PB_HOOK_HIERARCHICAL


def _context(hook):
    return lambda group, how: (HookContext(group), hook)


def _powersgd(group, how):
    return powersgd_state(group, how["rank"], how["warm_start"], how["start_iter"], how["seed"]), powersgd_hook


def _hierarchical(group, how):
    kw = {"ranks_per_node": how["ranks_per_node"], "compression": how["compression"]}
    state = HierarchicalState.described(**kw) if group is None else HierarchicalState(group, **kw)
    return state, hierarchical_hook


# The built-in hooks by code (PB_HOOK_* of the header): the one table. builtin() builds from
# it, its error lists it, and tests check that the header's codes and Go's Hook constants
# name exactly these (tests/test_comm_hooks.py).
BUILTIN = {
    HOOK_ALLREDUCE: ("PB_HOOK_ALLREDUCE", _context(allreduce_hook)),
    HOOK_FP16: ("PB_HOOK_FP16", _context(fp16_compress_hook)),
    HOOK_BF16: ("PB_HOOK_BF16", _context(bf16_compress_hook)),
    HOOK_POWERSGD: ("PB_HOOK_POWERSGD", _powersgd),
    HOOK_HIERARCHICAL: ("PB_HOOK_HIERARCHICAL", _hierarchical),
}


def builtin(code, group, *, rank=1, warm_start=True, start_iter=2, seed=0, ranks_per_node=0,
            compression=None):
    """(state, hook) for a hook code of the C ABI (PB_HOOK_*). group None: a state that is
    only described (its identity), never run."""
    try:
        entry = None if isinstance(code, bool) else BUILTIN.get(code)  # True is not PB_HOOK_FP16
    except TypeError:  # unhashable
        entry = None
    if entry is None:
        known = ", ".join(f"{name} ({c})" for c, (name, _) in BUILTIN.items())
        raise InvalidArgument(f"unknown hook code {code!r}; use one of {known}")
    how = {"rank": rank, "warm_start": warm_start, "start_iter": start_iter, "seed": seed,
           "ranks_per_node": ranks_per_node, "compression": compression}
    return entry[1](group, how)


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
    """Hierarchical allreduce (pybridge.algorithms.hierarchical) by its settings:
    `Reducer(..., hook=HierarchicalHook(ranks_per_node=2))`, the same hook as
    BuiltinHook(HOOK_HIERARCHICAL, ...). ranks_per_node 0: the launcher's LOCAL_WORLD_SIZE;
    compression 'fp16' or 'bf16': float32 buckets travel as that type. Building it creates
    groups (a collective), after every rank agreed on the settings."""

    def __init__(self, ranks_per_node=0, *, compression=None):
        super().__init__(HOOK_HIERARCHICAL, ranks_per_node=ranks_per_node, compression=compression)

    def __repr__(self):
        return f"HierarchicalHook({self.identity()})"


class GossipHook:
    """GossipGraD (pybridge.algorithms.gossip) by its settings: `Reducer(..., hook=GossipHook('cube'))`.
    The settings are checked when the state is built, after every rank agreed on them."""

    def __init__(self, topology="cube", *, ranks_per_node=None, seed=0, sync_every=0, rotate=True):
        self.settings = {"topology": topology.lower() if isinstance(topology, str) else topology,
                         "ranks_per_node": gossip.ranks_per_node_or_launchers(ranks_per_node), "seed": seed, "rotate": bool(rotate),
                         "sync_every": sync_every}

    def identity(self):
        return _describe(gossip.gossip_hook, gossip.GossipState, self.settings)

    def build(self, group):
        """(state, hook): a collective over `group` (the state creates the node groups)."""
        state = gossip.GossipState(group, **self.settings)
        return state, gossip.gossip_hook

    def __repr__(self):
        return f"GossipHook({self.identity()})"


__all__ = ["GradBucket", "HookContext", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "declare_eager", "declare_sums", "is_eager", "prescales", "powersgd_state", "powersgd_hook", "builtin", "BUILTIN",
           "BuiltinHook", "GossipHook", "HierarchicalHook", "HierarchicalState", "hierarchical_hook",
           "identity", "hook_step", "set_hook_step"]
