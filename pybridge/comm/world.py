"""The world group's lifecycle: init() (the rendezvous, the roster, the backend), finalize()
and the parking of backends something else still holds, current() (the world, or torch's
default group adopted), from_torch(), and the small queries (rank, size, ...).

The `Group` class and subgroups' backends are group.py's, below this module. The names
that lived in group.py before still load from there (`pybridge.comm.group.init`), with a
DeprecationWarning: use `pybridge.init` and the others, or this module.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import sys
import time
import urllib.parse
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist

from . import cancel as _cancel
from . import clocksync as _clocksync
from . import group as _group
from . import rendezvous
from . import roster as _roster
from . import sockets as _sockets
from . import watchdog as _watchdog
from .group import Group
from ..base.checks import positive_seconds
from ..base import jobenv
from ..base import netif
from .. import observe as _observe
from ..errors import AlreadyInitialized, InvalidArgument, NotInitialized, PyBridgeError, classify

if TYPE_CHECKING:  # torch.distributed does not export it to a type checker
    from torch._C._distributed_c10d import Store

DEFAULT_TIMEOUT = 300.0  # seconds; bounds rendezvous and every collective
BACKENDS = ("auto", "gloo", "nccl")

_lock = _group._lock  # one lock for the tree of groups and the world
_current: Optional[Group] = None  # the live world Group, or None


env_int = jobenv.env_int  # an integer environment variable, or None (importable from here, as before)


def pick_backend(backend: Optional[str]) -> str:
    """'gloo' or 'nccl' for a backend argument ('auto', None, 'gloo', 'nccl')."""
    backend = (backend or "auto").lower()
    if backend not in BACKENDS:
        raise InvalidArgument(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    cuda = torch.cuda.is_available()
    if backend == "auto":
        return "nccl" if cuda and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and not (cuda and dist.is_nccl_available()):
        raise InvalidArgument("backend 'nccl' needs CUDA and a torch build with NCCL; use 'gloo' on CPU")
    return backend


def _rendezvous(init_method: Optional[str], master_addr: Optional[str], master_port: Optional[int]) -> str:
    if master_addr or master_port:
        if init_method not in (None, "", "env://"):
            raise InvalidArgument("give either init_method or master_addr/master_port, not both")
        addr = master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        port = master_port or env_int("MASTER_PORT")
        if not port:
            raise InvalidArgument("master_port is not given and MASTER_PORT is not set")
        return f"tcp://{addr}:{int(port)}"
    init_method = init_method or "env://"
    if not init_method.startswith(("env://", "tcp://", "file://")):
        raise InvalidArgument(f"init_method {init_method!r} must start with env://, tcp:// or file://")
    if init_method == "env://":
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing:
            raise InvalidArgument(
                f"init_method env:// needs {' and '.join(missing)} in the environment "
                "(set by pybridge-launch or torchrun), or pass master_addr/master_port")
    return init_method


def init(init_method: Optional[str] = None, backend: Optional[str] = "auto", rank: Optional[int] = None,
         world_size: Optional[int] = None, local_rank: Optional[int] = None, timeout: float = DEFAULT_TIMEOUT,
         master_addr: Optional[str] = None, master_port: Optional[int] = None, *, checked: Optional[bool] = None,
         watchdog: float | bool | None = None, store: Optional[Store] = None,
         rdzv_backend: Optional[str] = None, rdzv_endpoint: Optional[str] = None, rdzv_id: Optional[str] = None,
         rdzv_conf: Optional[Mapping[str, Any]] = None) -> Group:
    """Join the process group and return it.

    Anything not given comes from the launcher environment (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT, as torchrun and pybridge-launch set them).
    `timeout` (seconds) bounds the rendezvous and every later collective: a peer
    that never joins or stops answering yields pybridge.Timeout instead of a hang.
    Every rank publishes who it is (rank, host, pid); ranks that disagree on the world
    size all fail, and errors name ranks (docs/failures.md).

    `checked=True` (or PYBRIDGE_CHECKED=1) verifies every collective's op, dtype, count
    and root across the ranks before running it; every rank must use the same setting.
    `watchdog`: seconds a collective may be stuck before the ranks that have not reached
    it are reported to stderr; None reads PYBRIDGE_WATCHDOG, else min(60 s, timeout / 2);
    0 or False turns it off.

    `store`: rendezvous over this torch.distributed Store (a PrefixStore gives the group keys
    of its own) instead of init_method; rank and world_size must be given. Elastic training
    forms each new world this way, over a store that outlives the workers (elastic.py).

    `rdzv_backend="etcd"`, `rdzv_endpoint="h1:2379,h2:2379,h3:2379"`: rendezvous in etcd
    instead of rank 0's TCPStore, so that the store survives any one member's death
    (docs/elastic.md); `rdzv_id` names the job there, `rdzv_conf` holds etcd's TLS and
    authentication (cacert, cert, key, user, password). Unset, they come from
    PYBRIDGE_RDZV_BACKEND, PYBRIDGE_RDZV_ENDPOINT, PYBRIDGE_RDZV_ID and PYBRIDGE_ETCD_*
    (how C and Go programs and pybridge-launch --rdzv-backend etcd choose it).

    Example (on every rank, as pybridge-launch or torchrun starts them)::

        >>> import torch, pybridge
        >>> world = pybridge.init()                # RANK, WORLD_SIZE, MASTER_* from the launcher
        >>> world.rank == pybridge.rank() and world.size == pybridge.size()
        True
        >>> x = torch.ones(2)
        >>> pybridge.all_reduce(x)                 # sums over the ranks
        >>> x.tolist() == [float(world.size)] * 2
        True
        >>> pybridge.finalize()
    """
    with _cancel.joining():  # another thread may end it: pb_init_abort (Go: Init's context)
        return _init(init_method, backend, rank, world_size, local_rank, timeout, master_addr, master_port,
                     checked, watchdog, store, rdzv_backend, rdzv_endpoint, rdzv_id, rdzv_conf)


def _init(init_method: Optional[str], backend: Optional[str], rank: Optional[int], world_size: Optional[int],
          local_rank: Optional[int], timeout: float, master_addr: Optional[str], master_port: Optional[int],
          checked: Optional[bool], watchdog: float | bool | None, store: Optional[Store],
          rdzv_backend: Optional[str], rdzv_endpoint: Optional[str], rdzv_id: Optional[str],
          rdzv_conf: Optional[Mapping[str, Any]]) -> Group:
    global _current
    with _lock:
        if _current is not None or dist.is_initialized():
            raise AlreadyInitialized("process group is already initialized; call finalize() first")
        job = jobenv.detect()  # the launcher's variables, else srun's or mpirun's
        rank = job.rank if rank is None or rank < 0 else rank
        world_size = job.world_size if world_size is None or world_size < 0 else world_size
        if rank is None or world_size is None:
            raise InvalidArgument(jobenv.UNPLACED)
        if world_size < 1 or not 0 <= rank < world_size:
            raise InvalidArgument(f"rank {rank} is not within world size {world_size}")
        if local_rank is None or local_rank < 0:
            local_rank = rank if job.local_rank is None else job.local_rank
        timeout = positive_seconds("timeout", timeout)
        backend = pick_backend(backend)
        method, etcd_world = None, None
        explicit = init_method is not None or master_addr is not None or master_port is not None
        etcd = rendezvous.etcd_selected(rdzv_backend, rdzv_endpoint, store is not None or explicit)
        if etcd is None and store is None and not explicit:
            method = jobenv.rendezvous_method(job)  # srun, mpirun: the address they imply
            jobenv.choose_interface(job)  # across nodes: the interface that reaches rank 0's host
        if etcd is None and store is None and method is None:
            method = _rendezvous(init_method, master_addr, master_port)
        if method is not None and urllib.parse.urlparse(method).scheme in ("tcp", "env"):
            loopback_gloo(rendezvous.tcp_address(method)[0])
        if backend == "nccl":
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
        checked = _checked_setting(checked)
        watchdog = _watchdog.threshold(watchdog, timeout)
        if etcd is not None:  # its ranks are claimed in etcd: once every argument is checked
            store, etcd_world = rendezvous.etcd(etcd, rdzv_conf, rdzv_id, rank, world_size, timeout)
            if etcd_world.on_loopback:
                loopback_gloo("127.0.0.1")
            jobenv.choose_interface(job)
        excepthook = sys.excepthook
        roster, joined, sockets = _join(backend, method, rank, world_size, timeout, checked, watchdog, store)
        if os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"):
            # torch's hook prefixes a traceback's lines with "[rank<R>]: ", but the launcher
            # already prefixes every stderr line: keep one prefix, not two.
            sys.excepthook = excepthook
        _current = Group(dist.group.WORLD, range(world_size), rank, local_rank, backend, float(timeout),
                         owned=True, checked=checked, roster=roster)
        _current.sockets = sockets
        _cancel.formed(_current)  # an abort of this init from now on aborts the world
        # torch keeps the store only by a C++ pointer: a sealed store (base/secret.py) is a
        # Python object, which must live as long as the world does
        _current.rendezvous_store = joined
        _current.etcd_world = etcd_world  # finalize leaves it (the last rank clears the job's keys)
        _watchdog.start(_current, watchdog, lambda: _own_store(method, timeout, store, etcd_world))
        _observe_world(_current)
        return _current


def _observe_world(world: Group) -> None:
    """Start recording if asked (observe/), with this rank's clock measured against rank 0's
    once: an elastic world made again keeps the first offset."""
    rec = _observe.joined(world.rank, world.size, world.local_rank)
    if rec is not None and not rec.clock_synced:
        try:
            rec.clock_offset_us, rec.clock_uncertainty_us = _clocksync.measure(world)
        except Exception as exc:  # noqa: BLE001
            raise classify(exc) from exc
        rec.clock_synced = True


def _join(backend: str, method: Optional[str], rank: int, world_size: int, timeout: float, checked: bool,
          watchdog: float, given: Optional[Store] = None) -> tuple[Any, Store, frozenset[str]]:
    """Rendezvous, publish who this rank is and check that every rank agrees (roster.py),
    then build the backend over the same store. Returns the roster, the store and the
    backend's connections (Group.sockets: gloo connects its full mesh here)."""
    delta = datetime.timedelta(seconds=timeout)
    try:
        # pybridge builds the store: torch's own rendezvous can wait far past the timeout
        store = rendezvous.store(method, rank, world_size, timeout) if given is None else given
        roster = _roster.join(store, _roster.me(rank, world_size, checked, watchdog), timeout)
        _cancel.check("init")
        before = _sockets.open_sockets()
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=delta)
        sockets = frozenset(_sockets.open_sockets() - before)
    except PyBridgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes a typed error
        raise classify(exc) from exc
    return roster, store, sockets


def _own_store(method: Optional[str], timeout: float, given: Optional[Store] = None,
               etcd_world: Any = None) -> Optional[Store]:
    """A second connection to the rendezvous store, for the watchdog: a TCPStore client
    serializes its calls, so a blocking wait on the shared one (a subgroup's rendezvous)
    would otherwise hold the watchdog up. Other stores are shared."""
    if etcd_world is not None:
        sealed: Store = rendezvous.seal_etcd(etcd_world.another())
        return sealed
    if method is None:
        return given
    if urllib.parse.urlparse(method).scheme not in ("tcp", "env") or rendezvous.agent_hosts_store():
        return _group.world_store()
    host, port = rendezvous.tcp_address(method)
    client = dist.TCPStore(host,  # type: ignore[attr-defined]  # (not in torch.distributed's __all__)
                           port, None, False, datetime.timedelta(seconds=timeout),
                           wait_for_workers=False)
    own: Store = rendezvous.seal(client, host, "default_pg")
    return own


def loopback_gloo(host: str) -> None:
    """A job whose store is on loopback runs on one machine: gloo then listens on loopback
    too (it otherwise takes the address the hostname resolves to, which may be reachable
    from other machines), unless GLOO_SOCKET_IFNAME names an interface."""
    if os.environ.get("GLOO_SOCKET_IFNAME") or not netif.is_loopback(host):
        return
    name = netif.interface_with("127.0.0.1")
    if name:
        os.environ["GLOO_SOCKET_IFNAME"] = name


def _checked_setting(checked: Optional[bool]) -> bool:
    """checked= wins; None reads PYBRIDGE_CHECKED (1/true/yes/on or 0/false/no/off/empty)."""
    if checked is None:
        raw = os.environ.get("PYBRIDGE_CHECKED", "").strip().lower()
        if raw not in ("", "0", "false", "no", "off", "1", "true", "yes", "on"):
            raise InvalidArgument(f"environment variable PYBRIDGE_CHECKED={raw!r}: use 1 or 0")
        return raw in ("1", "true", "yes", "on")
    if not isinstance(checked, bool):
        raise InvalidArgument(f"checked must be True, False or None, got {checked!r}")
    return checked


def finalize(*, linger: Optional[float] = None, collect: bool = True) -> None:
    """Leave the process group: its subgroups are closed too. A torch group that pybridge
    adopted (see current()) is left to its owner. Safe to call when not initialized.
    linger: seconds to wait for other references to the backend to go before it is parked
    (see _free_here); collect: run the garbage collector (see below). Elastic training keeps
    a broken world's backend itself, so it passes 0 and False: a full collection takes
    0.1-0.3 s.

    Example::

        >>> import pybridge
        >>> world = pybridge.init()
        >>> pybridge.finalize()                    # subgroups are closed with it
        >>> pybridge.is_initialized(), world.closed
        (False, True)
        >>> pybridge.finalize()                    # again: nothing to leave
    """
    global _current
    _watchdog.stop(wait=linger != 0)  # linger 0: a broken elastic world, left at once
    _observe.left()
    with _lock:
        group, _current = _current, None
        if group is not None:
            group._close()
        world: list[Optional[dist.ProcessGroup]] = []
        if dist.is_initialized() and (group is None or group._owned):
            world.append(dist.group.WORLD)
            try:
                dist.destroy_process_group()
            except Exception as exc:  # noqa: BLE001
                raise classify(exc) from exc
        # Objects caught in reference cycles (autograd hooks, work handles) can still hold
        # the gloo context: free them now, not during interpreter teardown, where gloo
        # aborts the process ("terminate called without an active exception").
        if collect:
            gc.collect()
        _release_parked()
        if world:
            _free_here(world, FREE_WAIT_SECONDS if linger is None else linger)
        etcd_world = getattr(group, "etcd_world", None)
        if etcd_world is not None:
            etcd_world.leave()


FREE_WAIT_SECONDS = 0.02

# Destroyed backends that something else still held when finalize() let go of them (see
# _free_here), dropped later on a caller's thread: by the next finalize() or at exit.
_parked: list[Optional[dist.ProcessGroup]] = []


def _free_here(holder: list[Optional[dist.ProcessGroup]], seconds: float) -> None:
    """Drop a destroyed process group's reference on this thread, or park it. A future
    callback that has just run on one of gloo's worker threads (torch's PowerSGD hook keeps
    the group in its closures) releases its closure there a moment later; if that were the
    last reference, gloo would join its own thread and abort ("Resource deadlock avoided",
    seen at exit in 3 of 10 runs). So when other references remain after a short wait, the
    group is parked: its last reference then goes on a caller's thread (_release_parked).
    Waiting for them instead cost every program that still held its DDP wrapper 2 s at
    finalize, and references that only C++ holds (importing torch._dynamo, as torch.optim
    does, takes eleven on a live group) stay whatever we wait."""
    pg = holder.pop()
    deadline = time.monotonic() + seconds
    while sys.getrefcount(pg) > 2 and time.monotonic() < deadline:  # `pg` and the argument
        time.sleep(0.001)
    if sys.getrefcount(pg) > 2:
        _parked.append(pg)


def _release_parked(everything: bool = False) -> None:
    """Drop the parked groups that nothing else holds any more (each is freed here, on this
    thread); at exit, every parked reference (the interpreter's teardown frees the rest on
    the main thread, as it would have without parking)."""
    keep = [] if everything else [pg for pg in _parked if sys.getrefcount(pg) > 3]  # list, name, argument
    _parked[:] = keep


atexit.register(_release_parked, True)


def _adopt() -> Group:
    """The group of a program that called torch.distributed.init_process_group itself."""
    rank, size = dist.get_rank(), dist.get_world_size()
    local_rank = env_int("LOCAL_RANK")
    backend: str = dist.get_backend()
    backend = "nccl" if "nccl" in backend else backend
    timeout = DEFAULT_TIMEOUT
    try:  # the group's own timeout where this torch exposes it
        timeout = dist.distributed_c10d._get_default_group().options._timeout.total_seconds()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass
    return Group(dist.group.WORLD, range(size), rank, rank if local_rank is None else local_rank,
                 backend, float(timeout), owned=False)


def current() -> Group:
    """The live world group. A program (or framework) that set up torch.distributed itself
    gets torch's default group, adopted: pybridge's calls work on it, and finalize() leaves
    it alive. Raises NotInitialized when neither pybridge nor torch is initialized."""
    global _current
    group = _current
    if group is None or group.closed or _stale(group):
        with _lock:
            if (_current is None or _current.closed or _stale(_current)) and dist.is_initialized():
                _current = _adopt()
            group = _current
        if group is None:
            raise NotInitialized("process group is not initialized: call pybridge.init() first")
    return group


def _stale(group: Group) -> bool:
    """An adopted world whose torch group was destroyed and initialized again (a program, or
    torch's own tests, calling init_process_group once per run): adopt the new one."""
    return not group._owned and group.parent is None and dist.is_initialized() \
        and group.pg is not dist.group.WORLD


def from_torch(pg: Optional[dist.ProcessGroup]) -> Group:
    """The pybridge group for a torch ProcessGroup: the world for torch's default group, the
    subgroup that wraps `pg` if pybridge made it, else `pg` adopted as a subgroup of the world
    (torch's own new_group; pybridge leaves it to its owner). This process must be a member."""
    world = current()
    if pg is None or pg is dist.group.WORLD or pg is world.pg:
        return world
    if not isinstance(pg, dist.ProcessGroup):
        raise InvalidArgument(f"expected a torch.distributed ProcessGroup or a pybridge Group, got {type(pg).__name__}")
    found = _find(world, pg)
    if found is not None:
        return found
    try:
        ranks = dist.get_process_group_ranks(pg)
    except Exception as exc:  # noqa: BLE001
        raise InvalidArgument(f"torch process group {pg!r} is not known to torch.distributed "
                              f"(made by another program?): {exc}") from None
    if world.global_rank not in ranks:
        raise InvalidArgument(f"this process (global rank {world.global_rank}) is not a member of the torch "
                              f"process group of global ranks {ranks}")
    with _lock:
        # Named by its members only: the subgroup count must not depend on which torch groups
        # a rank adopted (that count names pybridge's own subgroups' store keys).
        uid = f"{world.uid}.torch-{'_'.join(map(str, ranks))}"
        backend = dist.get_backend(pg)
        child = Group(pg, ranks, world.global_rank, world.local_rank, "nccl" if "nccl" in backend else backend,
                      world.timeout, owned=False, parent=world, uid=uid)
        world._children.append(child)
    return child


def _find(group: Group, pg: dist.ProcessGroup) -> Optional[Group]:
    for child in group.children:
        if child.pg is pg:
            return child
        found = _find(child, pg)
        if found is not None:
            return found
    return None


def is_initialized() -> bool:
    return _current is not None or dist.is_initialized()


def new_group(ranks: Iterable[int], *, group: Optional[Group] = None) -> Optional[Group]:
    """A subgroup of `group` (default: the world) from ranks within it; see Group.new_group."""
    return (group or current()).new_group(ranks)


def rank() -> int:
    return current().rank


def size() -> int:
    return current().size


def local_rank() -> int:
    return current().local_rank


# ---- the names group.py held before this module (deprecated there) ------------------------

_MOVED_FROM_GROUP = ("DEFAULT_TIMEOUT", "BACKENDS", "env_int", "pick_backend", "init", "finalize", "current",
                     "from_torch", "is_initialized", "new_group", "rank", "size", "local_rank", "loopback_gloo",
                     "FREE_WAIT_SECONDS")


def _old_path(name: str) -> Any:
    """`pybridge.comm.group.init` and the others that moved here: this module's, with a
    DeprecationWarning (group.py cannot import this module, which imports it)."""
    if name not in _MOVED_FROM_GROUP:
        raise AttributeError(f"module {_group.__name__!r} has no attribute {name!r}")
    warnings.warn(f"pybridge.comm.group.{name} moved to pybridge.comm.world.{name}", DeprecationWarning, stacklevel=2)
    return globals()[name]


_group.__getattr__ = _old_path  # type: ignore[method-assign]  # the module's, for the old names
