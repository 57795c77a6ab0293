"""Error types of the core. Each carries the status code the C ABI returns for it."""

from typing import Any, Optional, Sequence

from . import abi

# Status codes: the header's PB_OK and PB_ERR_* (pybridge/abi.py is generated from it).
OK = abi.PB_OK
INVALID_ARGUMENT = abi.PB_ERR_INVALID_ARGUMENT
NOT_INITIALIZED = abi.PB_ERR_NOT_INITIALIZED
ALREADY_INITIALIZED = abi.PB_ERR_ALREADY_INITIALIZED
TIMEOUT = abi.PB_ERR_TIMEOUT
COMM = abi.PB_ERR_COMM
IO = abi.PB_ERR_IO
CORRUPT = abi.PB_ERR_CORRUPT
INTERNAL = abi.PB_ERR_INTERNAL
CLOSED = abi.PB_ERR_CLOSED
MEMBERSHIP = abi.PB_ERR_MEMBERSHIP
CANCELED = abi.PB_ERR_CANCELED


class PyBridgeError(Exception):
    """Base class; `code` is the C ABI status for this failure."""

    code = INTERNAL


class InvalidArgument(PyBridgeError, ValueError):
    code = INVALID_ARGUMENT


class NotSupported(InvalidArgument, NotImplementedError):
    """A feature pybridge does not offer (a torch DDP keyword, say); the message says why.
    Also a NotImplementedError, so code written for torch that catches RuntimeError catches it."""


class InvalidState(InvalidArgument, RuntimeError):
    """A call that is wrong here, where torch DDP raises RuntimeError: a module without a
    parameter that requires a gradient, _set_static_graph() after training started, gradients
    that never arrived. An InvalidArgument for C and Go, a RuntimeError for torch's callers."""


class NotInitialized(PyBridgeError, RuntimeError):
    code = NOT_INITIALIZED


class AlreadyInitialized(PyBridgeError, RuntimeError):
    code = ALREADY_INITIALIZED


class Timeout(PyBridgeError, TimeoutError):
    code = TIMEOUT


class CommError(PyBridgeError, RuntimeError):
    """A peer failed or the connection to it broke."""

    code = COMM


class IOFailure(PyBridgeError, OSError):
    code = IO


class CorruptData(PyBridgeError, ValueError):
    code = CORRUPT


class Closed(PyBridgeError, RuntimeError):
    """The object (group, work, buffer...) was already closed."""

    code = CLOSED


class Canceled(PyBridgeError, RuntimeError):
    """A call that waited on other processes was ended from another thread: its group was
    aborted (Group.abort; Go: the call's context ended), or the init or elastic reset it
    was part of was (comm/cancel.py). The group is of no further use: its later calls raise
    Closed, naming the reason."""

    code = CANCELED


class MembershipChanged(CommError):
    """Elastic training (pybridge.runtime.elastic): the world changed. Ranks were lost (a peer died
    or stopped answering during a collective, the reducer or a barrier) or new ranks are
    waiting to join (raised by a commit). The new world is already agreed on when this is
    raised: `lost` are the old ranks that are gone (with `lost_names`, who they were),
    `joined` how many new processes join, `old_size` / `new_size` the world sizes and
    `generation` the new world's number. Every object of the old world now fails with
    Closed; elastic.reset() (or State.reset, or the run helper) moves onto the new one."""

    code = MEMBERSHIP

    def __init__(self, message: str, *, lost: Sequence[int] = (), lost_names: Sequence[str] = (), joined: int = 0,
                 old_size: int = 0, new_size: int = 0, generation: int = 0, world: Any = None) -> None:
        super().__init__(message)
        self.lost = list(lost)
        self.lost_names = list(lost_names)
        self.joined = joined
        self.old_size = old_size
        self.new_size = new_size
        self.generation = generation
        self.world = world  # membership.World: the agreed next world
        # time.time() when the failure (or the joiners at a commit) was seen here, the old
        # world torn down, the new one agreed on: for benchmarks and logs
        self.seen_at: Optional[float] = None
        self.left_at: Optional[float] = None
        self.agreed_at: Optional[float] = None


_TIMEOUT_WORDS = ("timed out", "timeout", "time out", "deadline")
_COMM_WORDS = ("connection", "closed by peer", "reset by peer", "broken pipe", "gloo",
               "nccl", "socket", "peer", "unreachable", "refused")


def classify(exc: BaseException) -> PyBridgeError:
    """Map an exception raised by torch.distributed (or anything else) to a PyBridgeError.

    torch reports most distributed failures as RuntimeError subclasses whose only
    reliable distinction is the message, so the message decides timeout vs. comm failure.
    """
    if isinstance(exc, PyBridgeError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    err: PyBridgeError
    if isinstance(exc, TimeoutError) or any(w in low for w in _TIMEOUT_WORDS):
        err = Timeout(text)
    elif any(w in low for w in _COMM_WORDS) or type(exc).__name__.startswith("Dist"):
        err = CommError(text)
    elif isinstance(exc, (ValueError, TypeError)):
        err = InvalidArgument(text)
    elif isinstance(exc, OSError):
        err = IOFailure(text)
    else:
        err = PyBridgeError(text)
    err.__cause__ = exc
    return err


class WorkerFailed(CommError):
    """A federated worker died, lost its connection or its training function raised while it
    held a client. `worker` is its rank in the federated group, `client` the client it held
    (None when it held none)."""

    def __init__(self, message: str, worker: Optional[int] = None, client: Optional[int] = None,
                 round: Optional[int] = None) -> None:
        super().__init__(message)
        self.worker = worker
        self.client = client
        self.round = round  # the server's round it happened in, where known


class WorkerTimeout(WorkerFailed, Timeout):
    """A federated worker did not return its client's result within the server's timeout."""

    code = TIMEOUT


class UpdateRefused(WorkerFailed, CorruptData):
    """The federated server refused a client's update (NaN or Inf elements, or a norm past
    the server's bound): `worker`, `client` and `round` name it. The worker itself is fine."""

    code = CORRUPT
