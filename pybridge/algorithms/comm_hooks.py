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

Hooks by name (HOOKS, the one registry of names): each built-in by its code's name in lower
case ('fp16' is PB_HOOK_FP16), and the hooks a program registers with register_comm_hook;
Python (Reducer(hook='name')), C (pb_reducer_options.hook_name) and Go (WithHookName)
choose any of them by name (by_name).

Every rank must use the same hook: the reducer compares identity(state, hook) across
ranks. Adding a built-in hook: docs/design.md, "Adding a built-in hook".
"""

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from .. import abi
from ..base.registry import Registry, describe, provides
from ..comm.group import Group
from ..errors import InvalidArgument
from . import gossip
from .contract import (Closing, CommHook, GradBucket, HookContext, HookState, StepCounting, _describe, _name,
                       declare_eager, declare_prepared, declare_sums, hook_step, identity, is_eager, prepared,
                       prescales, set_hook_step)
from .default_hooks import allreduce_hook, bf16_compress_hook, fp16_compress_hook, powersgd_hook, powersgd_state
from .hierarchical import HierarchicalState, hierarchical_hook

HOOK_ALLREDUCE = abi.PB_HOOK_ALLREDUCE
HOOK_FP16 = abi.PB_HOOK_FP16
HOOK_BF16 = abi.PB_HOOK_BF16
HOOK_POWERSGD = abi.PB_HOOK_POWERSGD
HOOK_HIERARCHICAL = abi.PB_HOOK_HIERARCHICAL


# (state, hook): what building a hook over a group (None: only described) gives.
StateAndHook = tuple[Any, Callable[..., Any]]
_Build = Callable[[Optional[Group], dict[str, Any]], StateAndHook]


def _context(hook: Callable[..., Any]) -> _Build:
    return lambda group, how: (HookContext(group), hook)


def _powersgd(group: Optional[Group], how: dict[str, Any]) -> StateAndHook:
    return powersgd_state(group, how["rank"], how["warm_start"], how["start_iter"], how["seed"]), powersgd_hook


def _hierarchical(group: Optional[Group], how: dict[str, Any]) -> StateAndHook:
    kw = {"ranks_per_node": how["ranks_per_node"], "compression": how["compression"]}
    state = HierarchicalState.described(**kw) if group is None else HierarchicalState(group, **kw)
    return state, hierarchical_hook


# The built-in hooks by code (PB_HOOK_* of the header): the one table. builtin() builds from
# it, its error lists it, and tests check that the header's codes and Go's Hook constants
# name exactly these (tests/test_comm_hooks.py).
BUILTIN: dict[int, tuple[str, _Build]] = {
    HOOK_ALLREDUCE: ("PB_HOOK_ALLREDUCE", _context(allreduce_hook)),
    HOOK_FP16: ("PB_HOOK_FP16", _context(fp16_compress_hook)),
    HOOK_BF16: ("PB_HOOK_BF16", _context(bf16_compress_hook)),
    HOOK_POWERSGD: ("PB_HOOK_POWERSGD", _powersgd),
    HOOK_HIERARCHICAL: ("PB_HOOK_HIERARCHICAL", _hierarchical),
}


def builtin(code: Any, group: Optional[Group], *, rank: int = 1, warm_start: bool = True, start_iter: int = 2,
            seed: int = 0, ranks_per_node: int = 0, compression: Optional[str] = None) -> StateAndHook:
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

    def __init__(self, code: int = HOOK_ALLREDUCE, *, rank: int = 1, warm_start: bool = True, start_iter: int = 2,
                 seed: int = 0, ranks_per_node: int = 0, compression: Optional[str] = None) -> None:
        self.code, self.rank, self.warm_start, self.start_iter, self.seed = code, rank, warm_start, start_iter, seed
        self.ranks_per_node, self.compression = ranks_per_node, compression
        self._identity = identity(*self.build(None))  # checks the settings, here and now

    def identity(self) -> str:
        return self._identity

    def build(self, group: Optional[Group]) -> StateAndHook:
        """(state, hook) over `group`."""
        return builtin(self.code, group, rank=self.rank, warm_start=self.warm_start,
                       start_iter=self.start_iter, seed=self.seed, ranks_per_node=self.ranks_per_node,
                       compression=self.compression)

    def __repr__(self) -> str:
        return f"BuiltinHook({self._identity})"


class HierarchicalHook(BuiltinHook):
    """Hierarchical allreduce (pybridge.algorithms.hierarchical) by its settings:
    `Reducer(..., hook=HierarchicalHook(ranks_per_node=2))`, the same hook as
    BuiltinHook(HOOK_HIERARCHICAL, ...). ranks_per_node 0: the launcher's LOCAL_WORLD_SIZE;
    compression 'fp16' or 'bf16': float32 buckets travel as that type. Building it creates
    groups (a collective), after every rank agreed on the settings."""

    def __init__(self, ranks_per_node: int = 0, *, compression: Optional[str] = None) -> None:
        super().__init__(HOOK_HIERARCHICAL, ranks_per_node=ranks_per_node, compression=compression)

    def __repr__(self) -> str:
        return f"HierarchicalHook({self.identity()})"


class GossipHook:
    """GossipGraD (pybridge.algorithms.gossip) by its settings: `Reducer(..., hook=GossipHook('cube'))`.
    The settings are checked when the state is built, after every rank agreed on them."""

    def __init__(self, topology: str = "cube", *, ranks_per_node: Optional[int] = None, seed: int = 0,
                 sync_every: int = 0, rotate: bool = True) -> None:
        self.settings: dict[str, Any] = {"topology": topology.lower() if isinstance(topology, str) else topology,
                         "ranks_per_node": gossip.ranks_per_node_or_launchers(ranks_per_node), "seed": seed, "rotate": bool(rotate),
                         "sync_every": sync_every}

    def identity(self) -> str:
        return _describe(gossip.gossip_hook, gossip.GossipState, self.settings)

    def build(self, group: Optional[Group]) -> StateAndHook:
        """(state, hook): a collective over `group` (the state creates the node groups)."""
        state = gossip.GossipState(group, **self.settings)
        return state, gossip.gossip_hook

    def __repr__(self) -> str:
        return f"GossipHook({self.identity()})"


# ---- hooks by name: the built-ins' and registered ones (register_comm_hook) -------------


@dataclass(frozen=True)
class Registered:
    """A hook registered by name: `hook(state, bucket)` over the state `state(group)` makes."""

    hook: Callable[..., Any]
    state: Callable[..., Any]

    def __str__(self) -> str:
        return f"{describe(self.hook)} (state {describe(self.state)})"


# Every hook's name: a built-in's (its code, from BUILTIN: 'fp16' is PB_HOOK_FP16) or a
# registered one's (Registered). by_name reads it; C's hook_name and Go's WithHookName too.
HOOKS: Registry[Any] = Registry(
    "comm hook", describe=lambda e: str(e) if isinstance(e, Registered) else f"the built-in hook {BUILTIN[e][0]}")
for _code, (_c_name, _) in BUILTIN.items():
    HOOKS.register(_c_name[len("PB_HOOK_"):].lower(), _code)


def register_comm_hook(name: str, hook: Callable[..., Any], state: Callable[..., Any] = HookContext) -> None:
    """Register `hook` as `name`, for every reducer of this process to choose by name:
    `Reducer(params, hook=name)`, C's `pb_reducer_options.hook_name`, Go's `WithHookName`.
    `hook(state, bucket) -> Future` is a comm hook (torch's contract, `CommHook`);
    `state(group)` makes its state for a reducer's group (default `HookContext`: the group
    and wire buffers), which must provide `HookState`: `settings()`, what every rank must
    share (compared when reducers are created, with the hook's name and functions). A state
    may also name a step counter (`STEP_ATTR`) and have `close()`. A class is checked here,
    another callable's state when it is built.

    As torch's rendezvous registry: registering the same hook and state again does nothing;
    another hook under a registered name (a built-in's included) is InvalidArgument naming
    both. Each process that chooses it registers it: a C or Go program imports the module
    that does (pb_import_module, ImportModule).

    >>> import pybridge
    >>> from pybridge.algorithms import comm_hooks
    >>> def halve(state, bucket):  # sum, then halve: the average on 2 ranks
    ...     return pybridge.all_reduce_future(bucket.buffer(), group=state.group).then(lambda f: f.value()[0].div_(2))
    >>> comm_hooks.register_comm_hook("halve", halve)
    >>> "halve" in comm_hooks.HOOKS
    True
    """
    what = f"register_comm_hook({name!r}, {describe(hook)})"
    _check_call(f"{what}: the hook", hook, 2, "hook(state, bucket) -> Future (CommHook)")
    _check_call(f"{what}: state", state, 1, "state(group), making the hook's state")
    if isinstance(state, type):
        provides(f"{what}: the state class {describe(state)}", state, HookState)
    HOOKS.register(name, Registered(hook, state))


def _check_call(what: str, fn: Any, nargs: int, how: str) -> None:
    """`fn` must be callable with `nargs` positional arguments (when its signature says)."""
    if not callable(fn):
        raise InvalidArgument(f"{what} must be callable as {how}, got {fn!r}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature (some builtins): trust the call
        return
    try:
        sig.bind(*[None] * nargs)
    except TypeError:
        raise InvalidArgument(f"{what} must be callable as {how}; {describe(fn)} takes {sig}") from None


class NamedHook:
    """A registered hook (register_comm_hook) chosen by name: `Reducer(..., hook='name')`.
    Building it makes the state for the group and checks it provides HookState."""

    def __init__(self, name: str) -> None:
        entry = HOOKS.lookup(name)
        if not isinstance(entry, Registered):
            raise InvalidArgument(f"{name!r} is a built-in hook: choose it with by_name() or BuiltinHook")
        self.name, self.entry = name, entry

    def identity(self) -> str:
        """What the ranks compare before building it: the name, the hook and how its state is
        made (the built state's settings are compared at the next agreement)."""
        return f"{self.name}: {_name(self.entry.hook)}(state from {_name(self.entry.state)})"

    def build(self, group: Optional[Group]) -> StateAndHook:
        """(state, hook) over `group`."""
        state = self.entry.state(group)
        provides(f"comm hook {self.name!r}: its state {type(state).__qualname__}", state, HookState)
        return state, self.entry.hook

    def __repr__(self) -> str:
        return f"NamedHook({self.name!r}: {self.entry})"


def by_name(name: str, **settings: Any) -> Union["BuiltinHook", "NamedHook"]:
    """The hook named `name` in HOOKS, for Reducer(hook=...): a built-in as
    BuiltinHook(its code, **settings), a registered one as NamedHook(name) (it takes no
    settings). An unknown name is InvalidArgument listing every name."""
    entry = HOOKS.lookup(name)
    if isinstance(entry, Registered):
        return NamedHook(name)
    return BuiltinHook(entry, **settings)


__all__ = ["GradBucket", "HookContext", "CommHook", "HookState", "StepCounting", "Closing", "HOOKS",
           "register_comm_hook", "by_name", "NamedHook", "Registered", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "declare_eager", "declare_sums", "declare_prepared", "is_eager", "prescales", "prepared", "powersgd_state", "powersgd_hook", "builtin", "BUILTIN",
           "BuiltinHook", "GossipHook", "HierarchicalHook", "HierarchicalState", "hierarchical_hook",
           "identity", "hook_step", "set_hook_step"]
