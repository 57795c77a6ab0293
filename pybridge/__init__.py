"""pybridge: data-parallel training over torch.distributed for Go, C and Python programs."""

import importlib
from typing import TYPE_CHECKING

from ._version import __version__

if TYPE_CHECKING:  # what type checkers and IDEs see; _EXPORTS below must name the same (a test checks)
    from .collectives import (AVG, MAX, MIN, PRODUCT, SUM, Work, all_gather, all_reduce, all_reduce_future,
                              barrier, broadcast, irecv, isend, recv, reduce_scatter, send)
    from .errors import (AlreadyInitialized, Closed, CommError, CorruptData, InvalidArgument, InvalidState,
                         IOFailure, MembershipChanged, NotSupported, NotInitialized, PyBridgeError, Timeout,
                         WorkerFailed, WorkerTimeout)
    from .ddp import DistributedDataParallel
    from .group import Group, current, finalize, init, is_initialized, local_rank, new_group, rank, size
    from .subgroups import node_groups, split
    from .reducer import Reducer, broadcast_parameters

# The names exported here, by the module that defines them. They load on first use (PEP 562):
# the command-line tools (pybridge-launch, pybridge-capi, pybridge-recordio) import this
# package, and importing torch with it cost each of them 1.5 s of CPU before parsing a flag.
_EXPORTS = {
    "collectives": ("AVG", "MAX", "MIN", "PRODUCT", "SUM", "Work", "all_gather", "all_reduce",
                    "all_reduce_future", "barrier", "broadcast", "irecv", "isend", "recv", "reduce_scatter",
                    "send"),
    "errors": ("AlreadyInitialized", "Closed", "CommError", "CorruptData", "InvalidArgument", "InvalidState",
               "IOFailure", "MembershipChanged", "NotSupported", "NotInitialized", "PyBridgeError", "Timeout",
               "WorkerFailed", "WorkerTimeout"),
    "ddp": ("DistributedDataParallel",),
    "group": ("Group", "current", "finalize", "init", "is_initialized", "local_rank", "new_group", "rank",
              "size"),
    "subgroups": ("node_groups", "split"),
    "reducer": ("Reducer", "broadcast_parameters"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_HOME) + ["__version__"]


def __getattr__(name):
    """An exported name, or a submodule (`pybridge.elastic` after `import pybridge`, as when
    every submodule was imported eagerly), loaded on first use."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(f".{home}", __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
