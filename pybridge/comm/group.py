"""Process groups: the world (created by init() or adopted from torch) and its subgroups.

This module sits below collectives.py: it builds groups and their backends but issues no
collective. Creation that needs one (split, node_groups) lives in subgroups.py, above the
collectives; Group.split imports it when called.
"""

import atexit
import datetime
import gc
import os
import sys
import threading
import time
import urllib.parse
import warnings

import torch
import torch.distributed as dist

from . import checked as _checked
from . import clocksync as _clocksync
from . import rendezvous
from . import streams as _streams
from . import roster as _roster
from . import watchdog as _watchdog
from ..base.checks import index, positive_seconds
from ..base import jobenv
from ..base import netif
from .. import observe as _observe
from ..errors import AlreadyInitialized, Closed, InvalidArgument, NotInitialized, PyBridgeError, Timeout, classify

DEFAULT_TIMEOUT = 300.0  # seconds; bounds rendezvous and every collective
BACKENDS = ("auto", "gloo", "nccl")

_lock = threading.Lock()
_current = None  # the live Group, or None


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

    def __init__(self, pg, ranks, global_rank, local_rank, backend, timeout, *, owned, parent=None,
                 uid=None, checked=False, roster=None):
        self.pg = pg
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
        self.stream = None  # the CUDA stream calls are ordered on; None: the current one (streams.py)
        self._owned = owned  # pybridge created the torch group, so pybridge destroys it
        self._children = []
        self._created = 0  # subgroups made from this one so far: names the next one's store keys
        self.uid = "w" if parent is None else uid  # the same on every member
        self._store = None
        # Reliability (docs/failures.md): checked mode, who every rank is, and progress.
        self.checked = parent.checked if parent is not None else checked
        self.roster = parent.roster if parent is not None else roster  # by global rank, or None
        self.progress = _watchdog.Progress(parent.progress if parent is not None else None)
        self.checks = _checked.State(self.device) if self.checked else None
        # Elastic training (elastic.py): the world's link to its membership, None otherwise.
        self.elastic = parent.elastic if parent is not None else None

    @property
    def issued(self):
        """Collectives started on this group so far (they are "#1" ... "#issued" in errors)."""
        return self.progress.issued

    @property
    def children(self):
        """The live subgroups made from this one (a copy)."""
        with _lock:
            return tuple(self._children)

    # Deprecated: state that Group used to carry for the watchdog and checked mode.
    inflight = property(lambda self: _deprecated(
        "inflight", "Group.progress (the watchdog's)",
        self.progress.snapshot()[1] if self.progress.watched else None))
    fingerprint_buffer = property(lambda self: _deprecated("fingerprint_buffer", "Group.checks (checked mode's)", None))
    p2p = property(lambda self: _deprecated("p2p", "Group.checks (checked mode's)", {}))

    @property
    def store(self):
        """A key-value store shared by the members (the rendezvous store; a subgroup's keys
        get a prefix of their own). Used e.g. for dynamic data partitioning."""
        if self._store is None:
            store = world_store()
            self._store = store if self.parent is None else dist.PrefixStore(f"pybridge/{self.uid}/data/", store)
        return self._store

    def check_open(self):
        if self.closed:
            raise Closed("process group was finalized" if self.parent is None else
                         "process group was closed (or its world group was finalized)")
        if not self._owned and self.parent is None and not dist.is_initialized():
            raise Closed("the adopted torch.distributed group was destroyed")

    def check_rank(self, what, r, allow_self=True):
        """`r` as a rank within this group (InvalidArgument naming `what` otherwise)."""
        r = index(f"{what} rank", r, self.size, f"a group of size {self.size}")
        if not allow_self and r == self.rank:
            raise InvalidArgument(f"{what} rank {r} is this process's own rank")
        return r

    def global_rank_of(self, group_rank):
        """The global rank of member `group_rank`."""
        return self.ranks[self.check_rank("group", group_rank)]

    def group_rank_of(self, global_rank):
        """The rank within this group of the process with global rank `global_rank`."""
        r = self._rank_of.get(global_rank) if isinstance(global_rank, int) else None
        if r is None or isinstance(global_rank, bool):
            raise InvalidArgument(f"global rank {global_rank!r} is not a member of this group "
                                  f"(members: global ranks {list(self.ranks)})")
        return r

    def who(self, group_rank):
        """'rank 1 (host a, pid 42)' for a member (its global rank in a subgroup)."""
        g = self.ranks[group_rank]
        entry = self.roster[g] if self.roster else g
        text = _roster.describe(entry)
        return text if self.parent is None else f"{text} (group rank {group_rank})"

    def describe(self):
        return "the world group" if self.parent is None else f"group {self.uid}"

    def set_stream(self, stream):
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

    def new_group(self, ranks):
        """A subgroup of the members with these ranks (ranks within this group), ranked in
        that order. As torch's new_group, every member of this group calls it (members of the
        new one wait for each other; the others get None at once) in the same order as their
        other group creations from this group.
        """
        self.check_open()
        return self.subgroup(_member_list(ranks, self.size))

    def subgroup(self, members, *, timeout=None, backend=None):
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
        pg = _backend_group(backend, members.index(self.rank), len(global_ranks),
                            dist.PrefixStore(f"pybridge/{uid}/pg/", world_store()), timeout)
        child = Group(pg, global_ranks, self.global_rank, self.local_rank, backend,
                      timeout, owned=True, parent=self, uid=uid)
        with _lock:
            self._children.append(child)
        return child

    def close(self):
        """Free a subgroup (and its own subgroups). The world group is left with finalize()."""
        if self.parent is None:
            raise InvalidArgument("close() frees subgroups; leave the world group with finalize()")
        with _lock:
            self._close()
            if self in self.parent._children:
                self.parent._children.remove(self)

    def _close(self):
        """Mark closed, children first, and destroy the torch groups pybridge created."""
        for child in self._children:
            child._close()
        self._children = []
        if self.closed:
            return
        self.closed = True
        self.pg = None  # a subgroup's backend is ours alone: dropping it frees it (see finalize)

    def __repr__(self):
        state = "closed" if self.closed else "live"
        kind = "world" if self.parent is None else f"subgroup of global ranks {list(self.ranks)}"
        return (f"<pybridge.Group rank={self.rank}/{self.size} {kind} local_rank={self.local_rank} "
                f"{self.backend} {state}>")


def _deprecated(name, owner, value):
    warnings.warn(f"Group.{name} is deprecated: its state moved to {owner}", DeprecationWarning, stacklevel=3)
    return value


def _member_list(ranks, size):
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


def world_store():
    """The world's rendezvous store (no prefix): subgroups' backends and checked mode's
    point-to-point fingerprints meet there."""
    return dist.distributed_c10d._get_default_store()


def _backend_group(backend, rank, size, store, timeout):
    """The communication backend of a subgroup, built over its own store prefix.

    Not torch.distributed.new_group: with members-only creation it names groups after how
    many groups each process made before, so ranks with different histories (nested splits,
    groups of some members only) wait on different keys for ever. The subgroup is therefore
    pybridge's: its collectives go through pybridge (torch.distributed's own functions take
    the world group)."""
    device = torch.cuda.current_device() if backend == "nccl" else None

    def make():
        if backend == "nccl":
            torch.cuda.set_device(device)  # the current device is per thread
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = datetime.timedelta(seconds=timeout)
            return dist.ProcessGroupNCCL(store, rank, size, opts)
        return dist.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=timeout))
    return _within(timeout + SUBGROUP_GRACE_SECONDS, "creating the subgroup's backend", make)


SUBGROUP_GRACE_SECONDS = 2.0  # beyond the timeout, which bounds the wait for the members


def _within(seconds, what, fn):
    """fn(), given up after `seconds` with Timeout. Its rendezvous can make several store round
    trips that each wait up to the timeout when the store's host stops answering; the helper
    thread left behind ends with that round trip's own timeout and its result is dropped."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
    worker = threading.Thread(target=run, name="pybridge-subgroup", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise Timeout(f"{what} did not finish within {seconds:g} s: a member, or rank 0 (the "
                      "store's host), is not answering")
    if "error" in box:
        raise classify(box["error"]) from box["error"]
    return box["value"]


env_int = jobenv.env_int  # an integer environment variable, or None (importable from here, as before)


def pick_backend(backend):
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


def _rendezvous(init_method, master_addr, master_port):
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


def init(init_method=None, backend="auto", rank=None, world_size=None, local_rank=None,
         timeout=DEFAULT_TIMEOUT, master_addr=None, master_port=None, *, checked=None,
         watchdog=None, store=None, rdzv_backend=None, rdzv_endpoint=None, rdzv_id=None,
         rdzv_conf=None) -> Group:
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
    """
    global _current
    with _lock:
        if _current is not None or dist.is_initialized():
            raise AlreadyInitialized("process group is already initialized; call finalize() first")
        job = jobenv.detect()  # the launcher's variables, else srun's or mpirun's
        rank = job.rank if rank is None or rank < 0 else rank
        world_size = job.world_size if world_size is None or world_size < 0 else world_size
        if rank is None or world_size is None:
            raise InvalidArgument("rank and world size are unknown: set RANK and WORLD_SIZE "
                                  "(pybridge-launch and torchrun do), start the ranks with srun or mpirun, "
                                  "or pass them explicitly")
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
        roster, joined = _join(backend, method, rank, world_size, timeout, checked, watchdog, store)
        if os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"):
            # torch's hook prefixes a traceback's lines with "[rank<R>]: ", but the launcher
            # already prefixes every stderr line: keep one prefix, not two.
            sys.excepthook = excepthook
        _current = Group(dist.group.WORLD, range(world_size), rank, local_rank, backend, float(timeout),
                         owned=True, checked=checked, roster=roster)
        # torch keeps the store only by a C++ pointer: a sealed store (base/secret.py) is a
        # Python object, which must live as long as the world does
        _current.rendezvous_store = joined
        _current.etcd_world = etcd_world  # finalize leaves it (the last rank clears the job's keys)
        _watchdog.start(_current, watchdog, lambda: _own_store(method, timeout, store, etcd_world))
        _observe_world(_current)
        return _current


def _observe_world(world):
    """Start recording if asked (observe/), with this rank's clock measured against rank 0's
    once: an elastic world made again keeps the first offset."""
    rec = _observe.joined(world.rank, world.size, world.local_rank)
    if rec is not None and not rec.clock_synced:
        try:
            rec.clock_offset_us, rec.clock_uncertainty_us = _clocksync.measure(world)
        except Exception as exc:  # noqa: BLE001
            raise classify(exc) from exc
        rec.clock_synced = True


def _join(backend, method, rank, world_size, timeout, checked, watchdog, given=None):
    """Rendezvous, publish who this rank is and check that every rank agrees (roster.py),
    then build the backend over the same store. Returns the roster and the store."""
    delta = datetime.timedelta(seconds=timeout)
    try:
        # pybridge builds the store: torch's own rendezvous can wait far past the timeout
        store = rendezvous.store(method, rank, world_size, timeout) if given is None else given
        roster = _roster.join(store, _roster.me(rank, world_size, checked, watchdog), timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=delta)
    except PyBridgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes a typed error
        raise classify(exc) from exc
    return roster, store


def _own_store(method, timeout, given=None, etcd_world=None):
    """A second connection to the rendezvous store, for the watchdog: a TCPStore client
    serializes its calls, so a blocking wait on the shared one (a subgroup's rendezvous)
    would otherwise hold the watchdog up. Other stores are shared."""
    if etcd_world is not None:
        return rendezvous.seal_etcd(etcd_world.another())
    if method is None:
        return given
    if urllib.parse.urlparse(method).scheme not in ("tcp", "env") or rendezvous.agent_hosts_store():
        return world_store()
    host, port = rendezvous.tcp_address(method)
    client = dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=timeout),
                           wait_for_workers=False)
    return rendezvous.seal(client, host, "default_pg")


def loopback_gloo(host):
    """A job whose store is on loopback runs on one machine: gloo then listens on loopback
    too (it otherwise takes the address the hostname resolves to, which may be reachable
    from other machines), unless GLOO_SOCKET_IFNAME names an interface."""
    if os.environ.get("GLOO_SOCKET_IFNAME") or not netif.is_loopback(host):
        return
    name = netif.interface_with("127.0.0.1")
    if name:
        os.environ["GLOO_SOCKET_IFNAME"] = name


def _checked_setting(checked):
    """checked= wins; None reads PYBRIDGE_CHECKED (1/true/yes/on or 0/false/no/off/empty)."""
    if checked is None:
        raw = os.environ.get("PYBRIDGE_CHECKED", "").strip().lower()
        if raw not in ("", "0", "false", "no", "off", "1", "true", "yes", "on"):
            raise InvalidArgument(f"environment variable PYBRIDGE_CHECKED={raw!r}: use 1 or 0")
        return raw in ("1", "true", "yes", "on")
    if not isinstance(checked, bool):
        raise InvalidArgument(f"checked must be True, False or None, got {checked!r}")
    return checked


def finalize(*, linger=None, collect=True):
    """Leave the process group: its subgroups are closed too. A torch group that pybridge
    adopted (see current()) is left to its owner. Safe to call when not initialized.
    linger: seconds to wait for other references to the backend to go before it is parked
    (see _free_here); collect: run the garbage collector (see below). Elastic training keeps
    a broken world's backend itself, so it passes 0 and False: a full collection takes
    0.1-0.3 s."""
    global _current
    _watchdog.stop()
    _observe.left()
    with _lock:
        group, _current = _current, None
        if group is not None:
            group._close()
        world = []
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
        if getattr(group, "etcd_world", None) is not None:
            group.etcd_world.leave()


FREE_WAIT_SECONDS = 0.02

# Destroyed backends that something else still held when finalize() let go of them (see
# _free_here), dropped later on a caller's thread: by the next finalize() or at exit.
_parked = []


def _free_here(holder, seconds):
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


def _release_parked(everything=False):
    """Drop the parked groups that nothing else holds any more (each is freed here, on this
    thread); at exit, every parked reference (the interpreter's teardown frees the rest on
    the main thread, as it would have without parking)."""
    keep = [] if everything else [pg for pg in _parked if sys.getrefcount(pg) > 3]  # list, name, argument
    _parked[:] = keep


atexit.register(_release_parked, True)


def _adopt():
    """The group of a program that called torch.distributed.init_process_group itself."""
    rank, size = dist.get_rank(), dist.get_world_size()
    local_rank = env_int("LOCAL_RANK")
    backend = dist.get_backend()
    backend = "nccl" if "nccl" in backend else backend
    timeout = DEFAULT_TIMEOUT
    try:  # the group's own timeout where this torch exposes it
        timeout = dist.distributed_c10d._get_default_group().options._timeout.total_seconds()
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


def _stale(group):
    """An adopted world whose torch group was destroyed and initialized again (a program, or
    torch's own tests, calling init_process_group once per run): adopt the new one."""
    return not group._owned and group.parent is None and dist.is_initialized() \
        and group.pg is not dist.group.WORLD


def from_torch(pg) -> Group:
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


def _find(group, pg):
    for child in group.children:
        if child.pg is pg:
            return child
        found = _find(child, pg)
        if found is not None:
            return found
    return None


def is_initialized() -> bool:
    return _current is not None or dist.is_initialized()


def new_group(ranks, *, group=None):
    """A subgroup of `group` (default: the world) from ranks within it; see Group.new_group."""
    return (group or current()).new_group(ranks)


def rank() -> int:
    return current().rank


def size() -> int:
    return current().size


def local_rank() -> int:
    return current().local_rank
