"""Bucketed gradient allreduce: the one reducer behind the DDP wrapper and the C ABI.

The reducer knows parameters only as specs (shape or element count, dtype, device), so a
caller that computes gradients itself (C, Go) uses it exactly as the autograd hooks do:

    r = Reducer([(4096, "float32"), ((256, 256), "float16"), ...])
    g = r.grad(i)          # a view into a library-owned flat bucket; write the gradient here
    r.mark_ready(i)        # the "hook": the bucket's allreduce starts once all its grads are in
    r.wait()               # waits every bucket; the views now hold the averaged gradients

Every rank must mark the same set of gradients (any order) and call wait() the same
number of times: bucket allreduces are always issued in bucket order 0..n-1, which is what
keeps the collectives in the same sequence on every rank whatever order gradients arrive in.
One reducer must not be driven from several threads at once without ordering (a lock keeps
its own state consistent, but the caller decides which iteration a mark belongs to).

Views stay valid until the buckets are rebuilt: after the first wait() the buckets are
rebuilt once in the order gradients became ready on rank 0 (unless rebuild=False), and
when that gives other buckets than the initial ones `generation` goes up by one. Callers
that keep raw pointers must fetch views again when `generation` changes (the gradient
values are carried over into the new views).

One configuration, checked across ranks: every setting (parameters, op, caps, flags, the
hook and its state's settings) is compared by one small allgather when the reducer is
created, and again at the first mark_ready/set_grad/wait after register_comm_hook() or
set_shapes() changed it; ranks that differ all get InvalidArgument naming the settings.

The Reducer holds the phases together; each phase's logic lives in its own module:
settings.py (how settings are given, and the cross-rank agreement), layout.py (specs,
buckets, views; no collective), dispatch.py (the hook, one iteration's readiness, launches
and wait, a joined rank's shadow exchange) and join.py (the count and the join loop).
"""

import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, ContextManager, Iterable, Optional, Sequence, Union, cast

import torch

from ..algorithms.contract import CommHook
from ..base.checks import index, integer, positive_seconds
from ..base.dtypes import DTypeLike
from ..comm import collectives, streams
from ..comm import group as _group
from ..comm import world as _world
from ..comm.collectives import AVG
from ..errors import Closed, InvalidArgument
from ..observe import state as _obs
from . import dispatch, join as _join, layout as _layout, settings as _settings
from .dispatch import Hook, Iteration
from .join import JoinResult
from .layout import Bucket, Layout, ParamSpec, assign_buckets
from .settings import (COMPRESS_BF16, COMPRESS_FP16, COMPRESS_NONE, DEFAULT_BUCKET_CAP_MB,
                       DEFAULT_FIRST_BUCKET_CAP_MB, bucket_caps)
from .settings import MiB  # noqa: F401 - importable from here, as before the split

if TYPE_CHECKING:
    from ..algorithms.comm_hooks import BuiltinHook, GossipHook

# A parameter as the reducer takes it: a tensor, or a spec (element count or shape, dtype[, device]),
# the device a torch.device, a name or a C device code (-1 CPU, k >= 0 CUDA k).
_Size = Union[int, Sequence[int]]
ParamLike = Union[torch.Tensor, tuple[_Size, DTypeLike], tuple[_Size, DTypeLike, Union[torch.device, str, int, None]]]
# How buckets travel: a comm hook (with hook_state), a PB_HOOK_* code, or a built-in by its settings.
HookLike = Union[CommHook, int, "BuiltinHook", "GossipHook"]


# Why one class of this size: it is the public object every caller holds (Python, the C
# adapter, Go through it), and each method is a short phase that calls into settings.py,
# layout.py, dispatch.py and join.py, where the logic lives; splitting the methods across
# more classes would spread one lock and one iteration's state over several objects.
class Reducer:
    """Gradient buckets with an asynchronous allreduce per bucket.

    `params`: a sequence of tensors or specs `(numel or shape, dtype[, device])`; dtype is a
    pybridge dtype code, name or torch dtype (floating point only); device defaults to the
    group's (CPU for gloo). `op`: 'avg' (default) or 'sum'. `hook`: how a full bucket
    travels (torch's DDP comm-hook contract, see pybridge/algorithms/comm_hooks.py): a callable
    hook(state, bucket) with its `hook_state`, a hook's name (a built-in's, 'fp16', or one
    registered with comm_hooks.register_comm_hook), a PB_HOOK_* code, or a
    comm_hooks.BuiltinHook (e.g. PowerSGD with its rank) or comm_hooks.GossipHook; default:
    allreduce.
    `compression`: None, 'fp16' or 'bf16', another name for hook=HOOK_FP16 or HOOK_BF16:
    float32 buckets travel in that type and are decompressed in place (other dtypes are sent
    as they are). The reducer owns its hook's state: close() closes a state that has a
    close() (a GossipState's thread and groups). `rebuild`: rebuild the buckets once, after
    the first wait(), in the order gradients became ready on rank 0. `allow_unused`: wait()
    accepts gradients that were never marked and sends what their views hold (zero them
    first, e.g. with zero_grad(), if they should count as zero). `names`: used in error
    messages. `join`: uneven inputs (pybridge/ddp/join.py): every iteration starts with a count
    of the ranks still training (one small allreduce at its first mark_ready, set_grad or
    wait), so that a rank with no more batches can call join() and shadow the others until
    all have joined; `divide_by_initial_world_size` (with join): average over the world size
    (True, torch's default) or over the ranks still training (False).

    Construction is a collective: every rank must create its reducers in the same order with
    the same specs and options; a mismatch in any of them (the hook and its settings
    included) raises InvalidArgument on every rank, naming what differs.

    Example (gradients computed elsewhere, as a C or Go program does)::

        >>> import torch, pybridge
        >>> r = pybridge.Reducer([(4, "float32"), ((2, 3), "float32")])
        >>> r.grad(0).fill_(1.0)                   # write gradient 0 into its bucket view
        tensor([1., 1., 1., 1.])
        >>> r.set_grad(1, torch.full((6,), 2.0))   # or copy one in; each marks it ready
        >>> r.mark_ready(0)
        >>> r.wait()                               # every bucket reduced: the views hold the average
        >>> r.grad(1)
        tensor([[2., 2., 2.],
                [2., 2., 2.]])
        >>> r.close()
    """

    def __init__(self, params: Iterable[ParamLike], *, group: Optional[_group.Group] = None,
                 bucket_cap_mb: Optional[float] = None, first_bucket_cap_mb: Optional[float] = None,
                 op: Union[str, int] = "avg", compression: Optional[str] = None, hook: Optional[HookLike] = None,
                 hook_state: Any = None, rebuild: bool = True, allow_unused: bool = False,
                 names: Optional[Sequence[str]] = None, join: bool = False,
                 divide_by_initial_world_size: bool = True) -> None:
        self._group: _group.Group = group or _world.current()
        self._group.check_open()
        params = list(params)
        default_device = self._group.device
        self.specs: list[ParamSpec] = [_layout.parse_spec(i, p, default_device) for i, p in enumerate(params)]
        self._on_cuda = any(s.device.type == "cuda" for s in self.specs)  # the group's stream applies
        if names is not None:
            names = [str(n) for n in names]
            if len(names) != len(self.specs):
                raise InvalidArgument(f"got {len(names)} names for {len(self.specs)} parameters")
        self.names: Optional[list[str]] = None if names is None else list(names)
        self.op: int = _settings.resolve_op(op)
        self.compression: str = _settings.resolve_compression(compression)
        spec, pair = _settings.hook_choice(hook, hook_state, self.compression)
        bucket_cap_mb, first_bucket_cap_mb = bucket_caps(bucket_cap_mb, first_bucket_cap_mb)
        self.bucket_cap: int = _settings.resolve_cap(bucket_cap_mb, "bucket_cap_mb")
        self.first_bucket_cap: int = _settings.resolve_cap(first_bucket_cap_mb, "first_bucket_cap_mb")
        self.allow_unused = bool(allow_unused)
        self.join_enabled = bool(join)
        self.divide_by_initial_world_size = bool(divide_by_initial_world_size)
        if not self.divide_by_initial_world_size and not self.join_enabled:
            raise InvalidArgument("divide_by_initial_world_size=False goes with join=True (it divides by the "
                                  "ranks still training, which only join counts)")
        self.rebuild = self._rebuild_pending = bool(rebuild)
        self._params = (cast(list[torch.Tensor], params)
                        if params and all(isinstance(p, torch.Tensor) for p in params) else None)
        self._lock = threading.Lock()
        self._closed = False
        self._bound: Optional[list[torch.Tensor]] = None  # the program's own gradient tensors (bind_grads)
        self.generation = 0
        self.iterations = 0  # completed wait() calls
        self._hook = Hook(spec) if spec is not None else Hook(None, *pair)
        self._agree_then_build()
        self._layout: Layout = Layout.first(self.specs, self.bucket_cap, self.first_bucket_cap)
        self._start_iteration()

    # ---- settings, agreed across ranks (settings.py) --------------------------------------

    def _agree(self) -> None:
        """COLLECTIVE: every rank has the same settings, or every rank raises."""
        _settings.agree_on(self._group, self.specs, _settings.describe(
            self.specs, op=self.op, bucket_cap=self.bucket_cap, first_bucket_cap=self.first_bucket_cap,
            allow_unused=self.allow_unused, rebuild=self.rebuild, join=self.join_enabled,
            divide_by_initial_world_size=self.divide_by_initial_world_size, hook=self._hook.identity))
        self._stale = False

    def _agree_then_build(self) -> None:
        """Compare the settings, the hook as it will be built included, then build the hook
        for the group: a gossip state's groups are themselves a collective."""
        self._hook.plan()
        self._agree()
        self._hook.build(self._group)
        self._fold_scale()

    def _fold_scale(self) -> None:
        # pybridge's summing hooks let the 1/size of 'avg' be folded into the gradient copy
        # (set_grad); any other hook gets the plain local gradients and averages itself.
        world = self._group.size
        self._base_scale = 1.0 / world if self._hook.prescales and self.op == AVG and world > 1 else None

    def _start_iteration(self) -> None:
        self._it = Iteration(self._layout, self._hook, self._group, self._params, self._base_scale,
                             record_order=self._rebuild_pending)

    # ---- public API -----------------------------------------------------------------------

    @property
    def group(self) -> _group.Group:
        """The group the buckets are reduced over."""
        return self._group

    @property
    def buckets(self) -> list[Bucket]:
        """The buckets (layout.Bucket: index, members, flat), in launch order."""
        return self._layout.buckets

    def set_allow_unused(self, allow: bool) -> None:
        """Change allow_unused between iterations (the DDP wrapper's _set_static_graph); the
        ranks compare it at the next iteration's first mark_ready/set_grad/wait."""
        with self._lock:
            self._check_open()
            if any(self._it.ready):
                raise InvalidArgument("set_allow_unused() must be called between iterations")
            self.allow_unused = bool(allow)
            self._stale = True

    def set_shapes(self, shapes: Iterable[Optional[Sequence[int]]]) -> None:
        """Give gradients shapes (same element counts) for callers that created the reducer
        from counts (C, Go): hooks such as PowerSGD compress matrices, not flat vectors.
        `shapes`: one shape per parameter, or None to keep that one's. Between iterations;
        the ranks compare them at the next iteration's first mark_ready/set_grad/wait."""
        with self._lock:
            self._check_open()
            if any(self._it.ready):
                raise InvalidArgument("set_shapes() must be called between iterations")
            given = list(shapes)
            if len(given) != len(self.specs):
                raise InvalidArgument(f"got {len(given)} shapes for {len(self.specs)} parameters")
            for i, shape in enumerate(given):
                if shape is None:
                    continue
                spec = _layout.parse_spec(i, (tuple(shape), self.specs[i].dtype, self.specs[i].device),
                                          self.specs[i].device)
                if spec.numel != self.specs[i].numel:
                    raise InvalidArgument(f"parameter {i}: shape {tuple(shape)} holds {spec.numel} elements, "
                                          f"the parameter has {self.specs[i].numel}")
                self.specs[i] = spec
                self._layout.reshape(i, spec.shape)
            self._stale = True

    @property
    def num_params(self) -> int:
        """How many parameters (gradients) the reducer has."""
        return len(self.specs)

    @property
    def num_buckets(self) -> int:
        """How many buckets the gradients are in now."""
        return len(self._layout.buckets)

    @property
    def bucket_indices(self) -> list[list[int]]:
        """Parameter indices of each bucket, in bucket (= launch) order and layout order."""
        return self._layout.indices

    @property
    def launched(self) -> int:
        """How many buckets of the current iteration have started their allreduce."""
        return self._it.next

    @property
    def missing(self) -> list[int]:
        """Indices not yet marked ready in the current iteration."""
        missing: list[int] = self._it.missing()
        return missing

    def name(self, i: int) -> str:
        """Parameter i's name (given as names=), else "#i"."""
        return self.names[i] if self.names else f"#{i}"

    def grad(self, i: int) -> torch.Tensor:
        """The gradient view of parameter `i`: a tensor over the bucket's memory, in the
        parameter's shape. Valid until `generation` changes."""
        self._check(i)
        return self._layout.views[i]

    def grads(self) -> list[torch.Tensor]:
        """Every gradient view (grad(i) for each i), valid until `generation` changes."""
        self._check_open()
        return list(self._layout.views)

    def zero_grad(self) -> None:
        """Zero every bucket (for callers that accumulate into the views)."""
        self._check_open()
        with self._stream():
            for b in self._layout.buckets:
                b.flat.zero_()

    def _stream(self) -> ContextManager[Any]:
        """Copies, zeroing and launches run on the group's stream when it has one
        (streams.py), so they stay in order with the collectives."""
        scope: ContextManager[Any] = streams.scope(self._group, cuda=self._on_cuda)
        return scope

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        """Communicate each full bucket with `hook(state, bucket) -> Future` (torch's DDP
        comm-hook contract; torch's own hooks work, see pybridge/algorithms/comm_hooks.py). Call it
        before the first gradient of an iteration is marked; every rank must register the
        same hook: the ranks compare it (comm_hooks.identity: the function's name, the
        state's type and known settings) at the next iteration's first mark_ready, set_grad
        or wait, and all raise InvalidArgument there when they differ. It replaces the hook
        chosen before, whose state is closed if it has close() (the reducer owns its hook's
        state). The hook must do its own averaging (torch's hooks do).

        Example::

            >>> import torch, pybridge
            >>> from pybridge.algorithms.comm_hooks import HookContext, fp16_compress_hook
            >>> r = pybridge.Reducer([(1000, "float32")])
            >>> r.register_comm_hook(HookContext(r.group), fp16_compress_hook)
            >>> r.set_grad(0, torch.ones(1000)); r.wait()
            >>> r.grad(0)[:3]
            tensor([1., 1., 1.])
            >>> r.close()
        """
        if not callable(hook):
            raise InvalidArgument(f"hook must be callable as hook(state, bucket), got {hook!r}")
        with self._lock:
            self._check_open()
            if any(self._it.ready):
                raise InvalidArgument("register_comm_hook() must be called between iterations, "
                                      "not after gradients were marked ready")
            self._hook.use(state, hook)
            self._fold_scale()
            self._it.scale = self._base_scale
            self._stale = True

    def mark_ready(self, i: int) -> None:
        """Gradient `i` is written: once every gradient of its bucket is, and every earlier
        bucket has been launched, the bucket's allreduce starts (asynchronously). With
        gradients bound (bind_grads), gradient i is first copied from the program's tensor."""
        with self._lock:
            if self._on_cuda:
                with self._stream():
                    self._mark(i)
            else:  # the hot path of every autograd hook: no stream scope to enter on the CPU
                self._mark(i)

    def _mark(self, i: int) -> None:
        it = self._it
        if not it.begun or self._stale:
            self._begin()
        self._check_mark(i)
        if self._bound is not None:
            it.copy_in(i, self._bound[i])
        it.mark(i)

    def set_grad(self, i: int, grad: torch.Tensor) -> None:
        """Copy `grad` (any tensor of parameter i's element count) into gradient i's view and
        mark it ready. For a gradient that lives elsewhere this is one pass instead of
        copy-then-mark: the averaging division is folded into the copy."""
        with self._lock, self._stream():
            it = self._it
            if not it.begun or self._stale:
                self._begin()
            self._check_mark(i)
            view = it.views[i]
            if not isinstance(grad, torch.Tensor) or grad.numel() != view.numel():
                raise InvalidArgument(f"gradient {self.name(i)}: expected a tensor of {view.numel()} "
                                      f"elements, got {getattr(grad, 'shape', type(grad).__name__)}")
            it.copy_in(i, grad)
            it.mark(i)

    def bind_grads(self, grads: Optional[Iterable[torch.Tensor]]) -> None:
        """Reduce the program's own gradient tensors (torch DDP's default mode, for programs
        whose gradients live in their tensor library): from now on mark_ready(i) first copies
        grads[i] into its bucket, and wait() copies the reduced gradients back into grads.
        One contiguous tensor per parameter, of its element count, dtype and device; the
        reducer keeps them until bind_grads(None). Between iterations."""
        with self._lock:
            self._check_open()
            if any(self._it.ready):
                raise InvalidArgument("bind_grads() must be called between iterations")
            if grads is None:
                self._bound = None
                return
            given = list(grads)
            if len(given) != len(self.specs):
                raise InvalidArgument(f"got {len(given)} gradients for {len(self.specs)} parameters")
            views = self._layout.views
            for i, (g, s) in enumerate(zip(given, self.specs)):
                if not isinstance(g, torch.Tensor) or g.numel() != s.numel or g.dtype != s.dtype \
                        or g.device != views[i].device or not g.is_contiguous():
                    got = (f"{tuple(g.shape)} {g.dtype} on {g.device}{'' if g.is_contiguous() else ', not contiguous'}"
                           if isinstance(g, torch.Tensor) else type(g).__name__)
                    raise InvalidArgument(f"gradient {self.name(i)}: expected a contiguous tensor of {s.numel} "
                                          f"{s.dtype} on {views[i].device}, got {got}")
            self._bound = [g.view(s.shape) for g, s in zip(given, self.specs)]

    def wait(self, timeout: Optional[float] = None) -> None:
        """Wait for every bucket's allreduce and leave the reduced gradients in the views.

        Raises InvalidArgument naming the gradients never marked (unless allow_unused), and
        Timeout/CommError if the reduction fails. The next mark_ready starts a new iteration,
        also after an error: a `timeout` that passes gives the iteration up (poll() does not).
        """
        with self._lock, self._stream():
            self._check_open()
            if timeout is not None:
                timeout = positive_seconds("timeout", timeout)
            rec = _obs.REC
            waited = rec.wait_begin() if rec is not None else 0.0
            try:
                it = self._end_marks()
                deadline = None if timeout is None else time.monotonic() + timeout
                try:
                    if it.count_work is not None:  # join's count went out before the buckets
                        it.count_work.wait(timeout)
                    it.finish(deadline)
                except Exception:
                    self._start_iteration()
                    raise
            finally:
                if rec is not None:
                    rec.wait_end(waited)
            self._complete(it)

    def poll(self, timeout: float = 0.0) -> bool:
        """wait() for at most `timeout` seconds (0: only look) without giving up the
        iteration: True when the gradients are reduced, the iteration then over as after
        wait(); False while buckets are still in flight, which go on (poll or wait again
        later; mark no more gradients of this iteration). Raises as wait() does, and then
        the iteration is over. For callers that stop waiting on their own terms (Go's
        Reducer.WaitContext): wait() with a timeout gives up the iteration when it passes."""
        with self._lock, self._stream():
            self._check_open()
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
                raise InvalidArgument(f"timeout must be a number of seconds >= 0, got {timeout!r}")
            timeout = positive_seconds("timeout", timeout) if timeout else 0.0
            rec = _obs.REC
            waited = rec.wait_begin() if rec is not None else 0.0
            try:
                it = self._end_marks()
                try:
                    if not it.settled(time.monotonic() + timeout):
                        return False
                    if it.count_work is not None:
                        it.count_work.wait()  # completed: raises its error, if any
                    it.finish(None)  # every future is done: no waiting
                except Exception:
                    self._start_iteration()
                    raise
            finally:
                if rec is not None:
                    rec.wait_end(waited, "reducer.poll")
            self._complete(it)
            return True

    def _end_marks(self) -> Iteration:
        """The start of an iteration's end, once per iteration (wait() or the first poll()):
        the unmarked gradients are an error, or (allow_unused) count with what their views
        hold and every bucket still to go is launched."""
        it = self._it
        if not it.begun or self._stale:
            self._begin()
        if it.ending:
            return it
        missing = it.missing()
        if missing and not self.allow_unused:
            drained = it.drain()
            self._start_iteration()
            raise dispatch.unused_error(self._group.rank, missing, self.names, drained)
        it.count_unmarked(missing)  # they count with what their views hold
        it.ending = True
        return it

    def _complete(self, it: Iteration) -> None:
        """The iteration's buckets are reduced (under the lock and stream): count it, copy
        bound gradients back, do the one rebuild if due, start the next iteration."""
        self.iterations += 1
        if self._bound is not None:  # the reduced gradients back into the program's tensors
            for dst, view in zip(self._bound, it.views):
                dst.copy_(view)
        if self._rebuild_pending:
            order = (it.order or []) + [i for b in it.buckets for i in b.members if not it.ready[i]]
            self._rebuild_pending = False
            self._rebuild(order)
        self._start_iteration()
        if _obs.REC is not None:  # after the rebuild's broadcast: part of this iteration
            _obs.REC.end_step(False)

    # The older name of wait(), kept: "finalize" is also pybridge.finalize(), leaving the group.
    finalize = wait

    # ---- uneven inputs (join.py; the shadow exchange is dispatch.shadow) ------------------

    def _begin(self) -> None:
        """The first mark_ready, set_grad or wait of an iteration: with join, count the ranks
        still training (and raise nothing: joined ranks shadow us); then the settings check
        after a change."""
        self._check_open()
        it = self._it
        if not it.begun:
            it.begun = True
            if self.join_enabled and self.divide_by_initial_world_size:
                # Only the joined ranks need the answer: wait for it in wait().
                it.count_work = _join.count_active(self._group, True, async_op=True)
            elif self.join_enabled:
                self._set_divisor(_join.count_active(self._group, True))
        if self._stale:  # until the ranks agree, every call of the iteration checks again
            self._agree()

    def set_divisor(self, n: int) -> None:
        """Average this iteration's gradients over `n` ranks instead of the world size
        (torch Join's divide_by_initial_world_size=False: the ranks not yet joined). Before
        the iteration's first gradient is marked; wait() goes back to the world size. Only
        the built-in summing hooks with op 'avg' divide; other hooks average themselves."""
        n = integer("divisor", n, low=1)
        with self._lock:
            self._check_open()
            if any(self._it.ready):
                raise InvalidArgument("set_divisor() must be called before the iteration's first gradient")
            self._set_divisor(n)

    def _set_divisor(self, n: int) -> None:
        if self._base_scale is not None:
            self._it.scale = 1.0 / n

    def shadow(self) -> None:
        """One iteration of a rank that has joined (no more batches): the collectives the
        ranks still training issue in theirs, with zeros for this rank's gradients, through
        the same hook in bucket order; then the one rebuild if it is still to come. This
        rank's own gradient views are left as they are (torch's joined ranks reduce zero
        buckets of their own). Between iterations."""
        with self._lock:
            self._check_open()
            if any(self._it.ready):
                raise InvalidArgument("a rank joins between iterations, not after marking gradients")
            if self._stale:
                self._agree()
            dispatch.shadow(self._layout, self.specs, self._hook, self._params, self._group)
            self.iterations += 1
            if self._rebuild_pending:
                self._rebuild_pending = False
                self._rebuild([i for b in self._layout.buckets for i in b.members])
            self._start_iteration()

    def join(self) -> JoinResult:
        """This rank has no more batches: shadow the iterations of the ranks still training
        until every rank has joined (their reducer must have been created with join=True,
        like this one). Returns a join.JoinResult: `root`, the rank whose parameters every
        rank should take now (the largest of those that joined last: broadcast them from it
        with broadcast_parameters, as torch's join does), and `shadowed`, the iterations
        this rank shadowed. Every rank calls join() once per epoch, the last ones to run out
        included; afterwards the reducer is ready for the next epoch. Between iterations."""
        with self._lock:
            self._check_open()
            if not self.join_enabled:
                raise InvalidArgument("join() needs a reducer created with join=True on every rank: the ranks "
                                      "still training must count themselves each iteration")
            if any(self._it.ready):
                raise InvalidArgument("join() must be called between iterations, not after marking gradients")
        result: JoinResult = _join.join_reducer(self)
        return result

    # ---- state: checkpoints and elastic worlds --------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a restart needs to continue the schedule: completed iterations and the hook's
        step counter (GossipGraD's step, PowerSGD's iteration). PowerSGD's error feedback and
        warm-start factors are each rank's own and are not kept: after a restart they start
        from zero, as on a fresh reducer."""
        with self._lock:
            self._check_open()
            return {"iterations": self.iterations, "hook_step": self._hook.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state_dict()'s counters, between iterations."""
        if not isinstance(state, dict) or not isinstance(state.get("iterations"), int):
            raise InvalidArgument(f"reducer state must be a dict from state_dict(), got {state!r}")
        with self._lock:
            self._check_open()
            if any(self._it.ready):
                raise InvalidArgument("load_state_dict() must be called between iterations")
            self.iterations = state["iterations"]
            if isinstance(state.get("hook_step"), int):
                self._hook.step = state["hook_step"]

    def rebind(self, group: _group.Group) -> None:
        """Reduce over another group of the same parameters from now on (elastic training's
        new world, pybridge.runtime.elastic). The iteration in progress is dropped (its gradients are
        rolled back with the rest of the state); buckets, views and bound gradients stay. A
        built-in hook is built again for the new group; a hook registered with its own state
        must not hold the old group. COLLECTIVE on the new group: the ranks compare their
        settings, as at construction (a new rank constructs its reducer at the same point)."""
        group.check_open()
        with self._lock:
            if self._closed:
                raise Closed("reducer is closed")
            self._group = group
            self._it.drop(group)
            self._agree_then_build()
            # A new rank starts with the first layout and rebuilds after its first wait():
            # every member does the same, so the buckets match from the first iteration on.
            self._relayout(_layout.initial_order(len(self.specs)))
            self._rebuild_pending = self.rebuild
            self._start_iteration()

    def close(self) -> None:
        """Release the buckets and close the hook's state if it has close() (a GossipState's
        thread and groups). Views already handed out keep their memory alive."""
        with self._lock:
            self._closed = True
            self._layout, self._bound = Layout(self.specs, []), None
            self._start_iteration()  # holds no bucket of the old layout
            state = self._hook.detach()
        dispatch.close_state(state)

    def __enter__(self) -> "Reducer":
        return self

    def __exit__(self, kind: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.buckets)} buckets, generation {self.generation}"
        return f"<pybridge.Reducer {len(self.specs)} params, {state}>"

    # ---- internals ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Closed("reducer is closed")
        if self._group.closed:  # also on 1 rank, where no collective would notice
            raise Closed("the process group this reducer was made from was finalized")

    def _check(self, i: int) -> None:
        self._check_open()
        index("gradient index", i, len(self.specs), f"{len(self.specs)} parameters")

    def _check_mark(self, i: int) -> None:
        it = self._it
        if (type(i) is int and 0 <= i < len(it.ready) and not it.ready[i] and not it.ending and not self._closed
                and not self._group.closed):
            return  # the usual case, tested at once; the checks below say what is wrong
        self._check(i)
        if self._it.ending:
            raise InvalidArgument(
                f"gradient {self.name(i)} was marked ready after this iteration's end began (a poll that "
                "found its buckets still in flight); mark every gradient of an iteration before polling")
        if self._it.ready[i]:
            raise InvalidArgument(
                f"gradient {self.name(i)} was marked ready twice in one iteration; each "
                "gradient may be marked once between wait() calls (if a parameter is "
                "used several times, mark it after its gradient is complete)")

    def _rebuild(self, order: list[int]) -> None:
        """The one rebuild: every rank lays out rank 0's order (one broadcast)."""
        if self._group.size > 1:
            t = torch.tensor(order, dtype=torch.int64, device=self._group.device)
            collectives.broadcast(t, 0, group=self._group)
            order = t.tolist()
        self._relayout(order)

    def _relayout(self, order: list[int]) -> None:
        new = self._layout.arranged(self.specs, order, self.bucket_cap, self.first_bucket_cap)
        if new is not None:  # other buckets: views handed out before are stale
            self._layout = new
            self.generation += 1


__all__ = ["Reducer", "ParamSpec", "assign_buckets",
           "COMPRESS_NONE", "COMPRESS_FP16", "COMPRESS_BF16",
           "DEFAULT_BUCKET_CAP_MB", "DEFAULT_FIRST_BUCKET_CAP_MB", "bucket_caps"]
