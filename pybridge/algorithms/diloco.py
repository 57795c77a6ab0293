"""DiLoCo (arXiv 2311.08105) and Streaming DiLoCo (arXiv 2501.18512) over a pybridge group.

Each rank trains its own replica with its own inner optimizer and calls DiLoCo.step() once
per inner step, after the inner optimizer's step. Every `sync_every` (H) steps a fragment
of the model is synced: its pseudo-gradient (the fragment's weights at its last sync
minus its weights now) is averaged over the group (float32, or quantized:
quantized_average.py), and an outer optimizer (SGD with Nesterov momentum, lr 0.7,
momentum 0.9, by default: the paper's) steps the last-sync weights with it. Those become
the fragment's new weights on every rank, or with a mixing factor alpha,
lerp(global, local, alpha) = (1 - alpha) global + alpha local (torchft's
fragment_update_alpha; 0 by default, as in torchft).

Streaming DiLoCo: the model is cut into F fragments that sync at staggered steps (one every
H/F steps, diloco_schedule.py), and each sync overlaps the `delay` (tau) inner steps that
follow it: the average travels on a thread of its own, over a group of its own, and is
applied tau steps later. torchft's DiLoCo defines the schedule, the formula and the
defaults; docs/diloco.md says where this one differs and why.

A model is a list of tensors (a module's parameters, or the tensors a C or Go program owns
and passes by handle): the C and Go layers only convert.

Elastic worlds: a sync is applied only after all its collectives are done, so a failure
(MembershipChanged on an elastic world) leaves every rank's weights, last-sync weights,
outer optimizer and residuals as they were before it. rebind(new_group) then re-runs the
period's sync over the survivors, with their pseudo-gradients of that period, and applies
it: no rank applies a partial average, and no inner step is lost. Ranks whose counters
disagree afterwards (one finished the sync before the loss, another did not) cannot be
reconciled without a rollback: step() then refuses until load_state_dict (elastic.State's
restore does it).
"""

import hashlib
import struct

import torch

from ..base import agree as _agree
from ..base.checks import integer, positive_finite
from ..comm import collectives
from ..comm import world as _world
from ..errors import InvalidArgument, InvalidState
from . import diloco_schedule, quantized_average
from .hook_thread import HookThread
from .quantize import DEFAULT_BLOCK, FORMATS, ErrorFeedback, codec as _codec

OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # the DiLoCo paper's outer Nesterov SGD


def nesterov_sgd(params, lr=OUTER_LR, momentum=OUTER_MOMENTUM):
    """The default outer optimizer: torch.optim.SGD with Nesterov momentum."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=True)


def outer_sgd(lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True):
    """An outer_optimizer: torch.optim.SGD with these settings, checked here (the C and Go
    options reach the core through it), so a bad one reads the same from every front end."""
    lr = positive_finite("outer_lr", lr)
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum < 1.0:
        raise InvalidArgument(f"outer_momentum must be a number in [0, 1), got {momentum!r}")
    if not isinstance(nesterov, bool):
        raise InvalidArgument(f"outer_nesterov must be true or false, got {nesterov!r}")
    if nesterov and momentum == 0:
        raise InvalidArgument("outer_nesterov needs outer_momentum > 0 (Nesterov momentum without momentum; "
                              "turn outer_nesterov off for plain SGD)")
    momentum = float(momentum)

    def factory(params):
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov)
    return factory


def _outer_settings(opt):
    """An outer optimizer's type and plain settings (lr, momentum, ...), for the ranks to compare."""
    plain = {k: v for k, v in sorted(opt.defaults.items()) if isinstance(v, (bool, int, float, str))}
    return [type(opt).__name__, plain]


def model_tensors(params):
    """A list of floating-point tensors from a module, its parameters() or a list of tensors."""
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    if isinstance(params, torch.Tensor):
        raise InvalidArgument("params is one tensor; pass a list of tensors or a module's parameters()")
    out = list(params)
    if not out:
        raise InvalidArgument("params is empty: DiLoCo needs the model's tensors")
    for i, p in enumerate(out):
        if not isinstance(p, torch.Tensor):
            raise InvalidArgument(f"params[{i}] is a {type(p).__name__}, not a tensor")
        if not p.dtype.is_floating_point:
            raise InvalidArgument(f"params[{i}] is {p.dtype}: only floating-point tensors are synced")
    return out


class _Fragment:
    """One fragment: its tensors (indices), its last-sync weights (float32, the outer
    optimizer's parameters), the outer optimizer, error feedback."""

    def __init__(self, index, members, tensors, factory, feedback):
        self.index, self.members = index, members
        self.shapes = [tensors[i].shape for i in members]
        self.numel = sum(tensors[i].numel() for i in members)
        self.anchor = [tensors[i].detach().to(torch.float32, copy=True) for i in members]
        self.outer = factory(self.anchor)
        if not isinstance(self.outer, torch.optim.Optimizer):
            raise InvalidArgument(f"outer_optimizer returned a {type(self.outer).__name__}; it must build a "
                                  "torch.optim.Optimizer over the tensors it is given")
        self.feedback = ErrorFeedback(self.numel, device=self.anchor[0].device) if feedback else None

    def pseudo_gradient(self, tensors):
        """last-sync weights - weights now, flat float32."""
        with torch.no_grad():
            return torch.cat([(a - tensors[i].detach().to(torch.float32)).reshape(-1)
                              for a, i in zip(self.anchor, self.members)])


class _Sync:
    """A sync started and not yet applied: what it sends, and its result once it has one."""

    def __init__(self, plan, delta):
        self.plan, self.delta = plan, delta  # diloco_schedule.Sync, the fragment's pseudo-gradient
        self.future = None  # on the thread (delay > 0)
        self.result = None  # quantized_average.Averaged
        self.failed = None  # the exception of the attempt (rebind runs it again)


class DiLoCo:
    """DiLoCo(params, sync_every, *, outer_optimizer=None, fragments=1, delay=0, alpha=0.0,
    quantization="fp32", block_size=128, error_feedback=False, group=None)

    params: the model's tensors (a module, its parameters(), or a list of tensors), equal on
    every rank at construction (broadcast them first); the program steps them with its own
    inner optimizer. sync_every: H, inner steps between two syncs of a fragment.
    outer_optimizer: f(list of tensors) -> torch.optim.Optimizer, called once per fragment
    with its float32 last-sync weights (default: SGD, lr 0.7, momentum 0.9, Nesterov).
    fragments: F, or lists of tensor indices (a partition); an int cuts the tensors in
    order into F runs of about equal size. delay: tau, the inner steps a sync overlaps
    (0 <= tau < H/F). alpha: the mixing factor in [0, 1]. quantization: how
    pseudo-gradients travel (fp32, bf16, fp8, int8, int4; block_size: the scales' span).
    error_feedback: keep what quantization lost and add it to the next pseudo-gradient.
    group: default the world. Creating it is a collective (the settings and the initial
    weights are compared across ranks; with delay > 0 the sync group is made)."""

    def __init__(self, params, sync_every, *, outer_optimizer=None, fragments=1, delay=0, alpha=0.0,
                 quantization="fp32", block_size=DEFAULT_BLOCK, error_feedback=False, group=None):
        tensors = model_tensors(params)
        if isinstance(fragments, int) and not isinstance(fragments, bool):
            members = diloco_schedule.split([t.numel() for t in tensors], fragments)
        elif isinstance(fragments, (list, tuple)):
            members = diloco_schedule.check_partition(fragments, len(tensors))
        else:
            raise InvalidArgument(f"fragments must be a count or lists of tensor indices, got {fragments!r}")
        self.schedule = diloco_schedule.Schedule(sync_every, len(members), delay)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
            raise InvalidArgument(f"alpha must be a number in [0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self.codec = _codec(quantization, block_size)
        self.error_feedback = bool(error_feedback)
        if self.error_feedback and self.codec.name == "fp32":
            raise InvalidArgument("error_feedback needs a lossy quantization (bf16, fp8, int8, int4); fp32 loses nothing")
        factory = outer_optimizer if outer_optimizer is not None else nesterov_sgd
        if not callable(factory):
            raise InvalidArgument("outer_optimizer must be a function of a list of tensors returning an optimizer "
                                  "(e.g. lambda p: torch.optim.SGD(p, lr=0.7, momentum=0.9, nesterov=True))")
        self.params = tensors
        self.fragments = [_Fragment(f, m, tensors, factory, self.error_feedback) for f, m in enumerate(members)]
        self.group = group or _world.current()
        self.step_count = 0      # inner steps done (step() calls)
        self.syncs = 0           # syncs applied
        self.bytes_sent = 0      # by this rank, over all syncs applied
        self._pending = None     # the _Sync under way, if any
        self._diverged = None    # why step() refuses (see rebind)
        self._thread = HookThread("pybridge-diloco") if self.schedule.delay else None
        self._comm = None
        self._agree(tensors)
        self._comm = self._sync_group(self.group)

    # -- settings -------------------------------------------------------------------

    def settings(self):
        """What every rank must share (compared when it is created)."""
        return {"sync_every": self.schedule.sync_every, "fragments": [f.members for f in self.fragments],
                "delay": self.schedule.delay, "alpha": self.alpha, "quantization": self.codec.name,
                "block_size": self.codec.block, "error_feedback": self.error_feedback,
                "shapes": [tuple(t.shape) for t in self.params],
                "outer": [_outer_settings(f.outer) for f in self.fragments]}

    def _agree(self, tensors):
        g = self.group
        if g.size == 1:
            return
        s = self.settings()
        row = [s["sync_every"], len(self.fragments), s["delay"], struct.unpack("<q", struct.pack("<d", s["alpha"]))[0],
               FORMATS.index(s["quantization"]), s["block_size"], int(s["error_feedback"]),
               _agree.signature([s["fragments"], s["shapes"], s["outer"]]), _weights_signature(tensors)]
        fields = ("sync_every", "fragments", "delay", "alpha", "quantization", "block_size", "error_feedback",
                  "tensors, fragments or outer optimizer", "initial weights")
        names = {i: FORMATS[i] for i in range(len(FORMATS))}

        def describe(r):
            return (f"sync_every {r[0]}, {r[1]} fragments, delay {r[2]}, alpha "
                    f"{struct.unpack('<d', struct.pack('<q', r[3]))[0]}, {names.get(r[4], r[4])} blocks of {r[5]}, "
                    f"error feedback {bool(r[6])}, layout {r[7]:x}, weights {r[8]:x}")
        rows = collectives.gather_rows(row, group=g)
        _agree.check("DiLoCo settings differ across ranks", rows, describe=describe, fields=fields,
                     hint=" (the initial weights must be equal: broadcast them first, e.g. "
                          "pybridge.broadcast_parameters)" if len({r[8] for r in rows}) > 1 else "")

    def _sync_group(self, g):
        """The group the thread's collectives use (delay > 0): a copy of `g`, its own,
        so they never interleave with the program's collectives on `g`."""
        if not self.schedule.delay or g.size == 1:
            return g
        return g.subgroup(list(range(g.size)))

    # -- the inner loop ----------------------------------------------------------------

    def step(self, params=None):
        """Count one inner step (call it after the inner optimizer's step); start, finish
        and apply the syncs the schedule puts here. Returns whether a sync was applied.
        params: the model's tensors for this call (a C or Go program's memory), in the order
        and shapes given at construction; default: those. A collective at sync steps."""
        if self._diverged is not None:
            raise InvalidState(self._diverged)
        if self._pending is not None and self._pending.failed is not None:
            raise InvalidState(f"DiLoCo sync {self._pending.plan.number} failed ({self._pending.failed}); "
                               "call rebind(group) on the new world (elastic) or load_state_dict() first")
        tensors = self._bind(params)
        self.step_count += 1
        applied = False
        late = self._pending
        if late is not None and late.future is None and late.result is None:
            self._start(late)  # loaded from a checkpoint while under way: sent again
            if late.plan.apply < self.step_count:  # saved after its step had passed (a failed sync)
                self._finish(late, tensors)
                applied = True
        plan = self.schedule.launched_after(self.step_count)
        if plan is not None:
            f = self.fragments[plan.fragment]
            self._pending = _Sync(plan, f.pseudo_gradient(tensors))
            self._start(self._pending)
        if self.schedule.applied_after(self.step_count) is not None:
            self._finish(self._pending, tensors)
            applied = True
        return applied

    def _bind(self, params):
        if params is None:
            return self.params
        tensors = model_tensors(params)
        if len(tensors) != len(self.params) or any(a.shape != b.shape for a, b in zip(tensors, self.params)):
            raise InvalidArgument(f"params: {len(tensors)} tensors of shapes {[tuple(t.shape) for t in tensors]}; "
                                  f"this DiLoCo was made for {[tuple(t.shape) for t in self.params]}")
        return tensors

    def _run(self, sync):
        f = self.fragments[sync.plan.fragment]
        return quantized_average.average(sync.delta, self.codec, group=self._comm, feedback=f.feedback)

    def _start(self, sync):
        sync.failed = None
        if self._thread is None:
            try:
                sync.result = self._run(sync)
            except Exception as exc:
                sync.failed = exc
                raise
        else:
            sync.future = self._thread.submit(lambda: self._run(sync))

    def _finish(self, sync, tensors):
        """Wait for `sync`'s average and apply it: the outer step, the weights written."""
        if sync.result is None:
            fut, sync.future = sync.future, None
            try:
                sync.result = fut.wait()
            except Exception as exc:
                sync.failed = exc
                raise
        f = self.fragments[sync.plan.fragment]
        avg = sync.result.value
        with torch.no_grad():
            at = 0
            for a in f.anchor:
                a.grad = avg[at:at + a.numel()].view_as(a)
                at += a.numel()
            f.outer.step()
            f.outer.zero_grad(set_to_none=True)
            for a, i in zip(f.anchor, f.members):
                p = tensors[i]
                if self.alpha:
                    p.copy_(torch.lerp(a, p.detach().to(torch.float32), self.alpha))
                else:
                    p.copy_(a)
            if f.feedback is not None:
                f.feedback.residual.copy_(sync.result.residual)
        self.syncs += 1
        self.bytes_sent += sync.result.sent_bytes
        self._pending = None

    # -- elastic worlds ----------------------------------------------------------------

    def rebind(self, group, params=None):
        """Go on in `group` (the world agreed on after a MembershipChanged, elastic.reset's):
        the sync under way, if any, is sent again over it (the survivors' pseudo-gradients)
        and applied if its step has passed. A collective over the new group. Ranks whose
        step or sync counts differ are left refusing step() until load_state_dict()."""
        if self._pending is not None and self._pending.future is not None:
            fut, self._pending.future = self._pending.future, None
            try:
                fut.wait()  # the old world's attempt: its result is not used
            except Exception:  # noqa: BLE001 - it failed with the old world, as expected
                pass
        if self._comm is not None and self._comm is not self.group and not self._comm.closed:
            self._comm.close()
        self.group = group
        self._comm = self._sync_group(group)
        if group.size > 1:
            rows = collectives.gather_rows([self.step_count, self.syncs], group=group)
            if len(set(rows)) > 1:
                self._diverged = ("DiLoCo replicas disagree after the world changed (step, syncs applied by rank: "
                                  f"{rows}): a sync finished on some ranks only; restore a commit "
                                  "(elastic.State) or load_state_dict()")
                return
        self._diverged = None
        sync = self._pending
        if sync is None:
            return
        sync.result = None
        self._start(sync)
        if sync.plan.apply <= self.step_count:
            self._finish(sync, self._bind(params))

    def close(self):
        """Stop the sync thread and free the sync group (a second call does nothing)."""
        if self._thread is not None:
            self._thread.close()
        if self._comm is not None and self._comm is not self.group and not self._comm.closed:
            self._comm.close()
        self._comm = None

    # -- checkpoints -------------------------------------------------------------------

    def state_dict(self):
        """The step and sync counts, each fragment's last-sync weights, outer optimizer
        state and residual, and a sync under way (its pseudo-gradient, sent again after
        load_state_dict). Tensors are this object's own (torch.save, or elastic.State's
        commit, copies them)."""
        pending = None
        if self._pending is not None:
            p = self._pending
            pending = {"number": p.plan.number, "delta": p.delta}
        return {"step": self.step_count, "syncs": self.syncs, "bytes_sent": self.bytes_sent,
                "settings": self.settings(),
                "fragments": [{"anchor": f.anchor, "outer": f.outer.state_dict(),
                               "residual": None if f.feedback is None else f.feedback.residual}
                              for f in self.fragments],
                "pending": pending}

    def load_state_dict(self, state):
        """Go back to a state_dict() (this rank's, or another's: the replicas then start
        from it). A sync that was under way is sent again at the next step()."""
        if not isinstance(state, dict) or "fragments" not in state:
            raise InvalidArgument("not a DiLoCo state_dict")
        mine, theirs = self.settings(), state.get("settings", {})
        differ = sorted(k for k in mine if k != "outer" and theirs.get(k) != mine[k])
        if differ:
            raise InvalidArgument("DiLoCo state of other settings: " +
                                  "; ".join(f"{k} {theirs.get(k)!r} (here {mine[k]!r})" for k in differ))
        if self._pending is not None and self._pending.future is not None:
            try:
                self._pending.future.wait()
            except Exception:  # noqa: BLE001 - replaced by the loaded state
                pass
        with torch.no_grad():
            for f, s in zip(self.fragments, state["fragments"]):
                for a, b in zip(f.anchor, s["anchor"]):
                    a.copy_(b)
                f.outer.load_state_dict(s["outer"])
                if f.feedback is not None:
                    f.feedback.residual.copy_(s["residual"])
        self.step_count = integer("DiLoCo step", state["step"], low=0)
        self.syncs = integer("DiLoCo syncs", state["syncs"], low=0)
        self.bytes_sent = int(state.get("bytes_sent", 0))
        p = state.get("pending")
        self._pending = None
        if p is not None:
            plan = self.schedule.sync(integer("pending sync", p["number"], low=0))
            self._pending = _Sync(plan, p["delta"].detach().to(torch.float32).clone())
        self._diverged = None

    # -- what a sync costs -------------------------------------------------------------

    def bytes_per_sync(self, fragment=None):
        """What this rank sends to sync `fragment` (default: all of them, one after the
        other, i.e. every H steps)."""
        frags = self.fragments if fragment is None else [self.fragments[fragment]]
        return sum(quantized_average.sent_bytes(f.numel, self.group.size, self.codec) for f in frags)


def _weights_signature(tensors):
    h = hashlib.blake2b(digest_size=7)
    for t in tensors:
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "little")


__all__ = ["DiLoCo", "nesterov_sgd", "outer_sgd", "model_tensors", "OUTER_LR", "OUTER_MOMENTUM"]
