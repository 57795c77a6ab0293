"""A Reducer driven by the program's own autograd, on tensors the program owns.

What torch DDP's reducer does to a module's parameters, without the module: a
post-accumulate-grad hook on each parameter marks its gradient ready the moment autograd
has finished it (so its bucket's allreduce overlaps the rest of backward), and a callback
queued on the autograd engine waits for the last bucket when backward ends. The
parameters may come from any libtorch program by handle (base/at_tensor.py): the hooks
run inside libtorch's backward, whoever called it, with no callback into the program's
language.

Modes, as torch DDP's: copy (the default: .grad stays the program's tensor, copied into
the bucket and the result copied back) and bucket view (gradient_as_bucket_view: .grad is
the bucket's memory, as a plain tensor over it so that libtorch's optimizers may detach_
it). A .grad the optimizer set to None, or a view of a layout the
reducer replaced (a rebuild, an elastic rebind), is simply a fresh gradient: copied in,
and in bucket-view mode replaced by the current view. The DDP wrapper (wrapper.py) uses
the same two steps, `take` and `repoint`.
"""

import weakref

import torch

from ..errors import InvalidArgument, PyBridgeError

_engine = torch.autograd.Variable._execution_engine


def take(reducer, k, p, view, bucket_view):
    """Parameter k's gradient is complete: mark it when backward wrote its view, otherwise
    copy it in (scaled) and, in bucket-view mode, make the view its .grad. Returns the
    gradient tensor that was copied in, or None."""
    g = p.grad
    if g is view:
        reducer.mark_ready(k)
        return None
    reducer.set_grad(k, g)
    if bucket_view:
        p.grad = view
    return g


def grad_aliases(views):
    """The buckets' memory as plain tensors (not autograd views of the flat bucket), for
    bucket-view mode's .grad: libtorch's C++ optimizers (and gotch's) call detach_() on a
    .grad before zeroing it, which autograd refuses on a view; torch DDP's Python optimizer
    avoids the call, its C++ one cannot."""
    return [torch.empty(0, dtype=v.dtype, device=v.device).set_(v.untyped_storage(), v.storage_offset(), v.shape,
                                                                v.stride()) for v in views]


def repoint(params, old, new):
    """After the buckets were laid out anew: each .grad that was an old view becomes the new one."""
    for p, prev, view in zip(params, old, new):
        if p.grad is prev:
            p.grad = view


class Attachment:
    """Hooks on `params` (leaf tensors that require grad, the reducer's parameters in its
    order) that drive `reducer` from autograd. `error` keeps the failure of the last
    reduction until take_error() collects it; a hook that fails to start a bucket fails
    backward at once, a failed wait at the end of backward fails the next backward."""

    def __init__(self, reducer, params, *, bucket_view=False):
        params = list(params)
        if len(params) != reducer.num_params:
            raise InvalidArgument(f"got {len(params)} parameters for a reducer of {reducer.num_params}")
        for i, p in enumerate(params):
            if not p.requires_grad:
                raise InvalidArgument(f"parameter {reducer.name(i)} does not require grad: autograd gives it no "
                                      "gradient to reduce (set requires_grad on it, or leave it out)")
            if not p.is_leaf:
                raise InvalidArgument(f"parameter {reducer.name(i)} is not a leaf tensor (it is computed from "
                                      "others): autograd keeps no .grad for it")
        self.reducer, self.params, self.bucket_view = reducer, params, bool(bucket_view)
        self.error = None
        self._queued = False
        self._views, self._generation = self._grads(), reducer.generation
        if self.bucket_view:
            for p, v in zip(params, self._views):
                if p.grad is not None:
                    v.copy_(p.grad)
                    p.grad = v
        me = weakref.ref(self)  # the parameters hold the hooks; the hooks must not hold us
        self._hooks = [p.register_post_accumulate_grad_hook(_hook(me, k)) for k, p in enumerate(params)]

    def _grads(self):
        views = self.reducer.grads()
        return grad_aliases(views) if self.bucket_view else views

    def _ready(self, k, p):
        if self.error is not None:  # the last reduction failed and nobody asked: stop here
            raise self.error
        if not self._queued:
            self._queued = True
            _engine.queue_callback(self._end_of_backward)
        try:
            take(self.reducer, k, p, self._views[k], self.bucket_view)
        except PyBridgeError as exc:  # a bucket's launch failed (a peer lost): backward stops here
            self.error, self._queued = exc, False
            raise

    def _end_of_backward(self):
        self._queued = False
        r = self.reducer
        try:
            r.wait()
        except PyBridgeError as exc:
            # Kept for take_error(), not raised: an exception from an autograd engine's final
            # callback leaves Python's error indicator set on the thread state of a C or Go
            # caller (libtorch's engine does not fetch it there, cffi keeps that thread state),
            # and the caller's next call into the library would fail on it. Raised from the
            # hooks instead (a path libtorch cleans up), at the next backward.
            self.error = exc
            return
        if r.generation != self._generation:
            old, self._views, self._generation = self._views, self._grads(), r.generation
            repoint(self.params, old, self._views)
        if not self.bucket_view:
            for p, v in zip(self.params, self._views):
                if p.grad is not None:
                    p.grad.copy_(v)

    def take_error(self):
        """The last reduction's failure, once (None when it succeeded)."""
        err, self.error = self.error, None
        return err

    def close(self):
        """Remove the hooks; a .grad that is a bucket view becomes a tensor of its own."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for p, v in zip(self.params, self._views):
            if p.grad is v:
                p.grad = v.clone()


def _hook(ref, k):
    def hook(p):
        self = ref()
        if self is not None:
            self._ready(k, p)
    return hook


__all__ = ["Attachment", "take", "repoint"]
