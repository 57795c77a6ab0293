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
"""

import threading
import time

import torch

from .. import abi
from ..base import agree
from ..comm import collectives, streams
from ..algorithms import comm_hooks
from ..base import dtypes
from . import join as _join
from ..comm import group as _group
from ..comm import watchdog as _watchdog
from ..base.buffers import check_extent
from ..base.checks import index, integer, positive_finite, positive_seconds
from ..comm.collectives import AVG, SUM
from ..errors import Closed, InvalidArgument, InvalidState, Timeout, classify

MiB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25.0
DEFAULT_FIRST_BUCKET_CAP_MB = 1.0

# The C ABI's compression codes (PB_COMPRESS_* in capi/pybridge.h): names of built-in hooks.
COMPRESS_NONE, COMPRESS_FP16, COMPRESS_BF16 = abi.PB_COMPRESS_NONE, abi.PB_COMPRESS_FP16, abi.PB_COMPRESS_BF16
_COMPRESSION = {None: COMPRESS_NONE, "none": COMPRESS_NONE, "fp16": COMPRESS_FP16,
                "float16": COMPRESS_FP16, "half": COMPRESS_FP16, "bf16": COMPRESS_BF16,
                "bfloat16": COMPRESS_BF16}
_COMPRESSION_HOOK = {COMPRESS_NONE: comm_hooks.HOOK_ALLREDUCE, COMPRESS_FP16: comm_hooks.HOOK_FP16,
                     COMPRESS_BF16: comm_hooks.HOOK_BF16}


def _resolve_compression(c):
    if isinstance(c, torch.dtype):
        c = {torch.float16: COMPRESS_FP16, torch.bfloat16: COMPRESS_BF16}.get(c, c)
    if isinstance(c, str):
        c = _COMPRESSION.get(c.lower(), c)
    elif c is None:
        c = COMPRESS_NONE
    if isinstance(c, bool) or c not in (COMPRESS_NONE, COMPRESS_FP16, COMPRESS_BF16):
        raise InvalidArgument(f"unknown compression {c!r}; use None, 'fp16' or 'bf16' (codes 0..2)")
    return c


def _hook_choice(hook, state, compression):
    """(a built-in hook chosen by settings, or None; (state, hook) of a callable, or None).
    compression= is another name for a built-in hook: 'fp16' is hook=HOOK_FP16."""
    alias = _COMPRESSION_HOOK[compression]
    if hook is None:
        spec, pair = comm_hooks.BuiltinHook(alias), None
    elif isinstance(hook, (comm_hooks.BuiltinHook, comm_hooks.GossipHook)):
        spec, pair = hook, None
    elif isinstance(hook, int) and not isinstance(hook, bool):
        spec, pair = comm_hooks.BuiltinHook(hook), None
    elif callable(hook):
        spec, pair = None, (state, hook)
    else:
        raise InvalidArgument(f"hook must be callable as hook(state, bucket), a PB_HOOK_* code, or a "
                              f"comm_hooks.BuiltinHook or GossipHook, got {hook!r}")
    if spec is not None and state is not None:
        raise InvalidArgument("hook_state goes with a callable hook; a built-in hook makes its own state")
    if compression != COMPRESS_NONE and not (isinstance(spec, comm_hooks.BuiltinHook) and spec.code == alias):
        raise InvalidArgument(f"compression={compression} names the built-in hook {alias} (PB_HOOK_*), but "
                              f"hook={hook!r} was given too; give one of them")
    return spec, pair


def _resolve_op(op):
    code = {"avg": AVG, "mean": AVG, "sum": SUM}.get(op.lower()) if isinstance(op, str) else op
    if isinstance(code, bool) or code not in (AVG, SUM):
        raise InvalidArgument(f"reducer op must be 'avg' or 'sum' (codes {AVG}, {SUM}), got {op!r}")
    return code


def bucket_caps(bucket_cap_mb=None, first_bucket_cap_mb=None):
    """(bucket cap, first bucket cap) in MiB, by torch DDP's rule (torch 2.13): with the
    default bucket cap the first bucket is small (1 MiB), so the first allreduce starts
    early; a bucket cap the caller chose applies to the first bucket too, unless that is
    given as well. (Same buckets as torch DDP for the same arguments; on bench/reducer.py's
    model (a), one 13 MiB bucket took 25.5 ms per step against 27.8 with a 1 MiB first
    bucket, and 31.8 against 38.7 with PowerSGD.)"""
    cap = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
    if first_bucket_cap_mb is None:
        first_bucket_cap_mb = DEFAULT_FIRST_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
    return cap, first_bucket_cap_mb


def _resolve_cap(mb, what):
    return max(1, int(min(positive_finite(what, mb, " of MiB"), 1 << 30) * MiB))  # caps above 1 PiB are 1 PiB


class ParamSpec:
    """What the reducer needs to know about one parameter."""

    __slots__ = ("shape", "numel", "dtype", "device")

    def __init__(self, shape, dtype, device):
        self.shape = shape
        self.numel = 1
        for d in shape:
            self.numel *= d
        self.dtype = dtype
        self.device = device

    @property
    def nbytes(self):
        return self.numel * self.dtype.itemsize

    def __repr__(self):
        return f"ParamSpec({tuple(self.shape)}, {self.dtype}, {self.device})"


def _spec(i, item, default_device):
    if isinstance(item, torch.Tensor):
        return ParamSpec(tuple(item.shape), dtypes.torch_dtype(item.dtype), item.device)
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
        raise InvalidArgument(f"parameter {i}: expected a tensor or (numel or shape, dtype[, device]), "
                              f"got {item!r}")
    size, dt = item[0], item[1]
    device = _device(i, item[2]) if len(item) == 3 and item[2] is not None else default_device
    if isinstance(size, torch.Size):
        size = tuple(size)
    shape = (size,) if isinstance(size, int) and not isinstance(size, bool) else size
    expected = "a non-negative element count or a shape"
    if not isinstance(shape, (tuple, list)):
        raise InvalidArgument(f"parameter {i}: size must be {expected}, got {size!r}")
    shape = [integer(f"parameter {i}: size", d, low=0, expected=expected) for d in shape]
    dt = dtypes.torch_dtype(dt)
    n = 1
    for d in shape:
        n *= d
    check_extent(n, dt)
    if not dt.is_floating_point:
        raise InvalidArgument(f"parameter {i}: gradients must be floating point, got {dt}")
    return ParamSpec(tuple(shape), dt, device)


def _device(i, dev):
    """A torch device from a torch.device, a name, or a C ABI code (-1 CPU, k >= 0 CUDA k)."""
    if isinstance(dev, torch.device):
        return dev
    if isinstance(dev, int) and not isinstance(dev, bool):
        if dev < -1:
            raise InvalidArgument(f"parameter {i}: device code must be -1 (CPU) or a CUDA index, got {dev}")
        return torch.device("cpu") if dev == -1 else torch.device("cuda", dev)
    try:
        return torch.device(dev)
    except (RuntimeError, TypeError):
        raise InvalidArgument(f"parameter {i}: unknown device {dev!r}") from None


def assign_buckets(specs, order, bucket_cap, first_bucket_cap):
    """Group parameter indices into buckets: visit them in `order`, keep one open bucket
    per (dtype, device), close a bucket once it holds at least its cap (the first bucket of
    each kind gets `first_bucket_cap`, so the first allreduce starts early). Closing after
    the gradient that fills it (rather than before one that would overflow it) keeps a
    layer's bias and weight, which become ready together, in one bucket. Buckets are
    returned sorted by where their first member appears in `order`."""
    open_, closed, count = {}, [], {}
    for i in order:
        s = specs[i]
        key = (s.dtype, s.device)
        b = open_.setdefault(key, [[], 0])
        b[0].append(i)
        b[1] += s.nbytes
        cap = first_bucket_cap if count.get(key, 0) == 0 else bucket_cap
        if b[1] >= cap:
            closed.append(b[0])
            count[key] = count.get(key, 0) + 1
            del open_[key]
    closed.extend(b[0] for b in open_.values())
    pos = {i: k for k, i in enumerate(order)}
    closed.sort(key=lambda members: pos[members[0]])
    return closed


class _Bucket:
    __slots__ = ("index", "members", "flat", "dtype", "device")

    def __init__(self, index, members, specs):
        self.index = index
        self.members = members
        first = specs[members[0]]
        self.dtype, self.device = first.dtype, first.device
        total = sum(specs[i].numel for i in members)
        self.flat = torch.zeros(total, dtype=self.dtype, device=self.device)


def _wait(fut, deadline, what):
    """The value of a hook's future (its first element if a list), within `deadline`
    (time.monotonic(), or None for no bound). torch futures have no timed wait: poll."""
    if deadline is not None and not fut.done():
        pause = 50e-6
        while not fut.done():
            if time.monotonic() >= deadline:
                raise Timeout(f"{what} did not finish in time")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
    value = fut.wait()
    return value[0] if isinstance(value, (list, tuple)) else value


# What the reducer compares across ranks, by name (the order of the allgathered row).
_SETTINGS = ("parameters", "op", "bucket caps", "flags", "hook")
_SHOWN = 400  # bytes of each differing setting's value exchanged for the error message


class Reducer:
    """Gradient buckets with an asynchronous allreduce per bucket.

    `params`: a sequence of tensors or specs `(numel or shape, dtype[, device])`; dtype is a
    pybridge dtype code, name or torch dtype (floating point only); device defaults to the
    group's (CPU for gloo). `op`: 'avg' (default) or 'sum'. `hook`: how a full bucket
    travels (torch's DDP comm-hook contract, see pybridge/algorithms/comm_hooks.py): a callable
    hook(state, bucket) with its `hook_state`, a PB_HOOK_* code, or a comm_hooks.BuiltinHook
    (e.g. PowerSGD with its rank) or comm_hooks.GossipHook; default: allreduce.
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
    """

    def __init__(self, params, *, group=None, bucket_cap_mb=None, first_bucket_cap_mb=None, op="avg",
                 compression=None, hook=None, hook_state=None,
                 rebuild=True, allow_unused=False, names=None, join=False,
                 divide_by_initial_world_size=True):
        self._group = group or _group.current()
        self._group.check_open()
        params = list(params)
        default_device = self._group.device
        self.specs = [_spec(i, p, default_device) for i, p in enumerate(params)]
        self._on_cuda = any(s.device.type == "cuda" for s in self.specs)  # the group's stream applies
        if names is not None:
            names = [str(n) for n in names]
            if len(names) != len(self.specs):
                raise InvalidArgument(f"got {len(names)} names for {len(self.specs)} parameters")
        self.names = names
        self.op = _resolve_op(op)
        self.compression = _resolve_compression(compression)
        spec, pair = _hook_choice(hook, hook_state, self.compression)
        bucket_cap_mb, first_bucket_cap_mb = bucket_caps(bucket_cap_mb, first_bucket_cap_mb)
        self.bucket_cap = _resolve_cap(bucket_cap_mb, "bucket_cap_mb")
        self.first_bucket_cap = _resolve_cap(first_bucket_cap_mb, "first_bucket_cap_mb")
        self.allow_unused = bool(allow_unused)
        self.join_enabled = bool(join)
        self.divide_by_initial_world_size = bool(divide_by_initial_world_size)
        self.rebuild = self._rebuild_pending = bool(rebuild)
        self._world = self._group.size
        self._params = params if params and all(isinstance(p, torch.Tensor) for p in params) else None
        self._hook_state = self._hook = None
        self._lock = threading.Lock()
        self._closed = False
        self._bound = None  # the program's own gradient tensors (bind_grads), or None
        self.generation = 0
        self.iterations = 0  # completed wait() calls
        # Agreed on before a built-in hook is built: the gossip state's groups are a collective.
        self._hook_identity = spec.identity() if spec is not None else comm_hooks.identity(*pair)
        self._agree()
        self._hook_spec = spec  # a built-in hook is built again for a new group (rebind)
        self._use_hook(*(spec.build(self._group) if spec is not None else pair))
        self._layout(assign_buckets(self.specs, list(range(len(self.specs)))[::-1],
                                    self.bucket_cap, self.first_bucket_cap))
        self._start_iteration()

    # ---- layout -------------------------------------------------------------------------

    def _settings(self):
        """Every setting the ranks must share, by name (_SETTINGS), as readable text."""
        specs = [(s.shape, str(s.dtype).replace("torch.", ""), s.device.type) for s in self.specs]
        params = f"{len(specs)} parameters, {sum(s.numel for s in self.specs)} elements: {specs}"
        join = (f", join=True, divide_by_initial_world_size={self.divide_by_initial_world_size}"
                if self.join_enabled else "")
        return (params, "avg" if self.op == AVG else "sum",
                f"{self.bucket_cap} bytes, first bucket {self.first_bucket_cap} bytes",
                f"allow_unused={self.allow_unused}, rebuild={self.rebuild}{join}", self._hook_identity)

    def _agree(self):
        """One small allgather of (count, total elements, a hash per setting): a rank with
        other shapes or another hook would otherwise deadlock or mix up gradients later.
        When they differ, a second one exchanges the values that differ, for the message."""
        if self._world > 1:
            values = self._settings()
            mine = [len(self.specs), sum(s.numel for s in self.specs)] + [agree.signature(v) for v in values]
            rows = collectives.gather_rows(mine, group=self._group)
            differ = [k for k in range(len(_SETTINGS)) if len({row[2 + k] for row in rows}) > 1]
            if differ:
                names = [_SETTINGS[k] for k in differ]
                agree.check("reducer settings differ across ranks", self._values([values[k] for k in differ]),
                            describe=lambda row: "; ".join(f"{n}: {v}" for n, v in zip(names, row)),
                            fields=names, hint=". Every rank must create the reducer with the same parameter "
                            "shapes, dtypes and options, and register the same hook")
        self._stale = False

    def _values(self, values):
        """Every rank's `values` (texts, the first _SHOWN bytes of each), by rank: one
        all_gather of fixed size, so it cannot upset the backend."""
        mine = []
        for v in values:
            b = v.encode()[:_SHOWN]
            mine += list(b) + [0] * (_SHOWN - len(b))
        rows = collectives.gather_rows(mine, group=self._group)
        return [tuple(bytes(row[k * _SHOWN:(k + 1) * _SHOWN]).rstrip(b"\0").decode(errors="replace")
                      for k in range(len(values))) for row in rows]

    def _layout(self, assignment):
        self.buckets = [_Bucket(b, members, self.specs) for b, members in enumerate(assignment)]
        self._last = max((b.index for b in self.buckets if b.flat.numel()), default=-1)
        n = len(self.specs)
        self._bucket_of = [0] * n
        self._views = [None] * n
        for bucket in self.buckets:
            offset = 0
            for i in bucket.members:
                s = self.specs[i]
                self._bucket_of[i] = bucket.index
                self._views[i] = bucket.flat[offset:offset + s.numel].view(s.shape)
                offset += s.numel
        self._sizes = [len(b.members) for b in self.buckets]

    def _start_iteration(self):
        self._ready = bytearray(len(self.specs))
        self._pending = list(self._sizes)
        self._scaled = bytearray(len(self.specs))  # already divided by set_grad
        self._nscaled = [0] * len(self.buckets)
        self._next = 0  # next bucket to launch; buckets go out strictly in order
        self._works = []
        self._begun = False  # _begin() ran for this iteration
        self._count_work = None  # join's count of this iteration, still in flight
        self._scale = self._base_scale  # set_divisor() may change it for one iteration
        if self._rebuild_pending:
            self._order = []

    # ---- public API -----------------------------------------------------------------------

    @property
    def group(self):
        return self._group

    def set_allow_unused(self, allow):
        """Change allow_unused between iterations (the DDP wrapper's _set_static_graph); the
        ranks compare it at the next iteration's first mark_ready/set_grad/wait."""
        with self._lock:
            self._check_open()
            if any(self._ready):
                raise InvalidArgument("set_allow_unused() must be called between iterations")
            self.allow_unused = bool(allow)
            self._stale = True

    def set_shapes(self, shapes):
        """Give gradients shapes (same element counts) for callers that created the reducer
        from counts (C, Go): hooks such as PowerSGD compress matrices, not flat vectors.
        `shapes`: one shape per parameter, or None to keep that one's. Between iterations;
        the ranks compare them at the next iteration's first mark_ready/set_grad/wait."""
        with self._lock:
            self._check_open()
            if any(self._ready):
                raise InvalidArgument("set_shapes() must be called between iterations")
            shapes = list(shapes)
            if len(shapes) != len(self.specs):
                raise InvalidArgument(f"got {len(shapes)} shapes for {len(self.specs)} parameters")
            for i, shape in enumerate(shapes):
                if shape is None:
                    continue
                spec = _spec(i, (tuple(shape), self.specs[i].dtype, self.specs[i].device), None)
                if spec.numel != self.specs[i].numel:
                    raise InvalidArgument(f"parameter {i}: shape {tuple(shape)} holds {spec.numel} elements, "
                                          f"the parameter has {self.specs[i].numel}")
                self.specs[i] = spec
                self._views[i] = self._views[i].view(spec.shape)
            self._stale = True

    @property
    def num_params(self):
        return len(self.specs)

    @property
    def num_buckets(self):
        return len(self.buckets)

    @property
    def bucket_indices(self):
        """Parameter indices of each bucket, in bucket (= launch) order and layout order."""
        return [list(b.members) for b in self.buckets]

    @property
    def launched(self):
        """How many buckets of the current iteration have started their allreduce."""
        return self._next

    @property
    def missing(self):
        """Indices not yet marked ready in the current iteration."""
        return [i for i, r in enumerate(self._ready) if not r]

    def name(self, i):
        return self.names[i] if self.names else f"#{i}"

    def grad(self, i):
        """The gradient view of parameter `i`: a tensor over the bucket's memory, in the
        parameter's shape. Valid until `generation` changes."""
        self._check(i)
        return self._views[i]

    def grads(self):
        self._check_open()
        return list(self._views)

    def zero_grad(self):
        """Zero every bucket (for callers that accumulate into the views)."""
        self._check_open()
        with self._stream():
            for b in self.buckets:
                b.flat.zero_()

    def _stream(self):
        """Copies, zeroing and launches run on the group's stream when it has one
        (streams.py), so they stay in order with the collectives."""
        return streams.scope(self._group, cuda=self._on_cuda)

    def register_comm_hook(self, state, hook):
        """Communicate each full bucket with `hook(state, bucket) -> Future` (torch's DDP
        comm-hook contract; torch's own hooks work, see pybridge/algorithms/comm_hooks.py). Call it
        before the first gradient of an iteration is marked; every rank must register the
        same hook: the ranks compare it (comm_hooks.identity: the function's name, the
        state's type and known settings) at the next iteration's first mark_ready, set_grad
        or wait, and all raise InvalidArgument there when they differ. It replaces the hook
        chosen before, whose state is closed if it has close() (the reducer owns its hook's
        state). The hook must do its own averaging (torch's hooks do)."""
        if not callable(hook):
            raise InvalidArgument(f"hook must be callable as hook(state, bucket), got {hook!r}")
        with self._lock:
            self._check_open()
            if any(self._ready):
                raise InvalidArgument("register_comm_hook() must be called between iterations, "
                                      "not after gradients were marked ready")
            self._use_hook(state, hook)
            self._hook_spec = None
            self._stale = True

    def _use_hook(self, state, hook):
        old = self._hook_state
        self._hook_state, self._hook = state, hook
        self._hook_identity = comm_hooks.identity(state, hook)
        if old is not None and old is not state:
            _close_state(old)
        self._builtin = comm_hooks.prescales(hook)
        self._eager = comm_hooks.is_eager(hook)
        # pybridge's summing hooks let the 1/size of 'avg' be folded into the gradient copy
        # (set_grad); any other hook gets the plain local gradients and averages itself.
        self._base_scale = 1.0 / self._world if self._builtin and self.op == AVG and self._world > 1 else None
        self._scale = self._base_scale

    def mark_ready(self, i):
        """Gradient `i` is written: once every gradient of its bucket is, and every earlier
        bucket has been launched, the bucket's allreduce starts (asynchronously). With
        gradients bound (bind_grads), gradient i is first copied from the program's tensor."""
        with self._lock, self._stream():
            if not self._begun or self._stale:
                self._begin()
            if self._bound is not None:
                self._check_mark(i)
                self._copy_in(i, self._bound[i])
            self._mark(i)

    def set_grad(self, i, grad):
        """Copy `grad` (any tensor of parameter i's element count) into gradient i's view and
        mark it ready. For a gradient that lives elsewhere this is one pass instead of
        copy-then-mark: the averaging division is folded into the copy."""
        with self._lock, self._stream():
            if not self._begun or self._stale:
                self._begin()
            self._check_mark(i)
            view = self._views[i]
            if not isinstance(grad, torch.Tensor) or grad.numel() != view.numel():
                raise InvalidArgument(f"gradient {self.name(i)}: expected a tensor of {view.numel()} "
                                      f"elements, got {getattr(grad, 'shape', type(grad).__name__)}")
            self._copy_in(i, grad)
            self._mark(i)

    def _copy_in(self, i, grad):
        """Gradient i's view := grad, with the averaging division folded into the copy."""
        view = self._views[i]
        src = grad if grad.shape == view.shape else grad.reshape(view.shape)
        if src.requires_grad:  # backward(create_graph=True): the bucket takes the value, not the graph
            src = src.detach()
        if self._scale is None:
            view.copy_(src)
        else:
            torch.mul(src, self._scale, out=view)
            self._scaled[i] = 1
            self._nscaled[self._bucket_of[i]] += 1

    def bind_grads(self, grads):
        """Reduce the program's own gradient tensors (torch DDP's default mode, for programs
        whose gradients live in their tensor library): from now on mark_ready(i) first copies
        grads[i] into its bucket, and wait() copies the reduced gradients back into grads.
        One contiguous tensor per parameter, of its element count, dtype and device; the
        reducer keeps them until bind_grads(None). Between iterations."""
        with self._lock:
            self._check_open()
            if any(self._ready):
                raise InvalidArgument("bind_grads() must be called between iterations")
            if grads is None:
                self._bound = None
                return
            grads = list(grads)
            if len(grads) != len(self.specs):
                raise InvalidArgument(f"got {len(grads)} gradients for {len(self.specs)} parameters")
            for i, (g, s) in enumerate(zip(grads, self.specs)):
                if not isinstance(g, torch.Tensor) or g.numel() != s.numel or g.dtype != s.dtype \
                        or g.device != self._views[i].device or not g.is_contiguous():
                    got = (f"{tuple(g.shape)} {g.dtype} on {g.device}{'' if g.is_contiguous() else ', not contiguous'}"
                           if isinstance(g, torch.Tensor) else type(g).__name__)
                    raise InvalidArgument(f"gradient {self.name(i)}: expected a contiguous tensor of {s.numel} "
                                          f"{s.dtype} on {self._views[i].device}, got {got}")
            self._bound = [g.view(s.shape) for g, s in zip(grads, self.specs)]

    def _check_mark(self, i):
        self._check_open()
        index("gradient index", i, len(self._ready), f"{len(self.specs)} parameters")
        if self._ready[i]:
            raise InvalidArgument(
                f"gradient {self.name(i)} was marked ready twice in one iteration; each "
                "gradient may be marked once between wait() calls (if a parameter is "
                "used several times, mark it after its gradient is complete)")

    def _mark(self, i):
        self._check_mark(i)
        self._ready[i] = 1
        if self._rebuild_pending:
            self._order.append(i)
        b = self._bucket_of[i]
        self._pending[b] -= 1
        if self._pending[b] == 0 and b == self._next:
            self._launch_ready()

    def wait(self, timeout=None):
        """Wait for every bucket's allreduce and leave the reduced gradients in the views.

        Raises InvalidArgument naming the gradients never marked (unless allow_unused), and
        Timeout/CommError if the reduction fails. The next mark_ready starts a new iteration.
        """
        with self._lock, self._stream():
            self._check_open()
            if timeout is not None:
                timeout = positive_seconds("timeout", timeout)
            if not self._begun or self._stale:
                self._begin()
            missing = self.missing
            if missing and not self.allow_unused:
                drained = self._drain()
                self._start_iteration()
                raise self._unused_error(missing, drained)
            # Unused gradients count with what their views hold; launch what is left, in order.
            for i in missing:
                self._pending[self._bucket_of[i]] -= 1
            self._launch_ready()
            works, self._works = self._works, []
            deadline = None if timeout is None else time.monotonic() + timeout
            if self._count_work is not None:  # join's count went out before the buckets
                try:
                    self._count_work.wait(timeout)
                except Exception:
                    self._start_iteration()
                    raise
            try:
                for bucket, fut in works:
                    value = _wait(fut, deadline, f"bucket {bucket.index}")
                    if value.data_ptr() != bucket.flat.data_ptr():
                        bucket.flat.copy_(value)  # e.g. decompress in place
            except Exception as exc:  # noqa: BLE001
                self._start_iteration()
                raise _bucket_error(exc, bucket, self._group) from exc
            self.iterations += 1
            if self._bound is not None:  # the reduced gradients back into the program's tensors
                for dst, view in zip(self._bound, self._views):
                    dst.copy_(view)
            if self._rebuild_pending:
                order = self._order + [i for b in self.buckets for i in b.members
                                       if not self._ready[i]]
                self._rebuild_pending = False
                self._rebuild(order)
            self._start_iteration()

    def _unused_error(self, missing, drained):
        """torch DDP's most common error ("Expected to have finished reduction in the prior
        iteration", pytorch #57776), said at the end of the iteration that caused it: which
        gradients, by index (what C and Go pass) and by name, on which rank."""
        shown = 20
        indices = " ".join(map(str, missing[:shown]))
        more = f" and {len(missing) - shown} more" if len(missing) > shown else ""
        names = ""
        if self.names:
            names = f"; by name: {', '.join(self.names[i] for i in missing[:shown])}{more}"
        return InvalidState(
            f"rank {self._group.rank}: {len(missing)} gradient(s) were not marked ready in this iteration, "
            f"so the reduction cannot finish (torch DDP reports this at the next iteration as \"Expected "
            f"to have finished reduction in the prior iteration before starting a new one\"). Parameter "
            f"indices which did not receive grad for rank {self._group.rank}: {indices}{more}{names}. "
            "Mark every gradient each iteration, or create the reducer with allow_unused=True "
            "(find_unused_parameters=True in the DDP wrapper) so that they count as zero, and make sure "
            "every forward output takes part in the loss"
            + ("" if drained else ". The buckets already sent did not complete: other ranks marked "
               "different gradients, so the process group is out of step"))

    # The older name of wait(), kept: "finalize" is also pybridge.finalize(), leaving the group.
    finalize = wait

    # ---- uneven inputs (pybridge/ddp/join.py) ----------------------------------------------------

    def _begin(self):
        """The first mark_ready, set_grad or wait of an iteration: with join, count the ranks
        still training (and raise nothing: joined ranks shadow us); then the settings check
        after a change."""
        self._check_open()
        if not self._begun:
            self._begun = True
            if self.join_enabled and self.divide_by_initial_world_size:
                # Only the joined ranks need the answer: wait for it in wait().
                self._count_work = _join.count_active(self._group, True, async_op=True)
            elif self.join_enabled:
                self._set_divisor(_join.count_active(self._group, True))
        if self._stale:  # until the ranks agree, every call of the iteration checks again
            self._agree()

    def set_divisor(self, n):
        """Average this iteration's gradients over `n` ranks instead of the world size
        (torch Join's divide_by_initial_world_size=False: the ranks not yet joined). Before
        the iteration's first gradient is marked; wait() goes back to the world size. Only
        the built-in summing hooks with op 'avg' divide; other hooks average themselves."""
        n = integer("divisor", n, low=1)
        with self._lock:
            self._check_open()
            if any(self._ready):
                raise InvalidArgument("set_divisor() must be called before the iteration's first gradient")
            self._set_divisor(n)

    def _set_divisor(self, n):
        if self._base_scale is not None:
            self._scale = 1.0 / n

    def shadow(self):
        """One iteration of a rank that has joined (no more batches): the collectives the
        ranks still training issue in theirs, with zeros for this rank's gradients, through
        the same hook in bucket order; then the one rebuild if it is still to come. This
        rank's own gradient views are left as they are (torch's joined ranks reduce zero
        buckets of their own). Between iterations."""
        with self._lock:
            self._check_open()
            if any(self._ready):
                raise InvalidArgument("a rank joins between iterations, not after marking gradients")
            if self._stale:
                self._agree()
            futs = []
            for bucket in self.buckets:
                if not bucket.flat.numel() or (self._world == 1 and self._builtin):
                    continue
                flat = torch.zeros_like(bucket.flat)
                views, offset = [], 0
                for i in bucket.members:
                    n = self.specs[i].numel
                    views.append(flat[offset:offset + n].view(self.specs[i].shape))
                    offset += n
                params = None if self._params is None else [self._params[i] for i in bucket.members]
                grad_bucket = comm_hooks.GradBucket(bucket.index, flat, views, params,
                                                    bucket.index == self._last, None)
                try:
                    fut = self._hook(self._hook_state, grad_bucket)
                    if not self._eager:  # the next hook starts when this one is done, as in wait()
                        _wait(fut, None, f"bucket {bucket.index}")
                except Exception as exc:  # noqa: BLE001
                    raise _bucket_error(exc, bucket, self._group) from exc
                futs.append((bucket, fut))
            for bucket, fut in futs:
                try:
                    _wait(fut, None, f"bucket {bucket.index}")
                except Exception as exc:  # noqa: BLE001
                    raise _bucket_error(exc, bucket, self._group) from exc
            self.iterations += 1
            if self._rebuild_pending:
                self._rebuild_pending = False
                self._rebuild([i for b in self.buckets for i in b.members])
            self._start_iteration()

    def join(self):
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
            if any(self._ready):
                raise InvalidArgument("join() must be called between iterations, not after marking gradients")
        return _join.join_reducer(self)

    def state_dict(self):
        """What a restart needs to continue the schedule: completed iterations and the hook's
        step counter (GossipGraD's step, PowerSGD's iteration). PowerSGD's error feedback and
        warm-start factors are each rank's own and are not kept: after a restart they start
        from zero, as on a fresh reducer."""
        with self._lock:
            self._check_open()
            return {"iterations": self.iterations, "hook_step": comm_hooks.hook_step(self._hook_state)}

    def load_state_dict(self, state):
        """Restore state_dict()'s counters, between iterations."""
        if not isinstance(state, dict) or not isinstance(state.get("iterations"), int):
            raise InvalidArgument(f"reducer state must be a dict from state_dict(), got {state!r}")
        with self._lock:
            self._check_open()
            if any(self._ready):
                raise InvalidArgument("load_state_dict() must be called between iterations")
            self.iterations = state["iterations"]
            if isinstance(state.get("hook_step"), int):
                comm_hooks.set_hook_step(self._hook_state, state["hook_step"])

    def rebind(self, group):
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
            self._world = group.size
            self._works, self._count_work = [], None
            spec = self._hook_spec
            # In the constructor's order: agree, then build (a gossip state's groups are a collective).
            self._hook_identity = spec.identity() if spec is not None else \
                comm_hooks.identity(self._hook_state, self._hook)
            self._agree()
            self._use_hook(*(spec.build(group) if spec is not None else (self._hook_state, self._hook)))
            # A new rank starts with the first layout and rebuilds after its first wait():
            # every member does the same, so the buckets match from the first iteration on.
            self._relayout(list(range(len(self.specs)))[::-1])
            self._rebuild_pending = self.rebuild
            self._start_iteration()

    def close(self):
        """Release the buckets and close the hook's state if it has close() (a GossipState's
        thread and groups). Views already handed out keep their memory alive."""
        with self._lock:
            self._closed = True
            self.buckets, self._views, self._works, self._bound = [], [None] * len(self.specs), [], None
            state, self._hook_state = self._hook_state, None
        _close_state(state)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else f"{len(self.buckets)} buckets, generation {self.generation}"
        return f"<pybridge.Reducer {len(self.specs)} params, {state}>"

    # ---- internals ------------------------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise Closed("reducer is closed")
        if self._group.closed:  # also on 1 rank, where no collective would notice
            raise Closed("the process group this reducer was made from was finalized")

    def _check(self, i):
        self._check_open()
        index("gradient index", i, len(self.specs), f"{len(self.specs)} parameters")

    def _drain(self, limit=10.0):
        """Wait (bounded) for the buckets already launched, so that no allreduce is still
        writing into the buffers when the caller writes the next iteration's gradients.
        Ranks that made the same mistake launched the same buckets, so this is quick."""
        works, self._works = self._works, []
        deadline = time.monotonic() + min(limit, self._group.timeout or limit)
        try:
            if self._count_work is not None:
                self._count_work.wait(max(deadline - time.monotonic(), 1e-3))
            for bucket, fut in works:
                _wait(fut, deadline, f"bucket {bucket.index}")
        except Exception:  # noqa: BLE001 - reported as part of the caller's error
            return False
        return True

    def _launch_ready(self):
        pending, buckets = self._pending, self.buckets
        while self._next < len(buckets) and pending[self._next] == 0:
            bucket = buckets[self._next]
            self._next += 1
            if not bucket.flat.numel() or (self._world == 1 and self._builtin):
                continue  # nothing to exchange (other hooks run on one rank too, as in torch)
            # Pre-divide (as torch DDP does): keeps fp16 sums in range, and the result needs
            # no extra pass after the wait. Gradients that came through set_grad already are.
            scale = self._scale
            nscaled = self._nscaled[bucket.index]
            if scale is not None and 0 < nscaled < len(bucket.members):
                for i in bucket.members:
                    if not self._scaled[i]:
                        self._views[i].mul_(scale)
                scale = None
            elif nscaled:
                scale = None
            views = [self._views[i] for i in bucket.members]
            params = None if self._params is None else [self._params[i] for i in bucket.members]
            grad_bucket = comm_hooks.GradBucket(bucket.index, bucket.flat, views, params,
                                                bucket.index == self._last, scale)
            prev = self._works[-1][1] if self._works and not self._eager else None
            if prev is not None and not prev.done():
                # A hook may issue further collectives from its future's callbacks (PowerSGD
                # does, on the backend's thread). Started while those are still to come, the
                # next bucket's collectives could go out in another order on another rank
                # (seen: gloo aborting on a size mismatch, under torch DDP as well). So the
                # next hook starts when the previous future is done, from its callback:
                # the same order everywhere, and backward is not held up. Hooks declared
                # eager (comm_hooks.declare_eager) start at once.
                fut = self._after(prev, bucket, grad_bucket)
            else:
                try:
                    fut = self._hook(self._hook_state, grad_bucket)
                except Exception as exc:  # noqa: BLE001
                    raise _bucket_error(exc, bucket) from exc
            self._works.append((bucket, fut))

    def _after(self, prev, bucket, grad_bucket):
        """A future for `bucket`'s hook, started once `prev` is done."""
        fut = torch.futures.Future()

        def finish(inner):
            try:
                fut.set_result(inner.value())
            except Exception as exc:  # noqa: BLE001 - raised by wait(), naming the bucket
                fut.set_exception(exc)

        def start(_):
            try:
                self._hook(self._hook_state, grad_bucket).add_done_callback(finish)
            except Exception as exc:  # noqa: BLE001
                fut.set_exception(_bucket_error(exc, bucket))

        prev.add_done_callback(start)
        return fut

    def _rebuild(self, order):
        if self._world > 1:
            t = torch.tensor(order, dtype=torch.int64, device=self._group.device)
            collectives.broadcast(t, 0, group=self._group)
            order = t.tolist()
        self._relayout(order)

    def _relayout(self, order):
        assignment = assign_buckets(self.specs, order, self.bucket_cap, self.first_bucket_cap)
        if assignment == self.bucket_indices:
            return
        old = self._views
        self._layout(assignment)
        for new, prev in zip(self._views, old):
            new.copy_(prev)
        self.generation += 1


def _close_state(state):
    """Close a hook state that owns resources (GossipState: a thread and groups)."""
    close = getattr(state, "close", None)
    if callable(close):
        close()


def _bucket_error(exc, bucket, group=None):
    """A pybridge error that names the bucket whose communication failed (and, given the
    group, the ranks that died or are late: watchdog.py)."""
    what = f"bucket {bucket.index} ({len(bucket.members)} gradients)"
    if group is not None:
        return _watchdog.explain_latest(group, exc, what)
    err = classify(exc)
    err.args = (f"{what}: {err}",)
    return err


__all__ = ["Reducer", "ParamSpec", "assign_buckets",
           "COMPRESS_NONE", "COMPRESS_FP16", "COMPRESS_BF16",
           "DEFAULT_BUCKET_CAP_MB", "DEFAULT_FIRST_BUCKET_CAP_MB", "bucket_caps"]
