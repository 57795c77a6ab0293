"""A DistributedDataParallel-like wrapper for torch.nn.Module, driven by pybridge's Reducer.

After the first backward each parameter's .grad is a view into the reducer's flat buckets,
so nothing is copied out of the buckets, and while .grad is kept (zero_grad(set_to_none=
False), no_sync accumulation) autograd accumulates straight into them. When .grad was
None, autograd hands over a fresh gradient; the hook copies it into the bucket with the
averaging folded into that copy (one pass, like torch DDP) and points .grad at the view.
A post-accumulate-grad hook marks the gradient ready; the first hook of a backward pass
queues a callback that waits for the reduction when backward ends, so the training loop
is the usual `loss.backward(); opt.step()`.
"""

import contextlib

import torch
from torch.distributed.algorithms.join import Join, Joinable, _JoinConfig

from . import collectives
from . import join as _join
from . import group as _group
from .errors import Closed, InvalidArgument
from .reducer import Reducer, broadcast_parameters

_engine = torch.autograd.Variable._execution_engine
_KEEP_GRAD_BYTES = 1 << 20  # see _spare in DistributedDataParallel.__init__


class DistributedDataParallel(torch.nn.Module, Joinable):
    """Wrap `module` for data-parallel training over the current pybridge group.

    Collective order: every rank must run the same sequence of forward/backward calls
    (forward broadcasts buffers, backward reduces gradients).

    Options: `broadcast_buffers` (copy rank 0's buffers to all ranks before each forward
    that will be followed by a synchronized backward), `find_unused_parameters` (parameters
    that get no gradient in an iteration count as zero; those unused on every rank keep
    .grad None, as with torch DDP), `op` ('avg' or 'sum'), `compression` (None, 'fp16',
    'bf16': float32 buckets travel compressed; the built-in fp16/bf16 hooks), `bucket_cap_mb` (default 25),
    `first_bucket_cap_mb` (default 1 with the default bucket cap, else the bucket cap, as in
    torch DDP; see reducer.bucket_caps), `rebuild_buckets` (reorder buckets after the first
    iteration by when gradients become ready), `init_sync` (broadcast parameters and buffers
    from rank 0 at construction).
    """

    def __init__(self, module, *, group=None, bucket_cap_mb=None, first_bucket_cap_mb=None,
                 broadcast_buffers=True,
                 find_unused_parameters=False, op="avg", compression=None,
                 rebuild_buckets=True, init_sync=True):
        super().__init__()
        self._join_config = _JoinConfig.construct_disabled_join_config()  # Joinable's state (Join)
        self._join_divide_by_initial = True
        self._join_used = None  # the last reduced used-parameter map (find_unused_parameters)
        self.module = module
        self._pb_group = group or _group.current()
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self.broadcast_buffers = bool(broadcast_buffers)
        self.find_unused_parameters = bool(find_unused_parameters)
        if init_sync:
            broadcast_parameters(list(module.parameters()) + list(module.buffers()), 0,
                                 group=self._pb_group)
        self.reducer = Reducer(self._params, group=self._pb_group, names=self._names,
                               bucket_cap_mb=bucket_cap_mb, first_bucket_cap_mb=first_bucket_cap_mb,
                               op=op, compression=compression, rebuild=rebuild_buckets,
                               allow_unused=find_unused_parameters)
        self._views = self.reducer.grads()
        self._generation = self.reducer.generation
        for p, v in zip(self._params, self._views):
            if p.grad is not None:
                v.copy_(p.grad)
                p.grad = v
        n = len(self._params)
        self._used = bytearray(n)   # got a gradient since the last sync (find_unused only)
        self._fresh = bytearray(n)  # unused, .grad was None: we pointed it at a zeroed view
        # Autograd's own large gradient tensors, kept until the next backward replaces them.
        # Freed mid-backward (right after the copy into the bucket), a large one often lets
        # glibc trim the heap, and the next gradient of that size is then built in freshly
        # faulted, zeroed pages: measured ~4,000-8,000 page faults and ~5% of the step on 3
        # layers of 2048x2048 (torch DDP, which keeps .grad, has none). Small ones are freed at
        # once: the next layer's gradient reuses that cache-hot memory (keeping 256 KiB ones
        # cost ~4% on 50 layers of 256x256).
        self._spare = [None] * len(self._params)
        self._sync = True
        self._queued = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(k))
                       for k, p in enumerate(self._params)]

    # ---- training-loop surface --------------------------------------------------------------

    def forward(self, *args, **kwargs):
        if self._hooks is None:
            raise Closed("DistributedDataParallel wrapper is closed")
        root = self._join_pre_forward()  # Join: rank 0 may have joined with stale buffers
        if self._will_sync_buffers():
            broadcast_parameters(list(self.module.buffers()), root, group=self._pb_group)
        return self.module(*args, **kwargs)

    def _will_sync_buffers(self):
        return (torch.is_grad_enabled() and self._sync and self.broadcast_buffers and self._pb_group.size > 1
                and any(True for _ in self.module.buffers()))

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate gradients (in the buckets); the first
        synchronized backward afterwards reduces the accumulated sum."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def register_comm_hook(self, state, hook):
        """Communicate gradient buckets with `hook(state, bucket) -> torch.futures.Future`, as
        torch's DistributedDataParallel.register_comm_hook: torch's hooks run unmodified, e.g.
        `register_comm_hook(None, default_hooks.fp16_compress_hook)` or PowerSGD with
        `powerSGD_hook.PowerSGDState(process_group=None, ...)`. Call before training (or
        between iterations); every rank registers the same hook (the ranks compare it at the
        next backward, before anything is sent: Reducer.register_comm_hook). The wrapper owns
        `state`: close() closes it if it has close()."""
        self.reducer.register_comm_hook(state, hook)

    def close(self):
        """Remove the hooks and release the buckets; .grad tensors stay usable."""
        if self._hooks is not None:
            for h in self._hooks:
                h.remove()
            self._hooks = None
            self._spare = [None] * len(self._params)
            self.reducer.close()

    # ---- Join: uneven inputs (torch's Joinable protocol; the logic is in pybridge/join.py) -----

    def join(self, divide_by_initial_world_size=True, enable=True, throw_on_early_termination=False):
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

    def join_hook(self, **kwargs):
        """The JoinHook that torch's Join context calls on a joined rank (kwargs:
        divide_by_initial_world_size, default True)."""
        return _join.DDPJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self):
        return self._pb_group.device

    @property
    def join_process_group(self):
        """The torch ProcessGroup torch's Join context counts the joined ranks on."""
        pg = self._pb_group.pg
        try:
            torch.distributed.get_rank(pg)
        except (RuntimeError, ValueError):
            raise InvalidArgument("Join needs a group torch.distributed knows (the world group): this "
                               "wrapper's subgroup was built by pybridge, outside torch's registry") from None
        return pg

    def _join_pre_forward(self):
        """Each forward in a Join context: tell the context this rank still trains (torch's
        Join.notify_join_context), then tell joined ranks what to shadow (join.iteration_flags).
        Returns the rank to broadcast buffers from: the largest still training, else 0."""
        work = Join.notify_join_context(self)
        if not self._join_config.enable:
            return 0
        sync = torch.is_grad_enabled() and self._sync
        _, _, root = _join.iteration_flags(self._pb_group, sync, self._will_sync_buffers())
        if sync and work is not None and not self._join_divide_by_initial:
            self.reducer.set_divisor(_join.work_count(work))  # the ranks not yet joined
        return root

    def _join_broadcast(self, tensors, root):
        broadcast_parameters(tensors, root, group=self._pb_group)

    # ---- hooks --------------------------------------------------------------------------------

    def _make_hook(self, k):
        def hook(p):
            if self.find_unused_parameters:
                self._used[k] = 1
            if not self._sync:
                return
            if not self._queued:
                self._queued = True
                _engine.queue_callback(self._end_of_backward)
            v = self._views[k]
            g = p.grad
            if g is v:
                self.reducer.mark_ready(k)
            else:  # a fresh gradient (.grad was None): copy it in, scaled, and adopt the view
                self.reducer.set_grad(k, g)
                p.grad = v
                if g.nbytes >= _KEEP_GRAD_BYTES:
                    self._spare[k] = g  # see _spare in __init__
        return hook

    def _end_of_backward(self):
        self._queued = False
        reducer = self.reducer
        if self.find_unused_parameters:
            # Unused gradients contribute what .grad holds (zero when None), as in torch DDP.
            for k in reducer.missing:
                p, v = self._params[k], self._views[k]
                g = p.grad
                if g is None:
                    v.zero_()
                    self._fresh[k] = 1
                elif g is not v:
                    v.copy_(g)
                p.grad = v
        reducer.wait()
        if reducer.generation != self._generation:
            old, self._views = self._views, reducer.grads()
            self._generation = reducer.generation
            for p, prev, new in zip(self._params, old, self._views):
                if p.grad is prev:
                    p.grad = new
        if self.find_unused_parameters:
            self._drop_globally_unused()
        self._fresh = bytearray(len(self._params))

    def _drop_globally_unused(self):
        # Issued after every bucket (wait() launched them all), so the order of
        # collectives is the same on every rank.
        used = torch.tensor(list(self._used), dtype=torch.uint8, device=self._pb_group.device)
        if self._pb_group.size > 1:
            collectives.all_reduce(used, collectives.MAX, group=self._pb_group)
        self._join_used = used  # Join: what this rank contributes once joined, as torch's does
        for k, u in enumerate(used.tolist()):
            if not u and self._fresh[k]:
                self._params[k].grad = None
        self._used = bytearray(len(self._params))


__all__ = ["DistributedDataParallel"]
