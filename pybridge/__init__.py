"""pybridge: data-parallel training over torch.distributed for Go, C and Python programs.

The package is one subpackage per layer, each importing only the layers below it
(docs/design.md, tests/test_layers.py): base, comm, algorithms, ddp, runtime, recordio,
federated, launch, capi (the Python side of the C ABI) and cbuild (building the C library).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import TYPE_CHECKING

from ._version import __version__ as __version__

if TYPE_CHECKING:  # what type checkers and IDEs see; _EXPORTS below must name the same (a test checks)
    # `X as X`: re-exported, so a user's checker in strict mode (no implicit re-export) accepts pybridge.X
    from .comm.collectives import (AVG as AVG, MAX as MAX, MIN as MIN, PRODUCT as PRODUCT, SUM as SUM, Work as Work,
                                   all_gather as all_gather, all_reduce as all_reduce,
                                   all_reduce_future as all_reduce_future, barrier as barrier, broadcast as broadcast,
                                   irecv as irecv, isend as isend, recv as recv, reduce_scatter as reduce_scatter,
                                   send as send)
    from .errors import (AlreadyInitialized as AlreadyInitialized, Canceled as Canceled, Closed as Closed,
                         CommError as CommError,
                         CorruptData as CorruptData, InvalidArgument as InvalidArgument, InvalidState as InvalidState,
                         IOFailure as IOFailure, MembershipChanged as MembershipChanged, NotSupported as NotSupported,
                         NotInitialized as NotInitialized, PyBridgeError as PyBridgeError, Timeout as Timeout,
                         WorkerFailed as WorkerFailed, WorkerTimeout as WorkerTimeout)
    from .ddp.wrapper import DistributedDataParallel as DistributedDataParallel
    from .comm.group import Group as Group
    from .comm.world import (current as current, finalize as finalize, init as init,
                             is_initialized as is_initialized, local_rank as local_rank, new_group as new_group,
                             rank as rank, size as size)
    from .comm.subgroups import (node_groups as node_groups, split as split)
    from .ddp.reducer import Reducer as Reducer
    from .comm.params import broadcast_parameters as broadcast_parameters
    from .base.jobenv import env as env
    from .algorithms.comm_hooks import register_comm_hook as register_comm_hook

# The names exported here, by the module that defines them. They load on first use (PEP 562):
# the command-line tools (pybridge-launch, pybridge-capi, pybridge-recordio) import this
# package, and importing torch with it cost each of them 1.5 s of CPU before parsing a flag.
_EXPORTS = {
    "comm.collectives": ("AVG", "MAX", "MIN", "PRODUCT", "SUM", "Work", "all_gather", "all_reduce",
                         "all_reduce_future", "barrier", "broadcast", "irecv", "isend", "recv", "reduce_scatter",
                         "send"),
    "errors": ("AlreadyInitialized", "Canceled", "Closed", "CommError", "CorruptData", "InvalidArgument", "InvalidState",
               "IOFailure", "MembershipChanged", "NotSupported", "NotInitialized", "PyBridgeError", "Timeout",
               "WorkerFailed", "WorkerTimeout"),
    "ddp.wrapper": ("DistributedDataParallel",),
    "comm.group": ("Group",),
    "comm.world": ("current", "finalize", "init", "is_initialized", "local_rank", "new_group", "rank", "size"),
    "comm.subgroups": ("node_groups", "split"),
    "ddp.reducer": ("Reducer",),
    "comm.params": ("broadcast_parameters",),
    "base.jobenv": ("env",),
    "algorithms.comm_hooks": ("register_comm_hook",),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}

# Modules that sat directly in pybridge/ before the layer subpackages (CHANGELOG, 0.2.0): the
# old paths (`import pybridge.reducer`, `from pybridge import comm_hooks`) still load the
# module from its new home, with a DeprecationWarning.
MOVED = {
    "checks": "base.checks", "dtypes": "base.dtypes", "buffers": "base.buffers", "dlpack": "base.dlpack",
    "netif": "base.netif", "progress": "base.progress", "shuffle": "base.shuffle",
    "group": "comm.group", "subgroups": "comm.subgroups", "collectives": "comm.collectives",
    "checked": "comm.checked", "watchdog": "comm.watchdog", "roster": "comm.roster",
    "rendezvous": "comm.rendezvous", "agree": "base.agree", "streams": "comm.streams", "sockets": "comm.sockets",
    "comm_hooks": "algorithms.comm_hooks", "gossip": "algorithms.gossip",
    "gossip_schedule": "algorithms.gossip_schedule", "hierarchical": "algorithms.hierarchical",
    "hook_thread": "algorithms.hook_thread", "local_sgd": "algorithms.local_sgd",
    "reducer": "ddp.reducer", "ddp_options": "ddp.options", "ddp_stats": "ddp.stats", "join": "ddp.join",
    "checkpoint": "runtime.checkpoint", "elastic": "runtime.elastic", "membership": "runtime.membership",
    "launch_elastic": "launch.elastic", "exit_clock": "launch.exits",
    "libtorch": "capi.libtorch", "cluster": "testing.cluster",
}

__all__ = sorted(_HOME) + ["__version__"]


def _moved(old):
    new = f"{__name__}.{MOVED[old]}"
    warnings.warn(f"{__name__}.{old} moved to {new}", DeprecationWarning, stacklevel=3)
    return importlib.import_module(new)


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import pybridge.reducer` and the like: the module of the new path, under both names."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, old = fullname.rpartition(".")
        if package != __name__ or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = _moved(spec.name.rpartition(".")[2])
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module):
        # the import system has just set __spec__ to the old name's spec: give the module its own back
        module.__spec__ = self._own_spec


sys.meta_path.append(_OldPaths())


def __getattr__(name):
    """An exported name, or a submodule (`pybridge.recordio` after `import pybridge`, as when
    every submodule was imported eagerly), loaded on first use."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(f".{home}", __name__), name)
    elif name in MOVED:
        return _moved(name)  # not cached: each use of an old path warns
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
