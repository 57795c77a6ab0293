"""C ABI functions for training state checkpoints (capi/pybridge.h, "Training state").

Conversion only: names and descriptors become a dict of tensors over the caller's memory;
pybridge.runtime.checkpoint saves, agrees on the newest and restores.
"""

from .. import capi
from ..runtime import checkpoint, preempt
from ..base.checks import integer
from ..errors import InvalidArgument
from . import handles, live_group, put, tensor, text
from .recordio import LoaderHandle
from .reducer import CReducer


def _named(n, names, tensors):
    ffi = capi.ffi
    integer("n", n, low=0)
    if n and (names == ffi.NULL or tensors == ffi.NULL):
        raise InvalidArgument(f"{'names' if names == ffi.NULL else 'tensors'} is NULL with n = {n}")
    out = {}
    for i in range(n):
        name = text(names[i])
        if not name:
            raise InvalidArgument(f"names[{i}] is NULL or empty")
        if name in out:
            raise InvalidArgument(f"names[{i}] repeats the tensor name {name!r}")
        out[name] = tensor(tensors + i, f"tensors[{i}]")
    return out


def _directory(directory):
    d = text(directory)
    if not d:
        raise InvalidArgument("directory is NULL or empty")
    return d


def _objects(loader, reducer):
    ffi = capi.ffi
    ld = None if loader == ffi.NULL else handles.get(loader, LoaderHandle, "loader").live()
    red = None if reducer == ffi.NULL else handles.get(reducer, CReducer, "reducer").reducer
    return ld, red


def pb_checkpoint_save(directory, step, n, names, tensors, loader, reducer, keep):
    d = _directory(directory)
    ld, red = _objects(loader, reducer)
    checkpoint.save(d, step, tensors=_named(n, names, tensors), loader=ld, reducer=red, keep=keep)


def pb_checkpoint_restore(group, directory, n, names, tensors, loader, reducer, step):
    if step == capi.ffi.NULL:
        raise InvalidArgument("step (the pointer to store the step in) is NULL")
    d = _directory(directory)
    alone = group == capi.ffi.NULL
    g = None if alone else live_group(group)
    ld, red = _objects(loader, reducer)
    got = checkpoint.restore(d, group=g, local=alone, tensors=_named(n, names, tensors), loader=ld, reducer=red)
    put(step, -1 if got is None else got.step)


def pb_any_rank(group, flag, out):
    if out == capi.ffi.NULL:
        raise InvalidArgument("any (the pointer to store the answer in) is NULL")
    put(out, 1 if preempt.any_rank(flag != 0, group=live_group(group)) else 0)
