"""Periodic model averaging (local SGD, post-local SGD), with torch's averagers' semantics.

Each rank steps its own model and, every `period` steps after `warmup_steps`, the
parameters are averaged over the group: one allreduce of the parameters per period
instead of one of the gradients per step, for links too slow for per-step reduction.
torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager and
hierarchical_model_averager.HierarchicalModelAverager are the reference: the same step
counter, the same schedule, the same arithmetic (the flattened parameters are divided by
the group size, then summed), so the two give the same parameters on the same data.

Post-local SGD is the reducer (or DDP wrapper) for the warm-up steps, then local steps plus
this averager: torch's post_localSGD_hook with its PostLocalSGDState runs unmodified on
pybridge.DistributedDataParallel (register_comm_hook), and C and Go callers stop calling the
reducer after the warm-up (docs/local-sgd.md).
"""

import warnings
from typing import Any, Iterable, Mapping, Optional, Union

import torch

from ..comm import collectives, subgroups
from ..comm import group as _group
from ..comm import world as _world
from ..base.checks import integer
from ..errors import InvalidArgument

# What the averagers take: a module, or its parameters, or an optimizer's param_groups, or tensors.
Params = Union[torch.nn.Module, Iterable[Union[torch.Tensor, Mapping[str, Any]]]]


def params_to_average(params: Params) -> list[torch.Tensor]:
    """The tensors to average, as torch's get_params_to_average picks them: a module's
    parameters, parameters or an optimizer's param_groups, keeping only parameters that
    have a gradient; plain tensors (C and Go callers' memory) are always kept."""
    items = params.parameters() if isinstance(params, torch.nn.Module) else params
    if isinstance(items, torch.Tensor):
        raise InvalidArgument("params is one tensor; pass a list of tensors, a module's parameters() "
                              "or an optimizer's param_groups")
    out: list[torch.Tensor] = []
    for i, p in enumerate(items):
        if isinstance(p, dict):
            out.extend(q for q in p["params"] if q.grad is not None)
        elif isinstance(p, torch.nn.Parameter):
            if p.grad is not None:
                out.append(p)
        elif isinstance(p, torch.Tensor):
            out.append(p)
        else:
            raise InvalidArgument(f"params[{i}] is a {type(p).__name__}; pass tensors, parameters or "
                                  "param_groups (dicts with 'params')")
    for i, p in enumerate(out):
        if not p.dtype.is_floating_point:
            raise InvalidArgument(f"parameter {i} is {p.dtype}: only floating-point parameters can be averaged")
    return out


def average_parameters(params: Params, *, group: Optional[_group.Group] = None) -> None:
    """Average `params` over `group` (default: the world) in place, as torch's
    model_averaging.utils.average_parameters_or_parameter_groups does: one flat buffer,
    divided by the group's size, summed. A collective: every member calls it with the same
    shapes in the same order. Tensors keep their memory (torch rebinds p.data instead)."""
    g = group or _world.current()
    tensors = params_to_average(params)
    if not tensors:
        return
    with torch.no_grad():
        flat = torch.cat([p.reshape(-1) for p in tensors])  # one type, promoted, as torch's
        flat /= g.size
        collectives.all_reduce(flat, collectives.SUM, group=g)
        offset = 0
        for p in tensors:
            n = p.numel()
            p.copy_(flat[offset:offset + n].view_as(p))
            offset += n


def _group_of(process_group: Optional[_group.Group]) -> _group.Group:
    if process_group is None:
        world: _group.Group = _world.current()
        return world
    if not isinstance(process_group, _group.Group):
        raise InvalidArgument(f"process_group must be a pybridge group (or None: the world), got "
                              f"{type(process_group).__name__}")
    return process_group


class PeriodicModelAverager:
    """torch's PeriodicModelAverager over a pybridge group: average_parameters(params)
    averages when step >= warmup_steps and (step - warmup_steps) % period == 0, then
    step += 1. Call it once per training step, after the optimizer's step.

    Example::

        >>> import torch, pybridge
        >>> from pybridge.algorithms.local_sgd import PeriodicModelAverager
        >>> model = torch.nn.Linear(4, 2)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> averager = PeriodicModelAverager(period=4, warmup_steps=2)
        >>> for step in range(8):
        ...     opt.zero_grad()
        ...     model(torch.randn(8, 4)).sum().backward()   # local gradients: no reduction
        ...     opt.step()
        ...     averaged = averager.average_parameters(model.parameters())   # steps 2 and 6
        >>> averager.step
        8
    """

    def __init__(self, period: int, warmup_steps: int = 0, process_group: Optional[_group.Group] = None) -> None:
        self.warmup_steps = integer("warmup_steps", warmup_steps, low=0)
        self.period = integer("period", period, low=1)
        self.process_group = _group_of(process_group)
        if self.period == 1:
            warnings.warn("period 1 averages the parameters every step, which costs no less than "
                          "averaging the gradients (the reducer); use the reducer alone", stacklevel=2)
        self.step = 0

    def due(self) -> bool:
        """Does the next average_parameters() call average?"""
        return self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0

    def average_parameters(self, params: Params) -> bool:
        """Average `params` if this step is due (see the class); count the step. Returns
        whether it averaged."""
        averaged = self.due()
        if averaged:
            average_parameters(params, group=self.process_group)
        self.step += 1
        return averaged

    def close(self) -> None:
        """Nothing to release (the group is the caller's); for a common interface."""

    def state_dict(self) -> dict[str, Any]:
        """The step counter, for a checkpoint."""
        return {"step": self.step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore state_dict()'s step counter."""
        self.step = integer("averager step", state["step"], low=0)


class HierarchicalModelAverager(PeriodicModelAverager):
    """torch's HierarchicalModelAverager over a pybridge group: {period: group size}, in
    increasing period order, the last size the whole group's. After warm-up, a step
    averages over the subgroup of the largest period dividing the step (not the steps
    since warm-up: torch's rule); subgroups are consecutive blocks of ranks. Creating it
    is a collective over the group (it creates the subgroups); close() frees them."""

    def __init__(self, period_group_size_dict: Optional[Mapping[int, int]] = None, warmup_steps: int = 0,
                 process_group: Optional[_group.Group] = None) -> None:
        g = _group_of(process_group)
        if not period_group_size_dict:
            raise InvalidArgument("period_group_size_dict is empty: give {period: group size, ...}")
        periods = [integer("period", p, low=1) for p in period_group_size_dict]
        if periods != sorted(set(periods)):
            raise InvalidArgument(f"periods {periods} must increase")
        sizes = [integer("group size", s, low=1) for s in period_group_size_dict.values()]
        if sizes[-1] != g.size:
            raise InvalidArgument(f"the last group size is {sizes[-1]}; it must be the whole group's ({g.size})")
        for s in sizes:
            if g.size % s:
                raise InvalidArgument(f"group size {s} does not divide the group size {g.size}")
        if periods[-1] == 1:
            warnings.warn("the largest period is 1: every step averages over the whole group; "
                          "use the reducer alone", stacklevel=2)
        self.process_group, self.step = g, 0
        self.warmup_steps = integer("warmup_steps", warmup_steps, low=0)
        self.periods = periods
        self._own: list[_group.Group] = []
        self.period_groups: dict[int, _group.Group] = {}
        for p, s in zip(periods, sizes):
            if s == g.size:
                self.period_groups[p] = g
            else:
                sub = subgroups.split(g.rank // s, group=g)
                assert sub is not None  # (a color >= 0 always joins a group)
                self.period_groups[p] = sub
                self._own.append(sub)
        self.period = periods[0]

    def _level(self) -> Optional[int]:
        if self.step < self.warmup_steps:
            return None
        return next((p for p in reversed(self.periods) if self.step % p == 0), None)

    def due(self) -> bool:
        """Does the next average_parameters() call average (over which group: the class says)?"""
        return self._level() is not None

    def average_parameters(self, params: Params) -> bool:
        """Average `params` over the subgroup this step is due for, if any; count the step.
        Returns whether it averaged."""
        level = self._level()
        if level is not None:
            average_parameters(params, group=self.period_groups[level])
        self.step += 1
        return level is not None

    def close(self) -> None:
        """Free the subgroups it made."""
        for g in self._own:
            if not g.closed:
                g.close()
        self._own = []


__all__ = ["PeriodicModelAverager", "HierarchicalModelAverager", "average_parameters", "params_to_average"]
