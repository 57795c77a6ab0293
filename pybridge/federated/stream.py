"""The buffered modes' hand-out (FedBuff, FedAsync; buffered.py has their arithmetic):
clients go out across model versions, with no rounds for the workers. A worker that
returns a result gets its next client at once, on the newest version (the server sends it
that version first if it holds an older one), and nobody waits for a straggler.

Stream drives the server only through its hand-out seam (server.py: new_version,
start_summary, idle_workers, busy_workers, take_client, assign, next_outcome,
retry_client, unassignable, check_open), the same the round modes' loop uses, so
refusal, requeue and affinity hold in every mode. FedAvgRounds (rounds.py) drives it.
"""

import collections
from typing import Iterable, Optional

import torch

from .protocol import EVALUATE, TRAIN
from .results import HandOut, Outcome, Result, client_list


class Stream:
    """Hands clients out through a Server in a buffered mode, across model versions
    (made by Server.stream).

    `model` is the server's flat model (FedAvgRounds.model), which the server sends to a
    worker holding an older version before its next client; advance() says it changed.
    Results come in completion order from next(), which returns None when nothing is left
    to hand out and a worker is idle: clients still out stay out, and their results come
    with later calls (applied late). Evaluations are handed out before training clients."""

    def __init__(self, server: HandOut, model: torch.Tensor) -> None:
        self.server = server
        self.pending: dict[int, collections.deque[int]] = {EVALUATE: collections.deque(), TRAIN: collections.deque()}
        self._refusals: collections.Counter[int] = collections.Counter()
        server.new_version(model)  # the live model, sent as is; versions travel as the headers' round

    @property
    def version(self) -> int:
        return self.server.round

    def advance(self) -> None:
        """The model changed (a step, or a new model from the caller): a new version."""
        self.server.new_version()

    def add(self, clients: Iterable[int], command: int) -> None:
        """A round: `clients` join the queue, and the server's `current` summary (metrics,
        samples, refusals) starts afresh, at the current version, for the results taken
        from now on."""
        self.pending[command].extend(client_list(clients))
        self.server.start_summary(command)

    def _left(self) -> list[int]:
        return [c for q in self.pending.values() for c in q]

    def next(self, wait: bool = False) -> Optional[Result]:
        """The next Result, or None: with nothing left to hand out, as soon as a worker is
        idle, or (`wait`) once no client is out."""
        s = self.server
        while True:
            s.check_open()
            for w in s.idle_workers():
                for command, queue in self.pending.items():
                    client = s.take_client(queue, w)  # the first this worker may hold (affinity)
                    if client is not None:
                        s.assign(w, client, command)  # sends the newest version first if need be
                        break
            left = self._left()
            busy = s.busy_workers()
            if not left and (not busy or (s.idle_workers() and not wait)):
                return None
            if not busy:
                raise s.unassignable(left)
            outcome = s.next_outcome()
            a = outcome.assignment
            if a is None:
                continue  # a worker lost while idle, or a stalled one taken back
            if outcome.kind == Outcome.RESULT:
                assert s.current is not None  # add() started the summary
                return s.current.record(outcome.value)
            if s.retry_client(outcome, self._refusals):
                self.pending[a.command].appendleft(a.client)
                continue
            for queue in self.pending.values():  # an error ends the round, as in the round modes
                queue.clear()
            raise outcome.value
