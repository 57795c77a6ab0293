"""What a round gives back: one client's Result, and RoundResults, the iterator over a
round's results that keeps its summary. Used by the server's round modes and by the
buffered stream alike."""

import operator
from dataclasses import dataclass, field

import torch

from ..errors import InvalidArgument
from .metrics import RoundMetrics


@dataclass
class Result:
    """One client's answer. TRAIN: `payload` is the pseudo-gradient (round model - trained
    weights) from `samples` examples; EVALUATE: the worker's metrics tensor. `seconds`: from
    handing the client out to the result's arrival. `metrics`: the floats the worker sent
    with it (loss, accuracy, ...; empty when none)."""

    command: int
    round: int
    client: int
    worker: int
    samples: int
    payload: torch.Tensor
    seconds: float
    metrics: dict = field(default_factory=dict)


class RoundResults:
    """What run_round returns: an iterator over the round's Results in completion order,
    which also keeps the round's summary of the results taken so far: `clients` (in
    order), `samples` (their sum), `metrics` (sample-weighted means, metrics.RoundMetrics)
    and `refused` (client -> UpdateRefused, for updates the server would not take)."""

    def __init__(self, number, command):
        self.round = number
        self.command = command
        self.clients = []
        self.samples = 0
        self.refused = {}
        self._metrics = RoundMetrics()
        self._gen = None

    def __iter__(self):
        return self

    def __next__(self):
        r = next(self._gen)
        self.clients.append(r.client)
        self.samples += r.samples
        self._metrics.add(r.samples, r.metrics)
        return r

    @property
    def metrics(self):
        """Each metric's sample-weighted mean over the results taken so far."""
        return self._metrics.means()


def client_list(clients):
    """The client ids of a round, checked: integers >= 0, each listed once."""
    try:
        given = list(clients)
        if any(isinstance(c, bool) for c in given):
            raise TypeError
        ids = [operator.index(c) for c in given]
    except TypeError:
        raise InvalidArgument(f"clients must be a list of integer ids, got {clients!r}") from None
    bad = [c for c in ids if c < 0]
    if bad:
        raise InvalidArgument(f"client ids must be >= 0, got {bad}")
    if len(set(ids)) != len(ids):
        dup = sorted({c for c in ids if ids.count(c) > 1})
        raise InvalidArgument(f"clients {dup} are listed more than once (each is trained once per round)")
    return ids


__all__ = ["Result", "RoundResults", "client_list"]
