"""Data-parallel training: the reducer (gradient buckets and their asynchronous reduction
through a comm hook), Join for uneven inputs, and the torch DistributedDataParallel
drop-in (`pybridge.ddp.DistributedDataParallel`, the same as
`pybridge.DistributedDataParallel`)."""

from .wrapper import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
