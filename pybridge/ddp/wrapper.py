"""A drop-in for torch.nn.parallel.DistributedDataParallel, driven by pybridge's Reducer.

torch 2.13's constructor keywords are accepted with torch's meaning or refused saying why
(ddp_options.py; the table is in docs/python-api.md). By default each parameter's .grad is
a view into the reducer's flat buckets after the first backward, so nothing is copied out
of the buckets, and while .grad is kept (zero_grad(set_to_none=False), no_sync accumulation)
autograd accumulates straight into them. When .grad was None, autograd hands over a fresh
gradient; the hook copies it into the bucket with the averaging folded into that copy (one
pass, like torch DDP) and points .grad at the view. gradient_as_bucket_view=False keeps
.grad the program's own tensor, as torch's default does: the reduced values are copied back.

A post-accumulate-grad hook marks the gradient ready; the first hook of a backward pass
queues a callback that waits for the reduction when backward ends, so the training loop is
the usual `loss.backward(); opt.step()`.
"""

import contextlib
import warnings
import weakref
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch
from torch.distributed.algorithms.join import Join, Joinable, _JoinConfig
from torch.distributed.utils import _to_kwargs
from torch.nn.parallel import DistributedDataParallel as _TorchDDP
from torch.utils.hooks import RemovableHandle

from ..algorithms.contract import CommHook
from ..comm import collectives
from . import options as _opts
from ..comm import group as _group
from ..comm import world as _world
from . import join as _join
from .stats import Stats
from ..errors import Closed, InvalidArgument, InvalidState, PyBridgeError
from ..observe import clock as _clock
from ..observe import state as _obs
from .attach import repoint, take
from .reducer import Reducer
from ..comm.params import broadcast_parameters

_engine = torch.autograd.Variable._execution_engine
_KEEP_GRAD_BYTES = 1 << 20  # see _spare in DistributedDataParallel._attach
# Rebuilt after unpickling (see __getstate__): the group, the reducer and what hangs on them.
_TRANSIENT = ("_pb_group", "process_group", "_reducer", "_views", "_generation", "_hooks", "_spare",
              "_stats", "_queued")


# Why one class of this size: it is torch's DistributedDataParallel drop-in, so it carries
# torch's whole public surface (attributes, no_sync, join, comm hooks, logging data,
# pickling); the reduction itself lives in the Reducer and attach.py, the keywords' checks in
# options.py and the logging data in stats.py.
class DistributedDataParallel(torch.nn.Module, Joinable):
    """Wrap `module` for data-parallel training: torch's DistributedDataParallel over a
    pybridge group (torch's keywords, same order; see docs/python-api.md for each one's status).

    Collective order: every rank must run the same sequence of forward/backward calls
    (forward broadcasts buffers, backward reduces gradients).

    torch's keywords: `process_group` (a torch ProcessGroup, torch's default group included,
    or a pybridge Group), `device_ids`/`output_device` (one device per process; None for CPU
    modules), `dim`, `broadcast_buffers`/`forward_sync_buffers` (copy rank 0's buffers to
    all ranks before each forward that will be followed by a synchronized backward),
    `init_sync` (broadcast rank 0's parameters and buffers at construction),
    `bucket_cap_mb` (default 25), `find_unused_parameters` (parameters that get no gradient
    in an iteration count as zero; those unused on every rank keep .grad None, as with torch
    DDP), `check_reduction` (deprecated, ignored), `gradient_as_bucket_view` (None, the
    default: .grad is a bucket view, and autograd's fresh gradients of 1 MiB or more are kept
    until the next backward, which is faster but holds that memory when .grad is set to None
    between steps; True: a bucket view holding nothing more, torch's memory; False: .grad
    stays a tensor of its own), `static_graph`,
    `device_mesh` (1-D), `skip_all_reduce_unused_params` and `batched_grad_copy` (accepted;
    pybridge's results are the same either way). Refused, saying why: `mixed_precision`,
    `delay_all_reduce_named_params`/`param_to_hook_all_reduce`, `bucket_cap_mb_list`.

    pybridge's keywords: `group` (a pybridge Group), `op` ('avg' or 'sum'), `compression`
    (None, 'fp16', 'bf16': float32 buckets travel compressed; the built-in fp16/bf16 hooks),
    `first_bucket_cap_mb` (default 1 with the default bucket cap, else the bucket cap, as in
    torch DDP; see reducer.bucket_caps), `rebuild_buckets` (reorder buckets after the first
    iteration by when gradients become ready).

    Example::

        >>> import torch, pybridge
        >>> model = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))   # after pybridge.init()
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> loss = model(torch.randn(8, 4)).pow(2).mean()
        >>> loss.backward()                        # gradients averaged over the ranks as they come
        >>> opt.step()
        >>> with model.no_sync():                  # accumulate locally, reduce at the next backward
        ...     model(torch.randn(8, 4)).sum().backward()
    """

    _reducer: Reducer  # None from unpickling until first use (_ensure)
    _stats: Stats  # likewise
    _hooks: Optional[list[RemovableHandle]]  # None once closed (or unpickled)
    _counts: Optional[list[int]]  # static graph: hook firings per parameter, learned in the first iteration
    _static_unused: Optional[set[int]]  # static graph: the parameters no rank uses
    _join_used: Optional[torch.Tensor]

    def __init__(self, module: torch.nn.Module, device_ids: Optional[Sequence[Union[int, torch.device]]] = None,
                 output_device: Optional[Union[int, torch.device]] = None, dim: int = 0,
                 broadcast_buffers: Optional[bool] = None, init_sync: bool = True, process_group: Any = None,
                 bucket_cap_mb: Optional[float] = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: Optional[bool] = None,
                 static_graph: bool = False, delay_all_reduce_named_params: Any = None,
                 param_to_hook_all_reduce: Any = None, mixed_precision: Any = None, device_mesh: Any = None,
                 skip_all_reduce_unused_params: bool = False, bucket_cap_mb_list: Any = None,
                 batched_grad_copy: bool = False, forward_sync_buffers: Optional[bool] = None, *,
                 group: Optional[_group.Group] = None, first_bucket_cap_mb: Optional[float] = None,
                 op: Union[str, int] = "avg", compression: Optional[str] = None,
                 rebuild_buckets: bool = True) -> None:
        super().__init__()
        self._join_config = _JoinConfig.construct_disabled_join_config()  # Joinable's state (Join)
        self._join_divide_by_initial = True
        self._join_used = None  # the last reduced used-parameter map (unused detection)
        _opts.refuse(mixed_precision, delay_all_reduce_named_params, param_to_hook_all_reduce,
                     bucket_cap_mb_list, check_reduction)
        self.parameters_to_ignore = _opts.ignored(module)
        self._names: list[str]
        self._params: list[torch.nn.Parameter]
        self._names, self._params = _opts.trainable(module, self.parameters_to_ignore)
        self.device_ids, self.output_device = _opts.devices(self._params, device_ids, output_device)
        self._pb_group: _group.Group = _opts.resolve_group(group, process_group, device_mesh)
        self._pb_group.check_open()
        self.process_group = self._pb_group.pg
        self.module = module
        # Whether there are buffers to sync, decided once as torch DDP does (modules_buffers):
        # each forward would otherwise walk the module tree to find none.
        self._has_buffers = bool(self._sync_buffers_list())
        self.dim = dim
        self.device = self._params[0].device
        self.device_type = self.device.type
        self.forward_sync_buffers: bool
        self.forward_sync_buffers, init_buffers = _opts.buffer_sync(broadcast_buffers, forward_sync_buffers)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.skip_all_reduce_unused_params = bool(skip_all_reduce_unused_params)
        self.batched_grad_copy = bool(batched_grad_copy)
        self.mixed_precision = None
        self.static_graph = False
        self._reducer_args: dict[str, Any] = dict(bucket_cap_mb=bucket_cap_mb, first_bucket_cap_mb=first_bucket_cap_mb, op=op,
                                  compression=compression, rebuild=rebuild_buckets)
        self._init_sync = (bool(init_sync), init_buffers)
        self._broadcast_initial()
        self._attach()
        for p, v in zip(self._params, self._views):
            if p.grad is not None and self._view_mode:
                v.copy_(p.grad)
                p.grad = v
        if static_graph:
            self._set_static_graph()

    def _attach(self) -> None:
        """Per-process state: the reducer, the hooks, the logging data (again after unpickling)."""
        self._reducer = Reducer(self._params, group=self._pb_group, names=self._names,
                                allow_unused=self.find_unused_parameters or self.static_graph,
                                **self._reducer_args)
        self._views = self._reducer.grads()
        self._generation = self._reducer.generation
        n = len(self._params)
        self._used = bytearray(n)   # got a gradient since the last sync (unused detection only)
        self._fresh = bytearray(n)  # unused, .grad was None: we filled it ourselves
        self._fired = [0] * n       # hooks fired this iteration (static graph only)
        # Autograd's own large gradient tensors, kept until the next backward replaces them.
        # Freed mid-backward (right after the copy into the bucket), a large one often lets
        # glibc trim the heap, and the next gradient of that size is then built in freshly
        # faulted, zeroed pages: measured ~4,000-8,000 page faults and ~5% of the step on 3
        # layers of 2048x2048 (torch DDP, which keeps .grad, has none). Small ones are freed at
        # once: the next layer's gradient reuses that cache-hot memory (keeping 256 KiB ones
        # cost ~4% on 50 layers of 256x256).
        self._spare: list[Optional[torch.Tensor]] = [None] * n
        # Spares cost memory as large as those gradients (bench/ddp_memory.py): only by default;
        # gradient_as_bucket_view=True asks for torch's memory, which keeps none.
        self._keep_spares = self.gradient_as_bucket_view is None
        self._sync = True
        self._queued = False
        self._view_mode = self.gradient_as_bucket_view is not False
        self._stats = Stats(self, self.module, self._params, self._pb_group)
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(k))
                       for k, p in enumerate(self._params)]

    @property
    def reducer(self) -> Reducer:
        """The Reducer behind the wrapper (its buckets, hook and counters)."""
        return self._ensure()

    def _ensure(self) -> Reducer:
        if self._reducer is None:  # unpickled: built at first use (a collective, like construction)
            self._attach()
        return self._reducer

    # ---- torch's attribute names ----------------------------------------------------------

    @property
    def broadcast_buffers(self) -> bool:
        """torch's name: whether buffers are copied from rank 0 before each synchronized forward."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = bool(value)

    @property
    def require_backward_grad_sync(self) -> bool:
        """torch's name: whether the next backward reduces gradients (False inside no_sync)."""
        return self._sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self._sync = bool(value)

    @property
    def bucket_bytes_cap(self) -> int:
        """torch's name: the bucket cap in bytes."""
        return self.reducer.bucket_cap

    _set_params_and_buffers_to_ignore_for_model = staticmethod(_TorchDDP._set_params_and_buffers_to_ignore_for_model)
    _get_data_parallel_params = staticmethod(_TorchDDP._get_data_parallel_params)

    # ---- training-loop surface --------------------------------------------------------------

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """The module's forward (with buffers synchronized first, and inputs moved to the device
        of device_ids), so that the backward that follows reduces the gradients."""
        if self._hooks is None and self._reducer is not None:
            raise Closed("DistributedDataParallel wrapper is closed")
        self._ensure()
        sync = torch.is_grad_enabled() and self._sync
        root = self._join_pre_forward()  # Join: rank 0 may have joined with stale buffers
        if sync:
            self._stats.forward_start()
            if self._will_sync_buffers():
                broadcast_parameters(self._sync_buffers_list(), root, group=self._pb_group)
        if self.device_ids:
            moved, moved_kwargs = _to_kwargs(inputs, kwargs, torch.device(self.device_type, self.device_ids[0]),
                                             False)
            inputs, kwargs = moved[0], moved_kwargs[0]
        rec = _obs.REC
        if rec is None:
            out = self.module(*inputs, **kwargs)
        else:
            start = _clock.now_us()
            out = self.module(*inputs, **kwargs)
            rec.on_forward(start)
        if sync:
            self._stats.forward_end()
        return out

    def _sync_buffers_list(self) -> list[torch.Tensor]:
        return [b for n, b in self.module.named_buffers() if n not in self.parameters_to_ignore]

    def _will_sync_buffers(self) -> bool:
        return (self._has_buffers and self.forward_sync_buffers and self._sync and self._pb_group.size > 1
                and torch.is_grad_enabled())

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients (in the buckets); the first
        synchronized backward afterwards reduces the accumulated sum."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        """Communicate gradient buckets with `hook(state, bucket) -> torch.futures.Future`, as
        torch's DistributedDataParallel.register_comm_hook: torch's hooks run unmodified, e.g.
        `register_comm_hook(None, default_hooks.fp16_compress_hook)` or PowerSGD with
        `powerSGD_hook.PowerSGDState(process_group=None, ...)`. Call before training (or
        between iterations); every rank registers the same hook (the ranks compare it at the
        next backward, before anything is sent: Reducer.register_comm_hook). The wrapper owns
        `state`: close() closes it if it has close().

        Example::

            >>> import torch, pybridge
            >>> from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            >>> ddp_model = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))
            >>> ddp_model.register_comm_hook(None, default_hooks.allreduce_hook)   # None: the world
        """
        self.reducer.register_comm_hook(state, hook)
        self._stats.set("comm_hook", getattr(hook, "__qualname__", repr(hook)))

    def _broadcast_initial(self) -> None:
        """init_sync: rank 0's parameters (and buffers) to every rank."""
        init_sync, init_buffers = self._init_sync
        if init_sync:
            synced: list[torch.Tensor] = [p for n, p in self.module.named_parameters() if n not in self.parameters_to_ignore]
            if init_buffers:
                synced += self._sync_buffers_list()
            broadcast_parameters(synced, 0, group=self._pb_group)

    def rebind(self, group: _group.Group) -> None:
        """Reduce over another group from now on: elastic training's new world
        (pybridge.runtime.elastic; State.reset calls it for State(model=ddp)). The iteration in
        progress is dropped. COLLECTIVE on the new group, with the collectives a new rank's
        constructor makes (the initial broadcast, the reducer's agreement), in its order."""
        group.check_open()
        self._pb_group = group
        self._broadcast_initial()
        self.reducer.rebind(group)
        self.process_group = group.pg
        self._sync = True
        self._stats = Stats(self, self.module, self._params, group)

    def close(self) -> None:
        """Remove the hooks and release the buckets; .grad tensors stay usable."""
        if self._hooks is not None:
            for h in self._hooks:
                h.remove()
            self._hooks = None
            self._spare = [None] * len(self._params)
            self._reducer.close()

    # ---- torch's private surface that programs and torch's tests use ----------------------------

    def _set_static_graph(self) -> None:
        """The set of used parameters and how often each one's gradient is accumulated per
        backward are the same every iteration (torch's static_graph): learned in the first
        iteration, which reduces everything at its end; unused parameters need no
        find_unused_parameters. Call before the first training iteration."""
        self._ensure()
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.", stacklevel=2)
            return
        if self._stats.iterations or self.reducer.iterations:
            raise self._logged(InvalidState(
                "_set_static_graph() should be called before training loop starts and after "
                "DistributedDataParallel is constructed"))
        self.static_graph = True
        self._counts = None  # hook firings per parameter, learned in the first iteration
        self._static_unused = None
        self.reducer.set_allow_unused(True)
        self._stats.set("static_graph", 1)
        if self.find_unused_parameters:
            warnings.warn("You passed find_unused_parameters=true to DistributedDataParallel, "
                          "`_set_static_graph` will detect unused parameters automatically, so you do not need "
                          "to set find_unused_parameters=true", stacklevel=2)

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        """torch's DDP logging data (a dict): settings, environment, bucket sizes, sampled
        timings in ns, the last error (pybridge/ddp/stats.py)."""
        self._ensure()
        return dict(self._stats.data)

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate < 1:
            raise InvalidArgument(f"DDP runtime logging sample rate should be an integer equal or greater "
                                  f"than 1, got {sample_rate!r}")
        self._ensure()
        self._stats.sample_rate = sample_rate

    def _logged(self, err: PyBridgeError) -> PyBridgeError:
        self._stats.error(err)
        return err

    # ---- Join: uneven inputs (torch's Joinable protocol; the logic is in pybridge/ddp/join.py) -----

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """torch DDP's join(): a context manager for ranks with different numbers of batches,
        `torch.distributed.algorithms.join.Join([self], ...)`. A rank whose loop ends waits in
        the context's exit, shadowing the forward and backward collectives of the ranks still
        training with zero gradients, until all have joined; then every rank takes the
        parameters (and buffers) of the last rank to join. divide_by_initial_world_size: average
        over the world size (True) or over the ranks still training (False);
        throw_on_early_termination: every rank raises RuntimeError once one runs out. Also
        works as one of several joinables: `Join([ddp_model, ...])`."""
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs: Any) -> _join.DDPJoinHook:
        """The JoinHook that torch's Join context calls on a joined rank (kwargs:
        divide_by_initial_world_size, default True)."""
        return _join.DDPJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        """Where torch's Join context keeps its counts: the group's device."""
        device: torch.device = self._pb_group.device
        return device

    @property
    def join_process_group(self) -> Any:
        """The torch ProcessGroup torch's Join context counts the joined ranks on."""
        pg = self._pb_group.pg
        try:
            torch.distributed.get_rank(pg)
        except (RuntimeError, ValueError):
            raise InvalidArgument("Join needs a group torch.distributed knows (the world group, or a torch "
                                  "group given as process_group=): this wrapper's group is a subgroup "
                                  "pybridge built, outside torch's registry") from None
        return pg

    def _join_pre_forward(self) -> int:
        """Each forward in a Join context: tell the context this rank still trains (torch's
        Join.notify_join_context), then tell joined ranks what to shadow (join.iteration_flags).
        Returns the rank to broadcast buffers from: the largest still training, else 0."""
        work = Join.notify_join_context(self)
        if not self._join_config.enable:
            return 0
        sync = torch.is_grad_enabled() and self._sync
        root: int = _join.iteration_flags(self._pb_group, sync, self._will_sync_buffers())[2]
        if sync and work is not None and not self._join_divide_by_initial:
            self.reducer.set_divisor(_join.work_count(work))  # the ranks not yet joined
        return root

    def _join_broadcast(self, tensors: Sequence[torch.Tensor], root: int) -> None:
        broadcast_parameters(tensors, root, group=self._pb_group)

    def _join_exchanges_used(self) -> bool:
        """Whether backward ends with the used-parameter exchange (_drop_unused): a joined
        rank sends its part too."""
        return self._reducer.allow_unused and not (self.static_graph and self._static_unused is not None)

    # ---- pickling (torch.save of the wrapper) ---------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        _opts.check_picklable(self._pb_group)
        state = dict(self.__dict__)
        for key in _TRANSIENT:
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """As torch: rebuilt on the world group of the loading process; the reducer and its
        hooks are made at first use, so loading alone issues no collective."""
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # torch.nn.Module's
        self._pb_group = _world.current()
        self.process_group = self._pb_group.pg
        self._reducer = self._stats = None  # type: ignore[assignment]  # until _ensure() rebuilds them
        self._hooks = None
        self._queued = False

    # ---- hooks --------------------------------------------------------------------------------

    def _make_hook(self, k: int) -> Callable[[torch.Tensor], None]:
        # The parameter holds its hook; a hook holding the wrapper would keep the wrapper, its
        # reducer and their group alive as long as the program's model, after the program
        # dropped the wrapper (torch's reducer holds no reference from its hooks either).
        wrapper = weakref.ref(self)

        def hook(p: torch.Tensor) -> None:
            self = wrapper()
            if self is None:
                return
            if self.find_unused_parameters or self.static_graph:
                self._used[k] = 1
            if not self._sync:
                return
            if not self._queued:
                self._queued = True
                _engine.queue_callback(self._end_of_backward)
            if self.static_graph:
                self._fired[k] += 1
                if self._counts is None or self._fired[k] < self._counts[k]:
                    return  # first iteration: reduced at its end; later: after the last accumulation
            self._ready(k, p)
        return hook

    def _ready(self, k: int, p: torch.Tensor) -> None:
        reducer, stats = self._reducer, self._stats
        # Marked when backward wrote the view; else copied in, scaled (and in view mode the
        # view adopted as .grad); in copy mode the result comes back at the end of backward.
        g = take(reducer, k, p, self._views[k], self._view_mode)
        if g is None:
            self._spare[k] = None  # .grad is kept now (set_to_none=False): no fresh gradient will come
        elif self._view_mode and self._keep_spares and g.nbytes >= _KEEP_GRAD_BYTES and not g.requires_grad:
            self._spare[k] = g  # see _spare in _attach
        if stats.on:
            stats.grad_ready(k, reducer.launched)

    def _end_of_backward(self) -> None:
        self._queued = False
        reducer = self._reducer
        try:
            if self.static_graph and self._counts is None:
                for k, p in enumerate(self._params):
                    if self._fired[k] and p.grad is not None:
                        self._ready(k, p)
            if reducer.allow_unused:
                self._fill_unused(reducer.missing)
            if self._stats.on:
                self._stats.backward_computed()
            reducer.wait()
        except PyBridgeError as exc:
            self._logged(exc)
            raise
        if reducer.generation != self._generation:
            old, self._views = self._views, reducer.grads()
            self._generation = reducer.generation
            repoint(self._params, old, self._views)
        if reducer.iterations == 1 and reducer.rebuild:
            self._stats.rebuilt(reducer)
        unused = self._drop_unused() if reducer.allow_unused else 0
        if not self._view_mode:
            for p, v in zip(self._params, self._views):
                if p.grad is not None:
                    p.grad.copy_(v)
        if self.static_graph:
            if self._counts is None:
                self._counts = list(self._fired)
            self._fired = [0] * len(self._params)
        if self._stats.on:
            self._stats.backward_end(reducer, unused)

    def _fill_unused(self, missing: Sequence[int]) -> None:
        """Gradients not marked this iteration contribute what .grad holds (zero when None),
        as in torch DDP."""
        for k in missing:
            p, v = self._params[k], self._views[k]
            g = p.grad
            if g is None:
                v.zero_()
                self._fresh[k] = 1
            elif g is not v:
                v.copy_(g)
            if self._view_mode:
                p.grad = v

    def _drop_unused(self) -> int:
        """Parameters no rank used keep .grad None (torch DDP's rule); those used elsewhere get
        the reduced gradient. Returns the bytes of this rank's unused parameters."""
        if self.static_graph and self._static_unused is not None:
            unused = self._static_unused  # the same every iteration: no exchange
        else:
            # Issued after every bucket (wait() launched them all), so the order of
            # collectives is the same on every rank.
            used = torch.tensor(list(self._used), dtype=torch.uint8, device=self._pb_group.device)
            if self._pb_group.size > 1:
                collectives.all_reduce(used, collectives.MAX, group=self._pb_group)
            self._join_used = used  # Join: what this rank contributes once joined, as torch's does
            unused = {k for k, u in enumerate(used.tolist()) if not u}
            if self.static_graph:
                self._static_unused = unused
        for k in unused:
            if self._fresh[k]:
                self._params[k].grad = None
        if not self._view_mode:
            for k, p in enumerate(self._params):
                if self._fresh[k] and k not in unused:
                    p.grad = self._views[k].clone()  # used on another rank: the reduced value
        nbytes = sum(self._params[k].numel() * self._params[k].element_size()
                     for k, u in enumerate(self._used) if not u)
        self._used = bytearray(len(self._params))
        self._fresh = bytearray(len(self._params))
        return nbytes


__all__ = ["DistributedDataParallel"]
