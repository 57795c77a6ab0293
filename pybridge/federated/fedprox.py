"""FedProx (Li et al. 2020) for the workers: local training minimises the client's loss
plus the proximal term mu/2 * ||w - w_global||^2, which keeps the client's weights w near
the round's model w_global. Its gradient is mu * (w - w_global).

    global_params = [p.detach().clone() for p in model.parameters()]    # the round's model
    loss = F.cross_entropy(model(x), y) + proximal_loss(model.parameters(), global_params, mu)
or, after loss.backward() of the plain loss:
    add_proximal_grad(model.parameters(), global_params, mu)

C and Go workers add mu * (w - w_global) to their gradients themselves: Go's FedProxGrad
is a loop over the Go slices of a training step, with no library call, and keeps this
module's rule and messages (mu finite and >= 0, checked first; then matching lengths).
tests/data/fedprox.json holds the cases both tests run.
"""

import math
from typing import Any, Iterable, Iterator

import torch

from ..errors import InvalidArgument


def _mu(mu: Any) -> float:
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not math.isfinite(mu) or mu < 0:
        raise InvalidArgument(f"FedProx's mu must be a finite number >= 0, got {mu!r}")
    return float(mu)


def _pairs(params: Iterable[torch.Tensor], global_params: Iterable[torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    params, global_params = list(params), list(global_params)
    if len(params) != len(global_params):
        raise InvalidArgument(f"FedProx needs one global tensor per parameter: {len(params)} parameters, "
                              f"{len(global_params)} global tensors")
    for i, (p, g) in enumerate(zip(params, global_params)):
        if p.shape != g.shape:
            raise InvalidArgument(f"FedProx's global tensor must match its parameter: parameter {i} has shape "
                                  f"{tuple(p.shape)}, its global tensor {tuple(g.shape)}")
    return zip(params, global_params)


def proximal_loss(params: Iterable[torch.Tensor], global_params: Iterable[torch.Tensor], mu: float) -> torch.Tensor:
    """mu/2 * sum_i ||params[i] - global_params[i]||^2, differentiable in params."""
    mu = _mu(mu)
    terms = [(p - g.detach()).pow(2).sum() for p, g in _pairs(params, global_params)]
    return 0.5 * mu * torch.stack(terms).sum() if terms else torch.zeros(())


def add_proximal_grad(params: Iterable[torch.Tensor], global_params: Iterable[torch.Tensor], mu: float) -> None:
    """Add the proximal term's gradient mu * (p - g) to each p.grad (created if None)."""
    mu = _mu(mu)
    with torch.no_grad():
        for p, g in _pairs(params, global_params):
            d = (p - g.to(p.device, p.dtype)).mul_(mu)
            if p.grad is None:
                p.grad = d
            else:
                p.grad.add_(d)
