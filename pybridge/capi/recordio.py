"""C ABI functions for the RecordIO loader (capi/pybridge.h, section "RecordIO loader").

Conversion only: arguments become a recordio.Loader, batches become pointers into the
Batch's own arrays. The handle keeps the current Batch alive, so its pointers stay valid
until the next pb_loader_next or pb_loader_close (the data may view a pooled chunk buffer).
"""

import numpy as np

from .. import abi, capi
from ..comm import group as _group
from ..base.checks import integer
from ..errors import Closed, InvalidArgument
from ..recordio import Loader
from ..recordio.partition import LocalStore
from . import flag, handles, put, text

PARTITIONS = {abi.PB_PARTITION_STATIC: "static", abi.PB_PARTITION_DYNAMIC: "dynamic"}
_EMPTY_OFFSETS = np.zeros(1, np.int64)


class LoaderHandle:
    """What a pb_loader handle names: the loader and the batch whose pointers C holds."""

    def __init__(self, loader):
        self.loader = loader
        self.batch = None
        self.closed = False

    def live(self):
        if self.closed:
            raise Closed("loader is closed")
        return self.loader


def _loader(ptr):
    return handles.get(ptr, LoaderHandle, "loader")


def _files(files, nfiles):
    integer("nfiles", nfiles, low=1, expected="at least 1")
    if files == capi.ffi.NULL:
        raise InvalidArgument("files is NULL")
    out = []
    for i in range(nfiles):
        name = text(files[i])
        if not name:
            raise InvalidArgument(f"files[{i}] is NULL or empty")
        out.append(name)
    return out


def pb_loader_open(group, files, nfiles, batch_size, partition, shuffle, seed, drop_last,
                   skip_corrupt, out):
    if out == capi.ffi.NULL:
        raise InvalidArgument("out (the pointer to store the loader handle in) is NULL")
    if partition not in PARTITIONS:
        raise InvalidArgument(f"partition must be PB_PARTITION_STATIC (0) or PB_PARTITION_DYNAMIC (1), "
                              f"got {partition}")
    paths = _files(files, nfiles)
    if group == capi.ffi.NULL:  # a single process: rank 0 of 1, whatever group may be live
        g, replicas, rank, store = None, 1, 0, LocalStore()
    else:
        g = handles.get(group, _group.Group, "group")
        g.check_open()
        replicas = rank = store = None  # the group's
    loader = Loader(paths, batch_size, partition=PARTITIONS[partition], group=g, num_replicas=replicas,
                    rank=rank, store=store, shuffle=flag(shuffle, "shuffle"), seed=seed,
                    drop_last=flag(drop_last, "drop_last"),
                    skip_corrupt=flag(skip_corrupt, "skip_corrupt"))
    try:
        handles.add(LoaderHandle(loader), "pb_loader *", out)
    except BaseException:
        loader.close()
        raise


def pb_loader_next(loader, data, offsets, count, has_batch):
    h = _loader(loader)
    for ptr, what in ((data, "data"), (offsets, "offsets"), (count, "count"), (has_batch, "has_batch")):
        if ptr == capi.ffi.NULL:
            raise InvalidArgument(f"{what} is NULL")
    ld = h.live()
    h.batch = None  # the previous batch's pointers are invalid from here on
    data[0], offsets[0], count[0], has_batch[0] = capi.ffi.NULL, capi.ffi.NULL, 0, 0
    batch = ld.next_batch()
    while batch is not None and len(batch) == 0:  # skip_corrupt can leave a batch empty
        batch = ld.next_batch()
    if batch is None:
        offs = _EMPTY_OFFSETS
        data[0] = capi.ffi.NULL
        offsets[0] = capi.ffi.cast("const int64_t *", offs.ctypes.data)
        return
    offs = batch.offsets
    if offs.dtype != np.int64 or not offs.flags.c_contiguous:  # never expected; kept safe
        batch.offsets = offs = np.ascontiguousarray(offs, np.int64)
    h.batch = batch
    data[0] = capi.ffi.cast("const uint8_t *", batch.data.ctypes.data)
    offsets[0] = capi.ffi.cast("const int64_t *", offs.ctypes.data)
    count[0] = len(batch)
    has_batch[0] = 1


def pb_loader_set_epoch(loader, epoch):
    _loader(loader).live().set_epoch(epoch)


def pb_loader_epoch(loader, out):
    put(out, _loader(loader).live().epoch)


def pb_loader_set_prefetch(loader, batches):
    _loader(loader).live().set_prefetch(batches)


def pb_loader_num_batches(loader, out):
    n = _loader(loader).live().num_batches
    put(out, -1 if n is None else n)


def pb_loader_num_records(loader, out):
    put(out, _loader(loader).live().num_records)


def pb_loader_corrupt_chunks(loader, out):
    put(out, _loader(loader).live().corrupt_chunks)


def pb_loader_close(loader):
    h = _loader(loader)
    if h.closed:
        return
    h.closed, h.batch = True, None
    ld, h.loader = h.loader, None
    ld.close()
