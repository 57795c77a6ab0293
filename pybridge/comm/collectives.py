"""Collectives and point-to-point messages, in place, on anything `as_tensor` accepts.

Every call takes `group=` (default: the world); roots and peers are ranks within that group.

Every rank must issue collectives in the same order: torch.distributed matches them
by sequence, not by name. Calls that may run concurrently (threads, goroutines) must
therefore be ordered by the caller.

Every collective pybridge issues goes through _run (numbered and watched by the group's
watchdog.Progress, verified first in checked mode, errors explained): also checked mode's
own fingerprint exchange (_verify) and the agreement checks (agree, gather_rows).
"""

import threading
from typing import Any, Callable, Final, Literal, Optional, Sequence, Union, overload

import torch
import torch.distributed as dist

from .. import abi
from . import checked
from ..base import agree as _agree
from . import group as _group
from . import world as _world
from . import streams as _streams
from . import watchdog as _watchdog
from ..base.buffers import BufferLike, as_tensor
from ..base.dtypes import DTypeLike
from .checked import Op
from ..base.checks import integer, positive_seconds
from ..errors import InvalidArgument, PyBridgeError, Timeout, classify
from ..observe import clock as _clock
from ..observe import state as _obs

# The C ABI's op codes (PB_SUM ... in capi/pybridge.h).
SUM, AVG, MIN, MAX, PRODUCT = abi.PB_SUM, abi.PB_AVG, abi.PB_MIN, abi.PB_MAX, abi.PB_PRODUCT
OPS = {SUM: dist.ReduceOp.SUM, AVG: dist.ReduceOp.AVG, MIN: dist.ReduceOp.MIN,
       MAX: dist.ReduceOp.MAX, PRODUCT: dist.ReduceOp.PRODUCT}
# An op: a name ("sum", "avg" or "mean", "min", "max", "product" or "prod") or its code.
OpLike = Union[str, int]
OP_NAMES = {"sum": SUM, "avg": AVG, "mean": AVG, "min": MIN, "max": MAX,
            "product": PRODUCT, "prod": PRODUCT}


def _allreduce_options(rop: dist.ReduceOp.RedOpType) -> dist.AllreduceOptions:
    opts = dist.AllreduceOptions()
    opts.reduceOp = rop  # type: ignore[assignment]  # torch converts a RedOpType to its ReduceOp
    return opts


# Hot paths call the ProcessGroup directly with prebuilt options: torch.distributed's
# Python wrappers cost several microseconds per call, which dominates small messages.
_ALLREDUCE_OPTS = {code: _allreduce_options(rop) for code, rop in OPS.items()}
_MAX_OPTS = _ALLREDUCE_OPTS[MAX]


def _op_code(op: OpLike, dtype: torch.dtype) -> int:
    if type(op) is int and SUM <= op <= PRODUCT and (op != AVG or dtype.is_floating_point):
        return op  # the hot path: a valid code (bool, a subclass of int, is not one)
    code = OP_NAMES.get(op.lower()) if isinstance(op, str) else op
    if isinstance(code, bool) or code not in OPS:
        raise InvalidArgument(f"unknown reduce op {op!r}; valid: sum, avg, min, max, product (codes 0..4)")
    if code == AVG and not dtype.is_floating_point:
        raise InvalidArgument(f"op avg needs a floating-point dtype, got {dtype}; use sum and divide")
    return code


def reduce_op(op: OpLike, dtype: torch.dtype) -> dist.ReduceOp.RedOpType:
    """The torch ReduceOp for an op code or name, checked against the element type."""
    return OPS[_op_code(op, dtype)]


class Work:
    """An asynchronous operation in flight. The buffers it uses stay referenced until
    it is done; their contents are defined only after wait() or a True test()."""

    def __init__(self, work: Any, *buffers: torch.Tensor,
                 explain: Optional[Callable[[Exception], PyBridgeError]] = None,
                 finish: Optional[Callable[[], None]] = None, stream: Any = None) -> None:
        self._work = work
        self._stream = stream  # the CUDA stream it was issued on: completion waits there
        self._buffers = buffers
        self._explain = explain or classify  # exception -> the pybridge error to raise
        self._finish = finish  # called once done (the watchdog's bookkeeping)
        self._error: Optional[PyBridgeError] = None
        self._finished = False
        self._waiter: Optional[threading.Thread] = None  # thread that completes the work for test(), once started
        self._lock = threading.Lock()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until done; raise Timeout if `timeout` seconds pass first, or the operation's
        error if it failed.

        Example::

            >>> import torch, pybridge
            >>> x = torch.ones(4)
            >>> work = pybridge.all_reduce(x, "sum", async_op=True)
            >>> work.wait(timeout=10)              # x now holds the sum over the ranks
            >>> x.tolist() == [float(pybridge.size())] * 4
            True
        """
        if timeout is not None:
            timeout = positive_seconds("timeout", timeout)
        waiter = self._start_waiter() if timeout is not None else self._waiter
        if waiter is not None:
            waiter.join(timeout)
            if waiter.is_alive():
                raise Timeout(f"operation did not finish within {timeout} s")
        else:
            self._complete()
        return self._result()

    def test(self) -> bool:
        """True once done (raising its error if it failed); never blocks."""
        if not self._finished:
            # torch's gloo isend/irecv/reduce_scatter report is_completed() only after
            # wait() was called, so a background thread does the waiting.
            self._start_waiter()
            if not self._finished:
                return False
        self._result()
        return True

    def _start_waiter(self) -> Optional[threading.Thread]:
        with self._lock:
            if self._waiter is None and not self._finished:
                self._waiter = threading.Thread(target=self._complete, daemon=True,
                                                name="pybridge-work-waiter")
                self._waiter.start()
            return self._waiter

    def _complete(self) -> None:
        if self._finished:
            return
        try:
            with _streams.waiting_on(self._stream):
                self._work.wait()  # bounded by the process group's timeout
        except Exception as exc:  # noqa: BLE001
            self._error = self._explain(exc)
        if self._finish is not None:
            self._finish()
        self._buffers = ()
        self._finished = True

    def _result(self) -> None:
        if self._error is not None:
            raise self._error
        return None


FUTURE: Final = "future"  # _run's async_op for a caller that wants torch's future (all_reduce_future)


@overload
def _run(g: Any, op: Op, start: Callable[[], Any], async_op: bool, *buffers: torch.Tensor) -> Optional[Work]: ...
@overload
def _run(g: Any, op: Op, start: Callable[[], Any], async_op: Literal["future"],
         *buffers: torch.Tensor) -> "torch.futures.Future[list[torch.Tensor]]": ...


def _run(g: Any, op: Op, start: Callable[[], Any], async_op: Union[bool, Literal["future"]],
         *buffers: torch.Tensor) -> "Union[Work, torch.futures.Future[list[torch.Tensor]], None]":
    """Start collective `op` on g (`start()` returns torch's work object) and wait for it,
    or wrap it in a Work that keeps `buffers` alive while it is in flight (async_op=FUTURE:
    return torch's future of it instead, what comm hooks hand back; the future holds the
    buffers). Numbered by the group's progress (the watchdog's, which sees it while it
    runs); checked mode verifies its fingerprint first."""
    if g.checks is None:
        return _numbered(g, op, start, async_op, buffers)
    # Checked mode numbers, verifies and posts a collective as one unit per group: calls
    # from several threads (goroutines) then reach the backend in the order they were
    # numbered, and where two ranks numbered them differently the fingerprints say so
    # (both calls, both ranks) instead of each rank waiting in another collective.
    with g.checks.unit:
        return _numbered(g, op, start, async_op, buffers)


def _numbered(g: Any, op: Op, start: Callable[[], Any], async_op: Union[bool, Literal["future"]],
              buffers: Sequence[torch.Tensor]) -> "Union[Work, torch.futures.Future[list[torch.Tensor]], None]":
    progress = g.progress
    seq = progress.begin(op)
    rec = _obs.REC
    entry = rec.on_issue(g, seq, op) if rec is not None else None
    try:
        if g.checks is not None:
            _verify(g, seq, op)
        with _streams.scope(g, buffers):  # the group's stream, else the current one (torch's rule)
            work = start()
            if not async_op:
                work.wait()
                progress.end(seq)
                if rec is not None:
                    rec.on_collective(entry, _clock.now_us(), True)
                return None
            fut = work.get_future() if async_op is FUTURE or rec is not None else None
            if rec is not None:  # seen done by Recorder.poll
                rec.on_async(entry, fut)
    except InvalidArgument:
        progress.end(seq)
        raise
    except Exception as exc:  # noqa: BLE001
        err = _watchdog.explain(g, seq, op, exc)  # while still in flight: it is part of the answer
        progress.end(seq)
        raise err from exc
    progress.running(seq, work)
    if async_op is FUTURE:  # a hook's future: no Work object made only to be dropped
        return fut
    return Work(work, *buffers, explain=lambda exc: _watchdog.explain(g, seq, op, exc),
                finish=(lambda: progress.end(seq)) if progress.watched else None,
                stream=_streams.issued_on(g, buffers))


def _verify(g: Any, seq: int, op: Op) -> None:
    """Checked mode: one allreduce(max) of the members' fingerprint hashes says whether they
    all match; only if not, the rows are all-gathered to say who differs. Part of
    collective `seq`: not numbered on its own. Every member sees the same answer, so all
    take the same path."""
    buf = g.checks.fingerprint(seq, op)
    _inner(lambda: g.pg.allreduce([buf], _MAX_OPTS))
    if not checked.agreed(buf):
        raise checked.mismatch(g, seq, op, _gather_rows(g, op.row(seq), inner=True))


def _inner(start: Callable[[], Any]) -> None:
    """Run a collective that is part of another one (checked mode's): wait, classify errors."""
    try:
        start().wait()
    except Exception as exc:  # noqa: BLE001
        raise classify(exc) from exc


def _gather_rows(g: Any, row: Sequence[int], inner: bool = False) -> list[tuple[int, ...]]:
    n = len(row)
    mine = torch.tensor(row, dtype=torch.int64, device=g.device)
    every = torch.empty(g.size * n, dtype=torch.int64, device=g.device)
    if inner:
        _inner(lambda: g.pg._allgather_base(every, mine))
    else:
        all_gather(mine, every, group=g)
    return [tuple(r) for r in every.view(g.size, n).tolist()]


def gather_rows(row: Sequence[int], *, group: Optional[_group.Group] = None) -> list[tuple[int, ...]]:
    """Every member's `row` (a few integers, as many on every rank: the length is not
    checked outside checked mode), by group rank: one all_gather. A collective: every
    member calls it, in order with the others."""
    g = group or _world.current()
    g.check_open()
    return _gather_rows(g, [integer("row item", v) for v in row])


def agree(row: Sequence[int], what: str, *, group: Optional[_group.Group] = None, **how: Any) -> None:
    """Check that every member passes the same `row` (a few integers, as many on every
    rank; a list of any length can be folded into one with agree.signature): a collective
    (one all_gather); on any difference every member raises the same InvalidArgument,
    "{what}: ...", naming the ranks that differ and how (agree.check: describe, fields, hint)."""
    g = group or _world.current()
    if g.size > 1:
        _agree.check(what, gather_rows(row, group=g), **how)


def _prepare(buf: BufferLike, group: Optional[_group.Group],
             dtype: Optional[DTypeLike] = None) -> tuple[Any, torch.Tensor]:
    g = group or _world.current()
    g.check_open()
    t = as_tensor(buf, dtype)
    if g.backend == "nccl" and not t.is_cuda:
        raise InvalidArgument("the nccl backend needs CUDA tensors; this one is on the CPU")
    return g, t


def _pair(inp: BufferLike, out: BufferLike, group: Optional[_group.Group], dtype: Optional[DTypeLike],
          factor_in: int, factor_out: int, what: str) -> tuple[Any, torch.Tensor, torch.Tensor]:
    g, t_in = _prepare(inp, group, dtype)
    _, t_out = _prepare(out, g, dtype)
    if t_in.dtype != t_out.dtype:
        raise InvalidArgument(f"{what}: input is {t_in.dtype} but output is {t_out.dtype}")
    if t_in.numel() * factor_in != t_out.numel() * factor_out:
        n = "output" if factor_in > 1 else "input"
        raise InvalidArgument(
            f"{what}: {n} must hold world size ({g.size}) x the other's elements; "
            f"got input {t_in.numel()} and output {t_out.numel()}")
    return g, t_in, t_out


_Call = tuple[Any, torch.Tensor, Op, Callable[[], Any]]  # (group, tensor, Op, what starts it)


def _broadcast_call(buf: BufferLike, root: int, group: Optional[_group.Group], dtype: Optional[DTypeLike]) -> _Call:
    """Check a broadcast's arguments; return the group, the tensor, its Op and what starts it."""
    g, t = _prepare(buf, group, dtype)
    root = g.check_rank("root", root)
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    return g, t, Op(checked.BROADCAST, t, root), lambda: g.pg.broadcast([t], opts)


def _all_reduce_call(buf: BufferLike, op: OpLike, group: Optional[_group.Group],
                     dtype: Optional[DTypeLike]) -> _Call:
    """Check an all_reduce's arguments; return the group, the tensor, its Op and what starts it."""
    g, t = _prepare(buf, group, dtype)
    code = _op_code(op, t.dtype)
    opts = _ALLREDUCE_OPTS[code]
    return g, t, Op(checked.ALL_REDUCE, t, code), lambda: g.pg.allreduce([t], opts)


@overload
def broadcast(buf: BufferLike, root: int, *, group: Optional[_group.Group] = None, async_op: Literal[False] = False,
              dtype: Optional[DTypeLike] = None) -> None: ...
@overload
def broadcast(buf: BufferLike, root: int, *, group: Optional[_group.Group] = None, async_op: Literal[True],
              dtype: Optional[DTypeLike] = None) -> Work: ...
@overload
def broadcast(buf: BufferLike, root: int, *, group: Optional[_group.Group] = None, async_op: bool,
              dtype: Optional[DTypeLike] = None) -> Optional[Work]: ...


def broadcast(buf: BufferLike, root: int, *, group: Optional[_group.Group] = None, async_op: bool = False,
              dtype: Optional[DTypeLike] = None) -> Optional[Work]:
    """Copy `buf` from rank `root` (a rank within `group`, default the world) into `buf` on
    every rank, in place. With `async_op=True`, returns a Work to wait on; `dtype`
    reinterprets the buffer's bytes (a uint16 numpy array as "bfloat16", say).

    Example::

        >>> import torch, pybridge
        >>> w = torch.full((3,), float(pybridge.rank()))
        >>> pybridge.broadcast(w, root=0)          # every rank now holds rank 0's w
        >>> w.tolist()
        [0.0, 0.0, 0.0]
    """
    g, t, op, start = _broadcast_call(buf, root, group, dtype)
    return _run(g, op, start, async_op, t)


@overload
def all_reduce(buf: BufferLike, op: OpLike = SUM, *, group: Optional[_group.Group] = None,
               async_op: Literal[False] = False, dtype: Optional[DTypeLike] = None) -> None: ...
@overload
def all_reduce(buf: BufferLike, op: OpLike = SUM, *, group: Optional[_group.Group] = None,
               async_op: Literal[True], dtype: Optional[DTypeLike] = None) -> Work: ...
@overload
def all_reduce(buf: BufferLike, op: OpLike = SUM, *, group: Optional[_group.Group] = None,
               async_op: bool, dtype: Optional[DTypeLike] = None) -> Optional[Work]: ...


def all_reduce(buf: BufferLike, op: OpLike = SUM, *, group: Optional[_group.Group] = None, async_op: bool = False,
               dtype: Optional[DTypeLike] = None) -> Optional[Work]:
    """Reduce `buf` element-wise over all ranks of `group` (default the world), in place:
    `op` is "sum", "avg" (floating point only), "min", "max" or "product" (or its code).
    With `async_op=True`, returns a Work; the result is in `buf` once it is done.

    Example::

        >>> import torch, pybridge
        >>> x = torch.full((4,), float(pybridge.rank() + 1))
        >>> pybridge.all_reduce(x, "sum")          # on 2 ranks: every rank holds 1 + 2 = 3
        >>> x.tolist() == [sum(range(1, pybridge.size() + 1))] * 4
        True
    """
    g, t, what, start = _all_reduce_call(buf, op, group, dtype)
    return _run(g, what, start, async_op, t)


def prepare_broadcast(buf: BufferLike, root: int, *, group: Optional[_group.Group] = None,
                      dtype: Optional[DTypeLike] = None) -> Callable[[], None]:
    """Check a synchronous broadcast's arguments once and return a function that runs it
    each time it is called: for callers that send the same buffer again and again."""
    g, _, op, start = _broadcast_call(buf, root, group, dtype)
    return _runner(g, op, start)


def prepare_all_reduce(buf: BufferLike, op: OpLike = SUM, *, group: Optional[_group.Group] = None,
                       dtype: Optional[DTypeLike] = None) -> Callable[[], None]:
    """Check a synchronous all_reduce's arguments once and return a function that runs it
    each time it is called: for callers that reduce the same buffer again and again."""
    g, _, what, start = _all_reduce_call(buf, op, group, dtype)
    return _runner(g, what, start)


def prepare_all_reduce_future(buf: BufferLike, op: OpLike = SUM, *, group: Optional[_group.Group] = None,
                              dtype: Optional[DTypeLike] = None
                              ) -> "Callable[[], torch.futures.Future[list[torch.Tensor]]]":
    """Check an all_reduce_future's arguments once and return a function that starts it
    each time it is called and returns its future: for comm hooks that reduce the same
    bucket every iteration (the reducer's prepared launches, contract.declare_prepared)."""
    g, _, what, start = _all_reduce_call(buf, op, group, dtype)

    def run() -> "torch.futures.Future[list[torch.Tensor]]":
        g.check_open()  # the group may have been finalized since
        return _run(g, what, start, FUTURE)
    return run


def _runner(g: Any, op: Op, start: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        g.check_open()  # the group may have been finalized since
        _run(g, op, start, False)
    return run


def all_reduce_future(buf: BufferLike, op: OpLike = SUM, *, group: Optional[_group.Group] = None,
                      dtype: Optional[DTypeLike] = None) -> "torch.futures.Future[list[torch.Tensor]]":
    """Start an all_reduce and return a torch.futures.Future of [buf] (what DDP comm hooks
    return). Argument errors raise at once; a failure of the operation raises from the
    future's wait().

    Example::

        >>> import torch, pybridge
        >>> fut = pybridge.all_reduce_future(torch.ones(2), "avg")
        >>> fut.wait()[0].tolist()
        [1.0, 1.0]
    """
    g, t, what, start = _all_reduce_call(buf, op, group, dtype)
    return _run(g, what, start, FUTURE)


@overload
def all_gather(input: BufferLike, output: BufferLike, *, group: Optional[_group.Group] = None,
               async_op: Literal[False] = False, dtype: Optional[DTypeLike] = None) -> None: ...
@overload
def all_gather(input: BufferLike, output: BufferLike, *, group: Optional[_group.Group] = None,
               async_op: Literal[True], dtype: Optional[DTypeLike] = None) -> Work: ...
@overload
def all_gather(input: BufferLike, output: BufferLike, *, group: Optional[_group.Group] = None,
               async_op: bool, dtype: Optional[DTypeLike] = None) -> Optional[Work]: ...


def all_gather(input: BufferLike, output: BufferLike, *, group: Optional[_group.Group] = None,
               async_op: bool = False, dtype: Optional[DTypeLike] = None) -> Optional[Work]:
    """Concatenate every rank's `input` in rank order into `output` (world size x input).

    Example::

        >>> import numpy as np, pybridge
        >>> out = np.zeros(2 * pybridge.size(), np.float32)
        >>> pybridge.all_gather(np.full(2, pybridge.rank(), np.float32), out)
        >>> out[:2].tolist()                       # rank 0's block first
        [0.0, 0.0]
    """
    g, t_in, t_out = _pair(input, output, group, dtype, _group_size(group), 1, "all_gather")
    op = Op(checked.ALL_GATHER, t_in, out=t_out)
    return _run(g, op, lambda: g.pg._allgather_base(t_out, t_in), async_op, t_in, t_out)


@overload
def reduce_scatter(input: BufferLike, output: BufferLike, op: OpLike = SUM, *,
                   group: Optional[_group.Group] = None, async_op: Literal[False] = False,
                   dtype: Optional[DTypeLike] = None) -> None: ...
@overload
def reduce_scatter(input: BufferLike, output: BufferLike, op: OpLike = SUM, *,
                   group: Optional[_group.Group] = None, async_op: Literal[True],
                   dtype: Optional[DTypeLike] = None) -> Work: ...
@overload
def reduce_scatter(input: BufferLike, output: BufferLike, op: OpLike = SUM, *,
                   group: Optional[_group.Group] = None, async_op: bool,
                   dtype: Optional[DTypeLike] = None) -> Optional[Work]: ...


def reduce_scatter(input: BufferLike, output: BufferLike, op: OpLike = SUM, *,
                   group: Optional[_group.Group] = None, async_op: bool = False,
                   dtype: Optional[DTypeLike] = None) -> Optional[Work]:
    """Reduce `input` (world size x output) over ranks; rank r keeps block r in `output`."""
    g, t_in, t_out = _pair(input, output, group, dtype, 1, _group_size(group), "reduce_scatter")
    opts = dist.ReduceScatterOptions()
    code = _op_code(op, t_in.dtype)
    opts.reduceOp = OPS[code]  # type: ignore[assignment]  # (as in _allreduce_options)
    what = Op(checked.REDUCE_SCATTER, t_in, code, out=t_out)
    return _run(g, what, lambda: g.pg._reduce_scatter_base(t_out, t_in, opts), async_op, t_in, t_out)


@overload
def all_to_all(input: BufferLike, output: BufferLike, *, group: Optional[_group.Group] = None,
               async_op: Literal[False] = False, dtype: Optional[DTypeLike] = None) -> None: ...
@overload
def all_to_all(input: BufferLike, output: BufferLike, *, group: Optional[_group.Group] = None,
               async_op: Literal[True], dtype: Optional[DTypeLike] = None) -> Work: ...
@overload
def all_to_all(input: BufferLike, output: BufferLike, *, group: Optional[_group.Group] = None,
               async_op: bool, dtype: Optional[DTypeLike] = None) -> Optional[Work]: ...


def all_to_all(input: BufferLike, output: BufferLike, *, group: Optional[_group.Group] = None,
               async_op: bool = False, dtype: Optional[DTypeLike] = None) -> Optional[Work]:
    """Split `input` into world-size equal blocks; block j goes to rank j, which keeps the
    block from rank r as block r of its `output` (as large as `input`)."""
    g, t_in = _prepare(input, group, dtype)
    _, t_out = _prepare(output, g, dtype)
    if t_in.dtype != t_out.dtype or t_in.numel() != t_out.numel():
        raise InvalidArgument(f"all_to_all: output must be as large as input and of its type; got input "
                              f"{t_in.numel()} {t_in.dtype}, output {t_out.numel()} {t_out.dtype}")
    if t_in.numel() % g.size:
        raise InvalidArgument(f"all_to_all: {t_in.numel()} elements do not split into {g.size} equal blocks "
                              "(one per rank)")
    opts = dist.AllToAllOptions()
    op = Op(checked.ALL_TO_ALL, t_in, out=t_out)
    return _run(g, op, lambda: g.pg.alltoall_base(t_out, t_in, [], [], opts), async_op, t_in, t_out)


def barrier(*, group: Optional[_group.Group] = None) -> None:
    """Block until every rank of `group` (default the world) reaches the barrier; bounded by
    the group's timeout (Timeout naming the ranks that never came).

    Example::

        >>> import pybridge
        >>> pybridge.barrier()                     # every rank has got here
    """
    g = group or _world.current()
    g.check_open()
    _run(g, Op(checked.BARRIER), lambda: g.pg.barrier(), False)


def send(buf: BufferLike, dst: int, tag: int = 0, *, group: Optional[_group.Group] = None,
         dtype: Optional[DTypeLike] = None) -> None:
    """Send `buf` to rank `dst` and wait until it went; the peer calls recv with the same tag."""
    isend(buf, dst, tag, group=group, dtype=dtype).wait()


def recv(buf: BufferLike, src: int, tag: int = 0, *, group: Optional[_group.Group] = None,
         dtype: Optional[DTypeLike] = None) -> None:
    """Receive into `buf` from rank `src` (a send with the same tag), waiting until it came."""
    irecv(buf, src, tag, group=group, dtype=dtype).wait()


def isend(buf: BufferLike, dst: int, tag: int = 0, *, group: Optional[_group.Group] = None,
          dtype: Optional[DTypeLike] = None) -> Work:
    """Start sending `buf` to rank `dst` (a rank within `group`); matched by a recv/irecv
    with the same tag."""
    g, t = _prepare(buf, group, dtype)
    dst = g.check_rank("destination", dst, allow_self=False)
    tag = _check_tag(tag)
    return _p2p(g, checked.SEND, dst, tag, t, lambda: g.pg.send([t], dst, tag))  # the group's own ranks


def irecv(buf: BufferLike, src: int, tag: int = 0, *, group: Optional[_group.Group] = None,
          dtype: Optional[DTypeLike] = None) -> Work:
    """Start receiving into `buf` from rank `src` (a rank within `group`)."""
    g, t = _prepare(buf, group, dtype)
    src = g.check_rank("source", src, allow_self=False)
    tag = _check_tag(tag)
    return _p2p(g, checked.RECV, src, tag, t, lambda: g.pg.recv([t], src, tag))


def _p2p(g: Any, direction: int, peer: int, tag: int, t: torch.Tensor, post: Callable[[], Any]) -> Work:
    """Start a send or receive; its errors name the peer. Not numbered by g.progress: only
    two members take part, so the group's collective numbering stays the same everywhere."""
    op = Op(direction, t)
    where = "to" if direction == checked.SEND else "from"

    def explain(exc: Exception) -> PyBridgeError:
        if g.aborted is not None:
            return _watchdog.aborted(g, f"{op.name} {where} {g.who(peer)} (tag {tag})", exc)
        err = classify(exc)
        if isinstance(err, InvalidArgument):  # checked mode's message says it all
            return err
        err.args = (f"{op.name} {where} {g.who(peer)} (tag {tag}, {op.nbytes} bytes) on "
                    f"{g.describe()}: {err}",)
        return err
    try:
        if g.checks is not None:
            work = checked.p2p(g, _group.world_store(), direction, peer, tag, op, post)
        else:
            work = post()
    except InvalidArgument:
        raise
    except Exception as exc:  # noqa: BLE001
        raise explain(exc) from exc
    return Work(work, t, explain=explain)


def _check_tag(tag: int) -> int:
    return integer("tag", tag, low=0)


def _group_size(group: Optional[_group.Group]) -> int:
    return (group or _world.current()).size


__all__ = ["SUM", "AVG", "MIN", "MAX", "PRODUCT", "Work", "broadcast", "all_reduce",
           "prepare_broadcast", "prepare_all_reduce", "all_reduce_future", "prepare_all_reduce_future",
           "all_gather", "reduce_scatter", "all_to_all", "barrier", "send", "recv", "isend", "irecv"]
