"""The update arithmetic: the weighted float64 sum every mode aggregates with
(UpdateBuffer), including buffered asynchronous aggregation, FedBuff (Nguyen et al. 2022)
and FedAsync (Xie et al. 2019).

In the buffered modes the server's model advances every K training results (FedBuff;
K = 1 is FedAsync); a result computed on a version tau steps older than the current one
is weighted by s(tau) (staleness.py), and one older than max_staleness versions is
refused (StaleUpdate). FedAvgRounds drives it; the hand-out across versions is
stream.Stream.

A step's pseudo-gradient, over the updates i in the buffer (delta_i = the model version
the client started from - its trained weights, n_i its samples, tau_i its staleness):

    g = sum_i s(tau_i) * n_i * delta_i / sum_i n_i        (no DP)
    g = sum_i s(tau_i) * clip(delta_i) / n  +  N(0, (sigma * C / n)^2)    (central DP, n updates)

with clip(d) = d * min(1, C / ||d||). Sync and per-round async rounds are the same sum with
every tau = 0 (plain FedAvg). FedAsync's paper mixes the client's model into the current
one, x <- (1 - alpha s) x + alpha s x_i; here the client's delta is applied instead (the
FedBuff form, with eta = alpha): the two agree when the client started from the current
model. The weights are pure Python floats; the sum is float64 whatever the model's dtype.
"""

import warnings
from typing import Any, Optional

import torch

from ..base.checks import integer
from ..errors import InvalidArgument
from .modes import BUFFERED as MODES  # noqa: F401  (buffered.MODES: the modes handled here)
from .protocol import TRAIN
from .results import Result
from .staleness import Staleness
from .strategies import CentralDP

DEFAULT_BUFFER = 10  # FedBuff's K when none is given


class StaleUpdate(InvalidArgument):
    """A result computed on a model older than max_staleness versions: not aggregated."""

    def __init__(self, message: str, worker: int, client: int, staleness: int) -> None:
        super().__init__(message)
        self.worker, self.client, self.staleness = worker, client, staleness


class UpdateBuffer:
    """The weighted float64 sum of the training results since the last step (see the module
    docstring). `dp` is a strategies.CentralDP or None."""

    def __init__(self, numel: int, device: Any, staleness: Optional[Staleness] = None,
                 max_staleness: Optional[int] = None, dp: Optional[CentralDP] = None) -> None:
        self.numel = numel
        self.staleness = staleness or Staleness()
        self.max_staleness = None if max_staleness is None else integer("max_staleness", max_staleness, low=0)
        self.dp = dp
        self._sum = torch.zeros(numel, dtype=torch.float64, device=device)
        self._reset()

    def _reset(self) -> None:
        self._sum.zero_()
        self.samples = 0
        self.clients: list[tuple[int, int, int, float]] = []  # (worker, client, staleness, weight) per update in the buffer
        self.clipped = 0

    def __len__(self) -> int:
        return len(self.clients)

    def weight(self, samples: int, tau: int) -> float:
        """The update's weight in the sum: s(tau) * samples, or s(tau) under DP."""
        return self.staleness(tau) * (1 if self.dp is not None else samples)

    def add(self, result: Result, tau: int = 0) -> float:
        """Add a TRAIN Result computed `tau` versions ago; StaleUpdate past max_staleness.
        Returns its weight."""
        if result.command != TRAIN:
            raise InvalidArgument(f"only training results are aggregated; client {result.client} was evaluated")
        if result.payload.numel() != self.numel:
            raise InvalidArgument(f"client {result.client}'s update has {result.payload.numel()} elements; "
                                  f"the model has {self.numel}")
        if self.max_staleness is not None and tau > self.max_staleness:
            raise StaleUpdate(f"worker {result.worker}'s update for client {result.client} was computed on model "
                              f"version {result.round}, {tau} versions old (max_staleness {self.max_staleness}): "
                              "refused", result.worker, result.client, tau)
        w = self.weight(result.samples, tau)
        delta = result.payload.to(self._sum.device, torch.float64)
        if self.dp is not None:
            delta = delta.clone() if delta is result.payload else delta
            self.clipped += self.dp.clip(delta)
        self._sum.add_(delta, alpha=w)
        self.samples += result.samples
        self.clients.append((result.worker, result.client, tau, w))
        return w

    def take(self) -> tuple[torch.Tensor, dict[str, Any]]:
        """(g, record): the step's pseudo-gradient (float64) and what went into it; the buffer
        is then empty."""
        n = len(self.clients)
        if n == 0 or (self.dp is None and self.samples == 0):
            raise InvalidArgument("no samples to average this round (no results added, or all had 0 samples)")
        record: dict[str, Any] = {"clients": n, "samples": self.samples, "staleness": [c[2] for c in self.clients],
                  "weights": [c[3] for c in self.clients]}
        if self.dp is None:
            g = self._sum / self.samples
        else:
            noise, std = self.dp.noise(self.numel, n)
            g = self._sum / n + noise.to(self._sum.device)
            record.update(clip_norm=self.dp.clip_norm, noise_multiplier=self.dp.noise_multiplier,
                          noise_std=std, clipped=self.clipped)
        self._reset()
        return g, record


def __getattr__(name: str) -> Any:
    # Stream moved to stream.py (the hand-out); this module keeps the arithmetic
    if name == "Stream":
        warnings.warn("pybridge.federated.buffered.Stream moved to pybridge.federated.stream.Stream",
                      DeprecationWarning, stacklevel=2)
        from .stream import Stream
        return Stream
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
