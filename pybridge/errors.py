"""Error types of the core. Each carries the status code the C ABI returns for it."""

# Status codes, mirrored by capi/pybridge.h (PB_OK, PB_ERR_*). Keep the two in step.
OK = 0
INVALID_ARGUMENT = -1
NOT_INITIALIZED = -2
ALREADY_INITIALIZED = -3
TIMEOUT = -4
COMM = -5
IO = -6
CORRUPT = -7
INTERNAL = -8
CLOSED = -9


class PyBridgeError(Exception):
    """Base class; `code` is the C ABI status for this failure."""

    code = INTERNAL


class InvalidArgument(PyBridgeError, ValueError):
    code = INVALID_ARGUMENT


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
