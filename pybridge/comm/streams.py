"""Which CUDA stream pybridge's communication is ordered on (the stream contract).

torch.distributed orders a collective on CUDA memory after the work already queued on the
calling thread's current stream of the tensor's device, and a blocking call returns once
that stream waits for the result. pybridge keeps that rule and lets a group name another
stream (`Group.set_stream`, `pb_group_set_stream`): its calls then run as if that stream
were current, so a program that produces its tensors on its own stream (a C program with
a cudaStream_t, a libtorch program on a side stream) need not make it current around
every call. Asynchronous work remembers the stream it was issued on and waits on it when
it completes, whichever thread completes it (C's pb_work_wait, the waiter thread of
test()): another thread's current stream is its own default stream, not the issuer's.

Nothing here runs on a CPU-only machine beyond the checks: the paths that touch CUDA are
exercised by tests/test_cuda.py where a GPU is present.
"""

import contextlib

import torch

from ..errors import InvalidArgument

_none = contextlib.nullcontext()


def external(stream, device):
    """A torch stream for `stream` (a torch.cuda.Stream, or a cudaStream_t as an int
    address) on `device` (a CUDA device index); None for None or 0 (the default: the
    current stream at each call)."""
    if stream is None or (type(stream) is int and stream == 0):
        return None
    is_stream = isinstance(stream, torch.cuda.Stream)
    if not is_stream and (type(stream) is not int or stream < 0):
        raise InvalidArgument(f"stream must be a torch.cuda.Stream, a cudaStream_t address or None, "
                              f"got {stream!r}")
    if not torch.cuda.is_available():
        raise InvalidArgument("stream: a CUDA stream was given, but this process's torch has no "
                              "CUDA device (a CPU build, or no GPU visible)")
    return stream if is_stream else torch.cuda.ExternalStream(stream, device=device)


def _cuda_device(tensors):
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return t.device
    return None


def scope(g, tensors=None, *, cuda=None):
    """The context a call runs in: the group's stream made current when the group has one
    and the call touches CUDA memory (`tensors` on a CUDA device, or `cuda` True), else
    nothing."""
    stream = g.stream
    if stream is None:
        return _none
    if not (cuda if cuda is not None else _cuda_device(tensors) is not None):
        return _none
    return torch.cuda.stream(stream)


def issued_on(g, tensors):
    """The stream an asynchronous call on `tensors` is ordered on (to wait on later), or
    None for host memory."""
    device = _cuda_device(tensors)
    if device is None:
        return None
    return g.stream if g.stream is not None else torch.cuda.current_stream(device)


def waiting_on(stream):
    """The context in which an asynchronous call's completion is awaited: its stream."""
    return _none if stream is None else torch.cuda.stream(stream)
