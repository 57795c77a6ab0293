"""Process groups: the `Group` class (the world and its subgroups), how a subgroup's backend
is built, and how a group is aborted.

This module sits below collectives.py: it builds groups and their backends but issues no
collective. Creation that needs one (split, node_groups) lives in subgroups.py, above the
collectives; Group.split imports it when called. The world's lifecycle (init, finalize,
current, from_torch) is world.py's, above this module.
"""

from __future__ import annotations

import datetime
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Optional, TypeVar

import torch
import torch.distributed as dist

from . import checked as _checked
from . import cancel as _cancel
from . import sockets as _sockets
from . import streams as _streams
from . import roster as _roster
from . import watchdog as _watchdog
from ..base.checks import index
from ..errors import Canceled, Closed, InvalidArgument, Timeout, classify

if TYPE_CHECKING:  # torch.distributed does not export these to a type checker
    from torch._C._distributed_c10d import Backend, Store

_lock = threading.Lock()  # guards the tree of groups (children, creation counts) and world.py's _current

ABORT_POLL_SECONDS = 0.05  # how often a wait that no socket ends looks whether its group was aborted




class Group:
    """A process group: this process's rank in it, its members, and the torch group behind it.

    The world group comes from init() (or is adopted from torch, see current()); subgroups
    come from new_group() and split() (pybridge.comm.subgroups). Ranks given to any call that
    takes a group (roots, peers, new_group's list) are ranks WITHIN that group, 0..size-1,
    as torch's group_src / group_dst; `ranks` maps them to global ranks.

    Each concern keeps its own state here, changed only by its owner: `progress` is the
    watchdog's (watchdog.Progress: collectives started, those in flight), `checks` checked
    mode's (checked.State, None when off).
    """

    # Set on the world by world.init: the store it joined over (torch holds a Python store only
    # by a C++ pointer) and its etcd membership; a subgroup's backend store. Unset otherwise.
    rendezvous_store: Any
    etcd_world: Any
    _rendezvous_store: Any

    def __init__(self, pg: dist.ProcessGroup | Backend | None, ranks: Iterable[int], global_rank: int, local_rank: int,
                 backend: str, timeout: float, *, owned: bool, parent: Optional[Group] = None,
                 uid: str | None = None, checked: bool = False,
                 roster: Optional[list[dict[str, Any]]] = None) -> None:
        # torch's default group (the world, adopted groups) or, for pybridge's subgroups, a
        # Backend (_backend_group), whose collectives torch's stubs leave out; None once closed
        self.pg: Any = pg
        self.ranks = tuple(ranks)  # the global rank of each group rank
        self._rank_of = {r: i for i, r in enumerate(self.ranks)}
        self.rank = self._rank_of[global_rank]
        self.size = len(self.ranks)
        self.global_rank = global_rank
        self.local_rank = local_rank
        self.backend = backend
        self.timeout = timeout
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
            else torch.device("cpu")
        self.parent = parent
        self.closed = False
        # the CUDA stream calls are ordered on; None: the current one (streams.py)
        self.stream: Optional[torch.cuda.Stream] = None
        self._owned = owned  # pybridge created the torch group, so pybridge destroys it
        self._children: list[Group] = []
        self._created = 0  # subgroups made from this one so far: names the next one's store keys
        if parent is not None and uid is None:
            raise InvalidArgument("a subgroup needs a uid (the same on every member)")
        self.uid: str = "w" if parent is None or uid is None else uid  # the same on every member
        self._store: Optional[Store] = None
        # Reliability (docs/failures.md): checked mode, who every rank is, and progress.
        self.checked: bool = parent.checked if parent is not None else checked
        self.roster: Optional[list[dict[str, Any]]] = parent.roster if parent is not None else roster  # by global rank, or None
        self.progress: _watchdog.Progress = _watchdog.Progress(parent.progress if parent is not None else None)
        self.checks: Optional[_checked.State] = _checked.State(self.device) if self.checked else None
        # Elastic training (elastic.py): the world's link to its membership, None otherwise.
        # runtime.elastic.State, above this layer: not imported here
        self.elastic: Any = parent.elastic if parent is not None else None
        # Aborting (abort()): the reason once aborted, and the backend's connections to shut.
        self.aborted: Optional[str] = None
        self.sockets: frozenset[str] = frozenset()  # inode numbers (sockets.py)

    @property
    def issued(self) -> int:
        """Collectives started on this group so far (they are "#1" ... "#issued" in errors)."""
        issued: int = self.progress.issued
        return issued

    @property
    def children(self) -> tuple[Group, ...]:
        """The live subgroups made from this one (a copy)."""
        with _lock:
            return tuple(self._children)

    # Deprecated: state that Group used to carry for the watchdog and checked mode.
    @property
    def inflight(self) -> Optional[dict[int, Any]]:
        """Deprecated: Group.progress (the watchdog's) holds it."""
        return _deprecated("inflight", "Group.progress (the watchdog's)",
                           self.progress.snapshot()[1] if self.progress.watched else None)

    @property
    def fingerprint_buffer(self) -> None:
        """Deprecated: Group.checks (checked mode's) holds it."""
        return _deprecated("fingerprint_buffer", "Group.checks (checked mode's)", None)

    @property
    def p2p(self) -> dict[Any, Any]:
        """Deprecated: Group.checks (checked mode's) holds it."""
        return _deprecated("p2p", "Group.checks (checked mode's)", {})

    @property
    def store(self) -> Store:
        """A key-value store shared by the members (the rendezvous store; a subgroup's keys
        get a prefix of their own). Used e.g. for dynamic data partitioning."""
        if self._store is None:
            store = world_store()
            self._store = store if self.parent is None else dist.PrefixStore(  # type: ignore[attr-defined]
                f"pybridge/{self.uid}/data/", store)
        return self._store

    def check_open(self) -> None:
        if self.closed:
            raise Closed("process group was finalized" if self.parent is None else
                         "process group was closed (or its world group was finalized)")
        if self.aborted is not None:
            raise Closed(f"{self.describe()} was aborted ({self.aborted}): every call on it fails from "
                         "then on; close it (the world: finalize) and make another")
        if not self._owned and self.parent is None and not dist.is_initialized():
            raise Closed("the adopted torch.distributed group was destroyed")

    # ---- aborting --------------------------------------------------------------------------

    def abort(self, reason: str | None = None) -> None:
        """Abort this group and its subgroups from any thread, as torch's ProcessGroup abort:
        a call blocked on one of them (a collective, a message, a work's wait, a subgroup's
        creation) raises Canceled at once, and every later call raises Closed naming
        `reason`. gloo cannot cancel an operation, so the backend's connections are shut
        down (sockets.py; the peers' calls waiting on this rank fail too); an NCCL
        communicator is aborted. The group stays to be closed (finalize for the world).
        Aborting again does nothing."""
        reason = str(reason) if reason else "aborted"
        if self.elastic is not None:
            # An elastic world whose call failed goes on to agree on the next world (a join,
            # up to the join timeout): the abort that ends the call ends that wait too.
            _cancel.abort(reason)
        todo, marked = [self], []
        while todo:
            g = todo.pop()
            todo.extend(list(g._children))  # no lock: the caller may hold it (an init being aborted)
            if g.aborted is None and not g.closed:
                g.aborted = reason
                marked.append(g)
        # Every group is marked before any call is ended: a caller whose blocked call returns
        # next must find the subgroups aborted too (seen: a barrier on a subgroup started in
        # between, under load, and was canceled instead of refused).
        for g in marked:
            _sockets.shut_down(g.sockets)
            pg = g.pg
            if pg is not None:
                try:
                    pg.abort()  # NCCL: ncclCommAbort; gloo: nothing that ends a wait
                except Exception:  # noqa: BLE001 - a backend without abort: the sockets did it
                    pass

    def check_aborted(self, what: str) -> None:
        """Raise Canceled for `what` (a wait that no socket ends) once this group is aborted."""
        if self.aborted is not None:
            raise Canceled(f"{what} was canceled: {self.describe()} was aborted ({self.aborted})")

    def check_rank(self, what: str, r: int, allow_self: bool = True) -> int:
        """`r` as a rank within this group (InvalidArgument naming `what` otherwise)."""
        r = index(f"{what} rank", r, self.size, f"a group of size {self.size}")
        if not allow_self and r == self.rank:
            raise InvalidArgument(f"{what} rank {r} is this process's own rank")
        return r

    def global_rank_of(self, group_rank: int) -> int:
        """The global rank of member `group_rank`."""
        return self.ranks[self.check_rank("group", group_rank)]

    def group_rank_of(self, global_rank: int) -> int:
        """The rank within this group of the process with global rank `global_rank`."""
        r = self._rank_of.get(global_rank) if isinstance(global_rank, int) else None
        if r is None or isinstance(global_rank, bool):
            raise InvalidArgument(f"global rank {global_rank!r} is not a member of this group "
                                  f"(members: global ranks {list(self.ranks)})")
        return r

    def who(self, group_rank: int) -> str:
        """'rank 1 (host a, pid 42)' for a member (its global rank in a subgroup)."""
        g = self.ranks[group_rank]
        entry = self.roster[g] if self.roster else g
        text = _roster.describe(entry)
        return text if self.parent is None else f"{text} (group rank {group_rank})"

    def describe(self) -> str:
        return "the world group" if self.parent is None else f"group {self.uid}"

    def set_stream(self, stream: torch.cuda.Stream | int | None) -> None:
        """Order this group's calls on CUDA memory on `stream` (a torch.cuda.Stream or a
        cudaStream_t address) instead of the calling thread's current stream; None (or 0)
        goes back to the current stream. Tensors must be ready in that stream's order when
        a call is made; a blocking call's result is ready in its order on return, an
        asynchronous one's when its work completes (docs/c-api.md, CUDA streams). Subgroups start
        without one."""
        self.check_open()
        device = self.device.index if self.device.type == "cuda" else None
        self.stream = _streams.external(stream, device)

    # ---- subgroups -------------------------------------------------------------------------

    # split(color, key=None, *, timeout=None, backend=None): MPI_Comm_split over this group,
    # defined in subgroups.py (above the collectives it needs; the package import loads it).

    def new_group(self, ranks: Iterable[int]) -> Optional[Group]:
        """A subgroup of the members with these ranks (ranks within this group), ranked in
        that order. As torch's new_group, every member of this group calls it (members of the
        new one wait for each other; the others get None at once) in the same order as their
        other group creations from this group.
        """
        self.check_open()
        return self.subgroup(_member_list(ranks, self.size))

    def subgroup(self, members: Optional[Sequence[int]], *, timeout: Optional[float] = None,
                 backend: Optional[str] = None) -> Optional[Group]:
        """The next subgroup made from this one: the members with these ranks (within this
        group), ranked in that order; None when this rank is not among them (or members is
        None). Every member of this group calls it, in the same order as its other subgroup
        creations from this group: the count names the subgroup's store keys, so every
        member computes the same name whatever other groups each of them made before.
        timeout and backend default to this group's. (new_group and split build on it.)"""
        with _lock:
            self._created += 1
            seq = self._created
        if members is None or self.rank not in members:
            return None
        global_ranks = [self.ranks[r] for r in members]
        uid = f"{self.uid}.{seq}-{'_'.join(map(str, global_ranks))}"
        timeout = self.timeout if timeout is None else timeout
        backend = backend or self.backend
        pg, sockets, store = _backend_group(backend, members.index(self.rank), len(global_ranks),
                                            f"pybridge/{uid}/pg/", timeout, self)
        child = Group(pg, global_ranks, self.global_rank, self.local_rank, backend,
                      timeout, owned=True, parent=self, uid=uid)
        child.sockets = sockets
        child._rendezvous_store = store  # torch holds a Python store only by a C++ pointer
        with _lock:
            self._children.append(child)
        return child

    def close(self) -> None:
        """Free a subgroup (and its own subgroups). The world group is left with finalize()."""
        if self.parent is None:
            raise InvalidArgument("close() frees subgroups; leave the world group with finalize()")
        with _lock:
            self._close()
            if self in self.parent._children:
                self.parent._children.remove(self)

    def _close(self) -> None:
        """Mark closed, children first, and destroy the torch groups pybridge created."""
        for child in self._children:
            child._close()
        self._children = []
        if self.closed:
            return
        self.closed = True
        self.pg = None  # a subgroup's backend is ours alone: dropping it frees it (see finalize)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "live"
        kind = "world" if self.parent is None else f"subgroup of global ranks {list(self.ranks)}"
        return (f"<pybridge.Group rank={self.rank}/{self.size} {kind} local_rank={self.local_rank} "
                f"{self.backend} {state}>")


_T = TypeVar("_T")


def _deprecated(name: str, owner: str, value: _T) -> _T:
    warnings.warn(f"Group.{name} is deprecated: its state moved to {owner}", DeprecationWarning, stacklevel=3)
    return value


def _member_list(ranks: Iterable[int], size: int) -> list[int]:
    try:
        members = [int(r) for r in ranks]
    except (TypeError, ValueError):
        raise InvalidArgument(f"ranks must be a list of integers, got {ranks!r}") from None
    if not members:
        raise InvalidArgument("a group needs at least one rank")
    bad = [r for r in members if not 0 <= r < size]
    if bad:
        raise InvalidArgument(f"ranks {bad} are out of range for a group of size {size}")
    if len(set(members)) != len(members):
        raise InvalidArgument(f"ranks {members} list a rank more than once")
    return members


def world_store() -> Store:
    """The world's rendezvous store (no prefix): subgroups' backends and checked mode's
    point-to-point fingerprints meet there."""
    return dist.distributed_c10d._get_default_store()


def _own_connection(group: Group) -> Store:
    """The world's store over a connection of its own (Store.clone), or the shared one where
    it cannot be cloned. The clone is made from the store init() joined over (a Python
    store's clone, as SealedStore's, is lost when reached through torch's wrapper of it)."""
    root = group
    while root.parent is not None:
        root = root.parent
    shared = world_store()
    try:
        joined: Any = getattr(root, "rendezvous_store", None) or shared  # Store.clone: not in torch's stubs
        own: Store = joined.clone()
        own.check(["pybridge/own-connection"])  # a clone that cannot work fails when used
        return own
    except Exception:  # noqa: BLE001 - "not implemented": share the world's connection
        return shared


def _backend_group(backend: str, rank: int, size: int, prefix: str, timeout: float,
                   parent: Group) -> tuple[Backend, frozenset[str], Store]:
    """The communication backend of a subgroup of `parent`, built over its own store prefix.

    Not torch.distributed.new_group: with members-only creation it names groups after how
    many groups each process made before, so ranks with different histories (nested splits,
    groups of some members only) wait on different keys for ever. The subgroup is therefore
    pybridge's: its collectives go through pybridge (torch.distributed's own functions take
    the world group). Its rendezvous waits in the store over a connection of its own, made
    on the helper thread (a store host that stopped answering holds it there): a wait given
    up (a timeout, an abort) would otherwise hold the process's store client until the
    store's timeout; that connection is shut when the wait is given up. Returns the backend,
    the connections it opened (Group.sockets) and the store it was made over."""
    device = torch.cuda.current_device() if backend == "nccl" else None
    made: dict[str, frozenset[str]] = {}  # the helper's own store connection, once it has one

    def make() -> tuple[Backend, frozenset[str], Store]:
        before = _sockets.open_sockets()
        store = _own_connection(parent)
        made["connection"] = frozenset(_sockets.open_sockets() - before)
        prefixed = dist.PrefixStore(prefix, store)  # type: ignore[attr-defined]
        if backend == "nccl":
            torch.cuda.set_device(device)  # the current device is per thread
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = datetime.timedelta(seconds=timeout)
            return dist.ProcessGroupNCCL(prefixed, rank, size, opts), frozenset(), store
        before = _sockets.open_sockets()
        pg = dist.ProcessGroupGloo(prefixed, rank, size, datetime.timedelta(seconds=timeout))
        return pg, frozenset(_sockets.open_sockets() - before), store  # gloo connects its full mesh here
    return _within(timeout + SUBGROUP_GRACE_SECONDS, "creating the subgroup's backend", make, parent,
                   give_up=lambda: _sockets.shut_down(made.get("connection", ())))


SUBGROUP_GRACE_SECONDS = 2.0  # beyond the timeout, which bounds the wait for the members


def _within(seconds: float, what: str, fn: Callable[[], _T], parent: Optional[Group] = None,
            give_up: Optional[Callable[[], None]] = None) -> _T:
    """fn(), given up after `seconds` with Timeout, or with Canceled once `parent` is aborted;
    give_up() is called then, to end the helper thread's wait (shut its store connection).
    Without it (or where it cannot), the helper thread left behind ends with its store
    round trip's own timeout; its result is dropped."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
    worker = threading.Thread(target=run, name="pybridge-subgroup", daemon=True)
    worker.start()
    deadline = time.monotonic() + seconds
    try:
        while worker.is_alive() and time.monotonic() < deadline:
            worker.join(min(ABORT_POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))
            if parent is not None:
                parent.check_aborted(what)
    except Canceled:
        if give_up is not None:
            give_up()
        raise
    if worker.is_alive() and give_up is not None:
        give_up()
    if worker.is_alive():
        raise Timeout(f"{what} did not finish within {seconds:g} s: a member, or rank 0 (the "
                      "store's host), is not answering")
    if "error" in box:
        raise classify(box["error"]) from box["error"]
    value: _T = box["value"]
    return value
