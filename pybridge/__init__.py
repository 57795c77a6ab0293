"""pybridge: data-parallel training over torch.distributed for Go, C and Python programs."""

from .collectives import (AVG, MAX, MIN, PRODUCT, SUM, Work, all_gather, all_reduce, all_reduce_future,
                          barrier, broadcast, irecv, isend, recv, reduce_scatter, send)
from .errors import (AlreadyInitialized, Closed, CommError, CorruptData, InvalidArgument, InvalidState,
                     IOFailure, MembershipChanged, NotSupported, NotInitialized, PyBridgeError, Timeout,
                     WorkerFailed, WorkerTimeout)
from .ddp import DistributedDataParallel
from .group import Group, current, finalize, init, is_initialized, local_rank, new_group, rank, size
from .subgroups import node_groups, split
from .reducer import Reducer, broadcast_parameters

from ._version import __version__
