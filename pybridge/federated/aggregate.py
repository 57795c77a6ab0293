"""FedAvg: the sample-weighted mean of the clients' pseudo-gradients, applied to the server's
model through a server optimizer (SGD at lr 1.0 is plain FedAvg; momentum or Adam give
FedAvgM / FedAdam).

The weighted sum is accumulated in float64, whatever the model's dtype, so the order the
results arrive in changes it only by float64 rounding (about 1e-16 relative), far below the
model's own precision: async and sync rounds give the same model, bit for bit unless a
float64 sum falls exactly on a float32 rounding boundary. Memory is one float64 copy of the
model, however many clients a round has.

A FedAvg is bound to one round at a time, the round of the results it sums: a result of
an earlier round, or of a round already stepped, is stale and refused; the first result
of a later round drops what an unfinished round had added (that round failed or was
left), so no partial sum reaches a later step().
"""

from typing import Any, Iterable, Optional

import torch

from ..errors import InvalidArgument
from .protocol import TRAIN
from .results import Result


class FedAvg:
    """Aggregates a round's TRAIN results into the model `params` (an iterable of tensors,
    e.g. model.parameters(); one floating-point dtype)."""

    def __init__(self, params: Iterable[torch.Tensor], optimizer: Optional[Any] = None) -> None:
        self.params = list(params)
        if not self.params:
            raise InvalidArgument("FedAvg needs at least one parameter tensor")
        kinds = {p.dtype for p in self.params}
        if len(kinds) != 1 or not next(iter(kinds)).is_floating_point:
            raise InvalidArgument(f"FedAvg needs parameters of one floating-point dtype, got {sorted(map(str, kinds))}")
        self.numel = sum(p.numel() for p in self.params)
        self.optimizer = optimizer if optimizer is not None else torch.optim.SGD(self.params, lr=1.0)
        self._sum = torch.zeros(self.numel, dtype=torch.float64, device=self.params[0].device)
        self._samples = 0
        self.clients: set[int] = set()  # clients added this round
        self.round: Optional[int] = None  # the round being summed (None: nothing added since the last step or reset)
        self.stepped: Optional[int] = None  # the last round applied by step()

    def vector(self) -> torch.Tensor:
        """The model as one flat tensor (a copy): what Server.run_round sends."""
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def add(self, result: Result) -> None:
        """Add one client's Result (command TRAIN) to the round's weighted sum."""
        if result.command != TRAIN:
            raise InvalidArgument(f"FedAvg adds training results; client {result.client} was evaluated")
        if self.stepped is not None and result.round <= self.stepped:
            raise InvalidArgument(f"client {result.client}'s result is stale: it is from round {result.round}, "
                                  f"and round {self.stepped} was already aggregated")
        if self.round is not None and result.round != self.round:
            if result.round < self.round:
                raise InvalidArgument(f"client {result.client}'s result is stale: it is from round "
                                      f"{result.round}, and this FedAvg is summing round {self.round}")
            self.reset()  # round self.round failed or was left unfinished: its partial sum goes
        if result.client in self.clients:
            raise InvalidArgument(f"client {result.client} was already added this round")
        if result.payload.numel() != self.numel:
            raise InvalidArgument(f"client {result.client}'s update has {result.payload.numel()} elements; "
                                  f"the model has {self.numel}")
        self._sum.add_(result.payload.to(self._sum.device, torch.float64), alpha=result.samples)
        self._samples += result.samples
        self.clients.add(result.client)
        self.round = result.round

    def reset(self) -> None:
        """Drop the round's sum (after a failed round, say): the next add() starts afresh."""
        self._sum.zero_()
        self._samples = 0
        self.clients = set()
        self.round = None

    def step(self) -> int:
        """Apply the round: every parameter's gradient is its slice of sum(n_i * delta_i) /
        sum(n_i), then the optimizer steps. Returns the number of clients aggregated."""
        if self._samples == 0:
            raise InvalidArgument("no samples to average this round (no results added, or all had 0 samples)")
        if not bool(torch.isfinite(self._sum).all()):  # results added by hand: the server refuses these
            clients = sorted(self.clients)
            self.reset()
            raise InvalidArgument(f"the round's sum holds NaN or Inf (an update of clients {clients} was "
                                  "not finite): nothing was applied and the sum was reset")
        mean = self._sum / self._samples
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = mean[offset:offset + n].view_as(p).to(p.dtype)
            offset += n
        self.optimizer.step()
        count = len(self.clients)
        self.stepped = self.round
        self.reset()
        return count
