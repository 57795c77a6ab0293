"""What a round gives back: one client's Result, RoundResults (the iterator over a round's
results that keeps its summary), and Outcome, what the server makes of a worker's answer or
loss. Used by the server's round modes and by the buffered stream alike."""

import collections
import operator
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Protocol

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
    metrics: dict[str, float] = field(default_factory=dict)


class RoundResults:
    """What run_round returns: an iterator over the round's Results in completion order,
    which also keeps the round's summary of the results taken so far: `clients` (in
    order), `samples` (their sum), `metrics` (sample-weighted means, metrics.RoundMetrics)
    `refused` (client -> UpdateRefused, for updates the server would not take) and
    `retired` (worker rank -> WorkerFailed, for workers retired for breaking the protocol
    during the round: what they sent was dropped)."""

    def __init__(self, number: int, command: int, results: Optional[Iterator[Result]] = None) -> None:
        self.round = number
        self.command = command
        self.clients: list[int] = []
        self.samples = 0
        self.refused: dict[int, Any] = {}
        self.retired: dict[int, Any] = {}
        self._metrics = RoundMetrics()
        self._results: Iterator[Result] = iter(()) if results is None else results  # what iterating takes from

    def __iter__(self) -> "RoundResults":
        return self

    def __next__(self) -> Result:
        return self.record(next(self._results))

    def record(self, result: Result) -> Result:
        """Count `result` in the summary (what iterating does); returns it. The buffered
        stream records the results it hands on this way."""
        self.clients.append(result.client)
        self.samples += result.samples
        self._metrics.add(result.samples, result.metrics)
        return result

    @property
    def metrics(self) -> dict[str, float]:
        """Each metric's sample-weighted mean over the results taken so far."""
        return self._metrics.means()


class _Outcome(NamedTuple):
    kind: str
    assignment: Any
    value: Any


class Outcome(_Outcome):
    """What the server made of one answer or loss among the busy workers
    (Server.next_outcome): its kind (one of the constants below), the assignment it
    settles (the server's record of the hand-out: round, client, command; None for a
    worker lost while idle, and for BACK) and its value."""

    # the fields are _Outcome's (a NamedTuple may not hold constants, for mypy); no __dict__
    __slots__ = ()

    RESULT = "result"    # value: a Result (None: a late result of an abandoned round, dropped)
    FAILED = "failed"    # value: WorkerFailed, the failure the worker reported or its malformed answer
    REFUSED = "refused"  # value: UpdateRefused (integrity.refusal said no)
    LOST = "lost"        # value: WorkerFailed / WorkerTimeout; the worker was retired or stalled
    BACK = "back"        # a stalled worker answered and takes clients again; no assignment, no value


class HandOut(Protocol):
    """The server's hand-out seam (server.Server provides it): all that the round modes'
    loop (roundloop.py) and the buffered stream (stream.py) use of the server, so that
    neither imports it."""

    mode: str

    @property
    def round(self) -> int: ...

    @property
    def current(self) -> Optional[RoundResults]: ...

    def check_open(self) -> None: ...

    def new_version(self, model: Optional[torch.Tensor] = None) -> int: ...

    def start_summary(self, command: int) -> RoundResults: ...

    def idle_workers(self) -> list[int]: ...

    def busy_workers(self) -> list[int]: ...

    def out(self) -> bool: ...

    def take_client(self, pending: "collections.deque[int]", worker: int) -> Optional[int]: ...

    def assign(self, worker: int, client: int, command: int) -> None: ...

    def next_outcome(self) -> Outcome: ...

    def retry_client(self, outcome: Outcome, refusals: "collections.Counter[int]") -> bool: ...

    def unassignable(self, pending: Iterable[int]) -> Exception: ...


def client_list(clients: Iterable[Any]) -> list[int]:
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


__all__ = ["Result", "RoundResults", "Outcome", "client_list"]
