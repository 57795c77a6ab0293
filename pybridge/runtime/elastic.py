"""Elastic training: the survivors of a lost rank go on, new processes join the live job
(docs/elastic.md).

  init()     joins an elastic job (the store of pybridge-launch --elastic) and forms the world
  reset()    after MembershipChanged: the world agreed on by the survivors (and joiners)
  State      what is committed, rolled back and sent to a joiner
  run(fn)    calls fn(state) again after every membership change, rolled back and re-bound

Worlds are agreed on by membership.py. A failed collective on an elastic world (a peer
died or stopped answering) tears the world down at once (so that peers blocked on this
rank fail too instead of waiting for their timeout), agrees on the next world and raises
MembershipChanged naming the lost ranks; joiners are admitted at commits.

A `State` holds what a restart needs (model, optimizer, reducer counters, loader position,
named tensors, user values) the way Horovod Elastic's TorchState does: `commit()` keeps a
copy in memory, `restore()` rolls every object back to it, `sync()` sends the committed
copy of one rank to every rank (how a joiner would receive the live state, no disk). The
copy is a checkpoint's state dict (checkpoint.state_of) with its tensors copied, so a
commit, a file checkpoint and what a joiner receives are one format, loaded by one
function (checkpoint.apply); only sync() serializes it.
"""

import functools
import os
import time
from typing import Any, Callable, Mapping, Optional, TypeVar, Union, cast

import torch

from . import checkpoint
from ..comm import cancel as _cancel
from ..comm import collectives
from ..comm import group as _group
from ..comm import world as _world
from .. import observe as _observe
from . import elastic_store as _elastic_store
from . import membership as _membership
from ..comm import sockets as _sockets
from ..errors import InvalidArgument, MembershipChanged, NotInitialized
from typing_extensions import Concatenate, ParamSpec

_P = ParamSpec("_P")
_R = TypeVar("_R")

LOST_AFTER = 10.0  # seconds without a heartbeat before a member counts as lost
JOIN_TIMEOUT = 300.0  # seconds a round may take (a joiner waits for the members' next commit)

_session: "Optional[_Session]" = None  # the live _Session: the membership and the settings every world is made with


class _Session:
    """One process's elastic job: its membership and how each world's group is made. The
    world group points here (Group.elastic), so that its failures come to failed()."""

    def __init__(self, membership: _membership.Membership, settings: dict[str, Any]) -> None:
        self.membership = membership
        self.settings = settings
        self.world: Optional[_membership.World] = None
        self.group: Optional[_group.Group] = None
        self.last_change: Optional[BaseException] = None  # the MembershipChanged of the latest reset
        self._kept: list[Any] = []  # the backends of the worlds left (see leave)
        membership.on_lost = self._neighbour_lost

    def start(self, world: _membership.World) -> _group.Group:
        """The process group of `world` (a generation), over the store's keys for it."""
        s = self.settings
        where = self.membership.where
        # sealed with the job secret where there is one: the world's roster and gloo's
        # address exchange cannot be read or redirected by an outsider
        store = where.connect(s["timeout"], f"{_membership.PREFIX}g{world.generation}/pg/")
        if where.gloo_host is not None:
            _world.loopback_gloo(where.gloo_host)
        g: _group.Group = _world.init(backend=s["backend"], rank=world.rank, world_size=world.size,
                                      local_rank=s["local_rank"], timeout=s["timeout"], store=store,
                                      checked=s["checked"], watchdog=s["watchdog"])
        g.elastic = self
        self.world, self.group = world, g
        return g

    def _neighbour_lost(self, world: _membership.World, member: Optional[dict[str, Any]], reason: str) -> None:
        """The watch thread saw a member of `world` go silent (or was told: member None):
        the world's connections are shut down, so that its calls fail now (and agree on the
        next world) instead of waiting out their timeout for a peer that will never answer."""
        g = self.group
        if g is not None and not g.closed and self.world is world:
            _sockets.shut_down(g.sockets)

    def failed(self, err: BaseException) -> MembershipChanged:
        """A collective of the current world failed: leave it and agree on the next one."""
        if isinstance(err, MembershipChanged):
            return err
        return self.change(err)

    @_observe.recorded("elastic.change", "elastic")
    def change(self, cause: Union[BaseException, str]) -> MembershipChanged:
        """Leave the current world and agree on the next one; the MembershipChanged to raise
        (timed: when it began, the old world was torn down, the new one agreed on)."""
        seen = time.time()
        self.leave()
        left = time.time()
        with _cancel.joining():  # agreeing on the next world is a join: aborting the old world's group ends it
            changed: MembershipChanged = self.membership.changed(self.world, cause=cause)
        if changed.seen_at is None:
            changed.seen_at, changed.left_at, changed.agreed_at = seen, left, time.time()
        return changed

    def leave(self) -> None:
        """Tear the current world down (its objects then fail with Closed). Its connections
        are shut down first (Group.sockets), so peers blocked on this rank fail at once."""
        g = self.group
        if g is None or g.closed:
            return
        _sockets.shut_down(g.sockets)
        # Failed works still hold the backend; if the last reference went on one of gloo's
        # threads, gloo would abort the process. Keep it here (its sockets are shut down).
        self._kept.append(g.pg)
        if _world._current is g:
            try:
                _world.finalize(linger=0, collect=False)
            except Exception:  # noqa: BLE001 - a broken world may fail to say goodbye
                g._close()
                _world._current = None


def init(*, backend: str = "auto", timeout: Optional[float] = None, min_size: Optional[int] = None,
         max_size: Optional[int] = None, lost_after: Optional[float] = None, join_timeout: Optional[float] = None,
         checked: Optional[bool] = None, watchdog: Optional[float] = None, store_addr: Optional[str] = None,
         member_id: Optional[str] = None) -> _group.Group:
    """Join an elastic job and return the world group (pybridge.init's elastic twin).

    The store comes from pybridge-launch --elastic: etcd with --rdzv-backend etcd
    (PYBRIDGE_RDZV_BACKEND, _ENDPOINT, _ID: no process of the job holds it, so any node may
    die), else MASTER_ADDR:MASTER_PORT, hosted by the launcher of node 0 (it outlives every
    worker); or `store_addr` ("host:port" of a TCPStore someone hosts). WORLD_SIZE is the first world's size (a process that comes later
    joins the running job at its next commit), RANK this process's place in it.
    timeout: bounds every collective (a stopped peer is lost after it); lost_after: seconds
    without a heartbeat before a member counts as lost; min_size / max_size: the world sizes
    allowed (PYBRIDGE_ELASTIC_MIN / _MAX); join_timeout: how long forming a world may take."""
    global _session
    if _session is not None and _session.group is not None and not _session.group.closed:
        from ..errors import AlreadyInitialized
        raise AlreadyInitialized("an elastic world is already live: call elastic.reset() after a "
                                 "MembershipChanged, or pybridge.finalize() to leave")
    if _session is not None:
        _session.membership.close()  # a world left with finalize(): this process joins anew
    env = os.environ
    where = _elastic_store.from_environment(store_addr)
    timeout = float(timeout if timeout is not None else env.get("PYBRIDGE_TIMEOUT") or _world.DEFAULT_TIMEOUT)
    settings = {"backend": backend, "timeout": timeout, "checked": checked, "watchdog": watchdog,
                "local_rank": _world.env_int("LOCAL_RANK")}
    m = _membership.Membership(
        where, member_id=member_id or env.get("PYBRIDGE_ELASTIC_ID") or None, want=_world.env_int("RANK"),
        initial=_world.env_int("WORLD_SIZE") or 1,
        min_size=min_size or _world.env_int("PYBRIDGE_ELASTIC_MIN") or 1,
        max_size=max_size or _world.env_int("PYBRIDGE_ELASTIC_MAX"),
        lost_after=float(lost_after or env.get("PYBRIDGE_ELASTIC_LOST_AFTER") or LOST_AFTER),
        timeout=float(join_timeout or env.get("PYBRIDGE_ELASTIC_JOIN_TIMEOUT") or JOIN_TIMEOUT))
    _session = _Session(m, settings)
    with _cancel.joining():  # pb_init_abort (Go: ElasticInit's context) ends it
        return _session.start(m.first_world())


@_observe.recorded("elastic.reset", "elastic")
def reset(err: Optional[BaseException] = None) -> _group.Group:
    """Move onto the world agreed on after `err` (a MembershipChanged; default: the newest
    one this process agreed on) and return its group. The old world's objects fail with
    Closed; re-bind them (Reducer.rebind, Loader.rebind) or let State.reset do it."""
    s = _live_session()
    if err is None and s.world is not None:  # the change the current world ended with (the C ABI keeps none)
        err = s.membership.change_of(s.world)
    world = err.world if isinstance(err, MembershipChanged) and err.world is not None else s.membership.world
    if world is s.world:  # checked before leaving: a reset without a change keeps the live world
        raise InvalidArgument("elastic.reset(): no new world was agreed on (reset follows a MembershipChanged)")
    s.last_change = err
    s.leave()
    with _cancel.joining():
        return s.start(cast(_membership.World, world))  # (the membership always holds a world by now)


def _live_session() -> "_Session":
    if _session is None:
        raise NotInitialized("no elastic job: call pybridge.runtime.elastic.init() first")
    return _session


def session() -> "Optional[_Session]":
    """The live elastic session, or None (a world made by pybridge.init is not elastic)."""
    return _session


def run(fn: Callable[Concatenate["State", _P], _R]) -> Callable[Concatenate["State", _P], _R]:
    """fn(state, ...) run until it returns, across membership changes (hvd.elastic.run).

    Every entry starts from one state on every rank: the first time (and for a joiner) the
    state of rank 0 is sent to all (State.sync); after a MembershipChanged the world is
    reset, the reducer and loader are re-bound, every rank rolls back to its last commit and
    takes the lowest surviving rank's. fn must start from the state (its epoch, step...),
    as a resumed run starts from a checkpoint.

    Example (under `pybridge-launch --elastic`)::

        >>> from pybridge.runtime import elastic
        >>> g = elastic.init()                                    # doctest: +SKIP
        >>> state = elastic.State(model=model, optimizer=opt, epoch=0)  # doctest: +SKIP
        >>> @elastic.run
        ... def train(state):
        ...     while state.epoch < 10:
        ...         train_one_epoch()
        ...         state.epoch += 1
        ...         state.commit()                 # what a rank that joins or survives resumes from
        >>> train(state)                                          # doctest: +SKIP
    """
    @functools.wraps(fn)
    def wrapper(state: "State", *args: _P.args, **kwargs: _P.kwargs) -> _R:
        err: Optional[MembershipChanged] = None
        while True:
            try:
                if err is None:
                    state.sync()
                else:
                    state.reset(err)
                result = fn(state, *args, **kwargs)
                _live_session().membership.finish()
                return result
            except MembershipChanged as exc:
                err = exc
    return cast(Callable[Concatenate["State", _P], _R], wrapper)  # (functools.wraps hides the signature)

_OBJECTS = ("model", "optimizer", "reducer", "loader")


class State:
    """State(model=..., optimizer=..., reducer=..., loader=..., tensors={...}, epoch=0, step=0)

    Keyword values other than the objects are user values, read and set as attributes
    (`state.epoch += 1`) and committed with the rest. The state is committed once at
    construction, so restore() always has a copy to go back to.

    Example::

        >>> import torch
        >>> from pybridge.runtime import elastic
        >>> state = elastic.State(model=torch.nn.Linear(4, 2), epoch=0, step=0)
        >>> state.step += 1
        >>> state.commit()                 # a copy in memory: nothing serialized, no disk
        >>> state.step = 99
        >>> state.restore()                # every object and value back to the commit
        >>> state.step
        1
    """

    _objects: dict[str, Any]
    values: dict[str, Any]
    commits: int
    _committed: dict[str, Any]
    _callbacks: list[Callable[[], object]]
    _serial: int
    _synced: bool
    last_sync: Optional[dict[str, Any]]

    def __init__(self, *, model: Optional[checkpoint.Stateful] = None, optimizer: Optional[checkpoint.Stateful] = None,
                 reducer: Optional[checkpoint.Stateful] = None, loader: Optional[checkpoint.Stateful] = None,
                 tensors: Optional[Mapping[str, torch.Tensor]] = None, **values: Any) -> None:
        for name in values:
            if name.startswith("_") or name in _OBJECTS or name in ("tensors", "values", "commits", "last_sync"):
                raise InvalidArgument(f"State value {name!r}: the name is taken (objects, tensors, "
                                      "values, commits, last_sync) or private")
        object.__setattr__(self, "_objects", {"model": model, "optimizer": optimizer, "reducer": reducer,
                                              "loader": loader, "tensors": dict(tensors or {})})
        object.__setattr__(self, "values", dict(values))
        object.__setattr__(self, "commits", 0)
        object.__setattr__(self, "_committed", None)
        object.__setattr__(self, "_callbacks", [])
        object.__setattr__(self, "_serial", 0)  # numbers the commits (the same on every replica)
        object.__setattr__(self, "_synced", False)  # sync() ran: the commits are the world's
        object.__setattr__(self, "last_sync", None)  # who received what in the latest sync()
        self._save()

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"State has no value {name!r} (values: {sorted(values)})")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.values:
            self.values[name] = value
        else:
            raise AttributeError(f"State has no value {name!r}: give it at construction (State({name}=...))")

    def bind(self, *, model: Optional[checkpoint.Stateful] = None, optimizer: Optional[checkpoint.Stateful] = None,
             reducer: Optional[checkpoint.Stateful] = None, loader: Optional[checkpoint.Stateful] = None,
             tensors: Optional[Mapping[str, torch.Tensor]] = None) -> None:
        """Replace the objects the state commits and restores (the C ABI binds the caller's
        tensors for the length of each call). The commits made so far stay."""
        self._objects.update(model=model, optimizer=optimizer, reducer=reducer, loader=loader,
                             tensors=dict(tensors or {}))

    def on_reset(self, fn: Callable[[], object]) -> Callable[[], object]:
        """Call fn() after every reset onto a new world (to rescale a learning rate, say)."""
        self._callbacks.append(fn)
        return fn

    @_observe.recorded("elastic.commit", "elastic")
    def commit(self, *, admit: bool = True) -> None:
        """Keep a copy of the whole state in memory (replacing the previous one). The copy
        reuses the previous commit's memory when the shapes are unchanged: a commit is a
        memory copy of the model and optimizer state, nothing is serialized. In an elastic
        world, then admits waiting joiners (MembershipChanged, see the class); admit=False
        (the same on every rank) leaves them waiting for a later commit."""
        self._save()
        s = _session
        if admit and s is not None and s.group is not None and not s.group.closed:
            _admit_joiners(s)

    def reset(self, err: Optional[BaseException] = None) -> None:
        """After MembershipChanged: move onto the new world, re-bind the reducer and loader to
        it, roll back to the last commit and take the new rank 0's (the lowest surviving old
        rank's) committed state; then the on_reset callbacks. COLLECTIVE on the new world.
        Another thread ends it with pb_init_abort (comm/cancel.py), which aborts the new world."""
        with _cancel.joining():
            g = reset(err)
            o = self._objects
            for name in ("model", "reducer", "loader"):
                if o[name] is not None and hasattr(o[name], "rebind"):
                    o[name].rebind(g)
            self.sync(0, group=g)
        for fn in self._callbacks:
            fn()

    def _save(self) -> None:
        o = self._objects
        live = checkpoint.state_of(self.commits, model=o["model"], optimizer=o["optimizer"], reducer=o["reducer"],
                                   loader=o["loader"], tensors=o["tensors"], extra=dict(self.values))
        object.__setattr__(self, "_committed", _copy(live, self._committed))
        object.__setattr__(self, "commits", self.commits + 1)
        object.__setattr__(self, "_serial", self._serial + 1)

    @property
    def committed_bytes(self) -> int:
        """The tensor bytes of the last commit (about what sync() sends)."""
        return _nbytes(self._committed)

    def restore(self) -> None:
        """Roll every object and value back to the last commit."""
        self._load(self._committed)

    def _load(self, state: dict[str, Any]) -> None:
        o = self._objects
        # load_state_dict copies out of the commit, which stays intact for the next restore.
        checkpoint.apply(state, "the committed state", model=o["model"], optimizer=o["optimizer"],
                         reducer=o["reducer"], loader=o["loader"], tensors=o["tensors"])
        object.__setattr__(self, "values", dict(state.get("extra") or {}))

    @_observe.recorded("elastic.sync", "elastic")
    def sync(self, root: int = 0, *, group: Optional[_group.Group] = None) -> None:
        """COLLECTIVE: every rank ends with rank `root`'s last commit, restored. Only ranks
        whose commit is not the root's receive it (its bytes, sent point to point): a new
        process, or a survivor that missed the root's latest commit; the others restore
        their own copy, which is the same. After a failure with no joiner nothing but one
        small all_gather crosses the network."""
        g = group or _world.current()
        root = g.check_rank("root", root)
        # A commit's serial is the same on every replica that made it (commits are collective);
        # a process that never synced has none (a negative of its own: it always receives).
        mine = self._serial if self._synced else -1 - g.rank
        serials = [row[0] for row in collectives.gather_rows([mine], group=g)] if g.size > 1 else [mine]
        needy = [r for r in range(g.size) if r != root and serials[r] != serials[root]]
        if g.rank == root and needy:
            data = torch.frombuffer(bytearray(checkpoint.to_bytes(self._committed)), dtype=torch.uint8)
            size = torch.tensor([data.numel()], dtype=torch.int64)
            for r in needy:
                collectives.send(size, r, group=g)
                collectives.send(data, r, group=g)
        elif g.rank in needy:
            size = torch.empty(1, dtype=torch.int64)
            collectives.recv(size, root, group=g)
            buf = torch.empty(int(size.item()), dtype=torch.uint8)
            collectives.recv(buf, root, group=g)
            committed = checkpoint.decode(buf.numpy().tobytes(), f"rank {root}'s state")
            object.__setattr__(self, "_committed", committed)
        object.__setattr__(self, "_serial", serials[root])
        object.__setattr__(self, "_synced", True)
        object.__setattr__(self, "last_sync", {"received": g.rank in needy, "sent_to": needy if g.rank == root else []})
        self._load(self._committed)


def _admit_joiners(s: _Session) -> None:
    """Rank 0 reads how many processes wait to join; all ranks learn it in one broadcast."""
    g = s.group
    assert g is not None  # (a commit admits only in a live world)
    n = torch.tensor([s.membership.joiners_waiting(s.world) if g.rank == 0 else 0], dtype=torch.int64,
                     device=g.device)
    if g.size > 1:
        collectives.broadcast(n, 0, group=g)
    if int(n.item()) > 0:
        raise s.change(f"{int(n.item())} process(es) asked to join at a commit")


def _copy(live: Any, old: Any) -> Any:
    """A copy of `live` (dicts, lists, tuples, tensors, plain values), written into `old`'s
    tensors where they match in shape, dtype and device (no new memory), else cloned."""
    if isinstance(live, torch.Tensor):
        if isinstance(old, torch.Tensor) and old.shape == live.shape and old.dtype == live.dtype \
                and old.device == live.device:
            return old.copy_(live.detach())
        return live.detach().clone()
    if isinstance(live, dict):
        old = old if isinstance(old, dict) else {}
        return {k: _copy(v, old.get(k)) for k, v in live.items()}
    if isinstance(live, (list, tuple)):
        old = old if isinstance(old, type(live)) and len(old) == len(live) else [None] * len(live)
        return type(live)(_copy(v, o) for v, o in zip(live, old))
    return live


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


__all__ = ["State", "init", "reset", "run", "session"]
