"""Process-group setup: one default torch.distributed group per process."""

import datetime
import gc
import os
import threading

import torch
import torch.distributed as dist

from .errors import AlreadyInitialized, Closed, InvalidArgument, NotInitialized, classify

DEFAULT_TIMEOUT = 300.0  # seconds; bounds rendezvous and every collective
BACKENDS = ("auto", "gloo", "nccl")

_lock = threading.Lock()
_current = None  # the live Group, or None


class Group:
    """The initialized process group: who we are, and the torch objects behind it."""

    def __init__(self, rank, size, local_rank, backend, timeout):
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.backend = backend
        self.timeout = timeout
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
            else torch.device("cpu")
        self.pg = dist.group.WORLD
        self.closed = False

    @property
    def store(self):
        """The rendezvous key-value store (used e.g. for dynamic data partitioning)."""
        return dist.distributed_c10d._get_default_store()

    def check_open(self):
        if self.closed:
            raise Closed("process group was finalized")

    def check_rank(self, what, r, allow_self=True):
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.size:
            raise InvalidArgument(f"{what} rank {r!r} is out of range for world size {self.size}")
        if not allow_self and r == self.rank:
            raise InvalidArgument(f"{what} rank {r} is this process's own rank")

    def __repr__(self):
        state = "finalized" if self.closed else "live"
        return f"<pybridge.Group rank={self.rank}/{self.size} local_rank={self.local_rank} {self.backend} {state}>"


def _env_int(name):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidArgument(f"environment variable {name}={raw!r} is not an integer") from None


def _pick_backend(backend):
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
        port = master_port or _env_int("MASTER_PORT")
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
         timeout=DEFAULT_TIMEOUT, master_addr=None, master_port=None) -> Group:
    """Join the process group and return it.

    Anything not given comes from the launcher environment (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT, as torchrun and pybridge-launch set them).
    `timeout` (seconds) bounds the rendezvous and every later collective: a peer
    that never joins or stops answering yields pybridge.Timeout instead of a hang.
    """
    global _current
    with _lock:
        if _current is not None or dist.is_initialized():
            raise AlreadyInitialized("process group is already initialized; call finalize() first")
        rank = _env_int("RANK") if rank is None or rank < 0 else rank
        world_size = _env_int("WORLD_SIZE") if world_size is None or world_size < 0 else world_size
        if rank is None or world_size is None:
            raise InvalidArgument("rank and world size are unknown: set RANK and WORLD_SIZE "
                                  "(pybridge-launch and torchrun do) or pass them explicitly")
        if world_size < 1 or not 0 <= rank < world_size:
            raise InvalidArgument(f"rank {rank} is not within world size {world_size}")
        if local_rank is None or local_rank < 0:
            local_rank = _env_int("LOCAL_RANK")
            local_rank = rank if local_rank is None else local_rank
        if not timeout or timeout <= 0:
            raise InvalidArgument(f"timeout must be a positive number of seconds, got {timeout!r}")
        backend = _pick_backend(backend)
        method = _rendezvous(init_method, master_addr, master_port)
        if backend == "nccl":
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
        try:
            dist.init_process_group(backend, init_method=method, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a typed error
            raise classify(exc) from exc
        _current = Group(rank, world_size, local_rank, backend, float(timeout))
        return _current


def finalize():
    """Leave the process group. Safe to call when not initialized."""
    global _current
    with _lock:
        group, _current = _current, None
        if group is not None:
            group.closed = True
            # Drop our reference so destroy_process_group really frees the gloo
            # context now: one left alive until interpreter exit can abort the
            # process ("terminate called without an active exception").
            group.pg = None
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:  # noqa: BLE001
                raise classify(exc) from exc
        # Objects caught in reference cycles (autograd hooks, work handles) can still hold
        # the gloo context: free them now, not during interpreter teardown, where gloo
        # aborts the process ("terminate called without an active exception").
        gc.collect()


def current() -> Group:
    """The live group; raises NotInitialized before init() or after finalize()."""
    group = _current
    if group is None:
        raise NotInitialized("process group is not initialized: call pybridge.init() first")
    return group


def is_initialized() -> bool:
    return _current is not None


def rank() -> int:
    return current().rank


def size() -> int:
    return current().size


def local_rank() -> int:
    return current().local_rank
