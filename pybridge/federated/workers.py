"""The federated server's workers: where each one stands, and the events that move it.

A worker is live (idle, or busy with a client, maybe of an abandoned round), stalled (past
its client's timeout, still listened to: taken back if it answers) or retired for good
(connection lost, or out of protocol); `has` says which model version it holds. The
listeners (listener.py) and the server's sends put events on one queue; only the server's
thread takes them (Server.next_outcome, Server._drain) and turns each into a results.Outcome
here, so these states change on that thread alone. What an in-turn answer is worth (a
result, a reported failure, a refused update) is the server's to judge: `handle` hands it the
answer with the assignment it closes.
"""

import queue
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch

from ..base import dtypes
from ..comm.collectives import Work
from ..errors import PyBridgeError, WorkerFailed, WorkerTimeout
from .protocol import FAILED, TERMINATE, UPDATE, Header, Links
from .results import Outcome


@dataclass
class Assignment:
    """A client handed to a worker: its round (model version), client, command (TRAIN or
    EVALUATE), the worker's hand-out count `seq` (its answer must repeat it), when, and the
    size and dtype code of the model it was sent (a TRAIN answer must match them)."""

    round: int
    client: int
    command: int
    seq: int
    start: float
    numel: int = 0
    dtype: int = 0


def answers(h: Header, a: Assignment) -> bool:
    """Whether header `h` answers assignment `a` (its result, or its reported failure)."""
    return (h.round, h.client, h.seq) == (a.round, a.client, a.seq) and h.command in (a.command, FAILED)


class Workers:
    """The states of the worker ranks `ranks` of a server whose down links are `links`.

    Events (tuples on `events`): ("message", w, header, payload, metrics, arrival time) from
    w's listener; ("lost", w, error) when w's connection failed (a listener, or a send);
    ("retire", w, why) when w broke the protocol. Read by the listeners: `expect` (the
    assignment each worker's next answer must answer) and `terminating` (workers sent a
    terminate, whose acknowledgement is expected)."""

    def __init__(self, ranks: Iterable[int], links: Links) -> None:
        self.ranks = tuple(ranks)
        self.links = links
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.live = set(self.ranks)  # connected and taking clients (idle or busy)
        self.lost: dict[int, Exception] = {}  # worker rank -> the error that retired it (a stalled one's until it answers)
        self.gone: set[int] = set()  # retired for good: connection lost or out of protocol
        self.stalled: dict[int, Assignment] = {}  # worker rank -> the assignment it timed out on: taken back if it answers
        self.busy: dict[int, Assignment] = {}  # worker rank -> Assignment, of this round or an abandoned one
        self.has: dict[int, int] = {}  # worker rank -> the round of the model it holds
        self.seq = dict.fromkeys(self.ranks, 0)
        self.expect: dict[int, Assignment] = {}  # worker rank -> the Assignment its next answer must answer (listeners read it)
        self.terminating: set[int] = set()  # workers sent a terminate: their acknowledgement is expected
        self.farewells: list[tuple[int, Work]] = []  # (worker, terminate sent and not waited for)

    def idle(self) -> list[int]:
        """Live workers that hold no client, in rank order."""
        return [w for w in self.ranks if w in self.live and w not in self.busy]

    def out(self, round: int) -> bool:
        """Whether a client of version `round` is out."""
        return any(a.round == round for a in self.busy.values())

    def send_model(self, ranks: Iterable[int], model: torch.Tensor, round: int) -> None:
        """`model` (version `round`) to the idle workers `ranks`, point to point and
        concurrently. Not a collective broadcast: that couples every worker to every other,
        so one that died unnoticed would leave the others waiting inside it, with no way to
        reach them; a send fails only for its own worker, whose loss is then queued."""
        links = self.links
        h = Header(UPDATE, round, length=model.numel(), dtype=dtypes.code(model.dtype))
        sends: list[tuple[int, Work]] = []
        for w in ranks:  # every one is idle, waiting for a header
            try:
                links.send_header(h, w, links.down)
                sends.append((w, links.isend_payload(model, w, links.down)))
            except PyBridgeError as exc:
                self.events.put(("lost", w, exc))
        for w, work in sends:
            try:
                work.wait()
                self.has[w] = round
            except PyBridgeError as exc:
                self.events.put(("lost", w, exc))

    def assign(self, w: int, client: int, command: int, round: int, model: torch.Tensor) -> None:
        """Hand `client` to the idle worker `w` to train or evaluate (`command`) on version
        `round`, sending it `model` first if it holds an older one. A send that fails queues
        the worker's loss, and the client counts as out, so that handling the loss gives it
        back (requeue) or names it."""
        if self.has.get(w) != round:  # back from an earlier round's client, or taken back
            self.send_model([w], model, round)
            if self.has.get(w) != round:
                self.busy[w] = Assignment(round, client, command, self.seq[w], time.monotonic())
                return
        self.seq[w] += 1
        a = self.busy[w] = Assignment(round, client, command, self.seq[w], time.monotonic(), model.numel(),
                                      dtypes.code(model.dtype))
        self.expect[w] = a  # before the header goes out: the answer cannot come sooner
        try:  # the worker is waiting for it, so this returns at once
            self.links.send_header(Header(command, round, client, seq=a.seq), w, self.links.down)
        except PyBridgeError as exc:
            self.events.put(("lost", w, exc))

    def lost_text(self) -> str:
        return "; ".join(f"rank {w}: {e}" for w, e in sorted(self.lost.items())) or "none"

    def stall(self, w: int, a: Assignment, timeout: float) -> Outcome:
        """`w` held its client past `timeout` seconds: stop giving it clients, but keep
        listening, so that it is taken back once it answers (its late result is dropped)."""
        err = WorkerTimeout(f"federated worker rank {w} did not return client {a.client} (round {a.round}) "
                            f"within {timeout:g} s", w, a.client, a.round)
        del self.busy[w]
        self.live.discard(w)
        self.stalled[w] = a
        self.lost[w] = err
        return Outcome(Outcome.LOST, a, err)

    def handle(self, event: tuple[Any, ...], round: int,
               judge: Callable[[int, Header, Optional[torch.Tensor], dict[str, float], float, Assignment], Outcome]
               ) -> Optional[Outcome]:
        """The Outcome of `event` (None: nothing for the caller), the states moved. `round`
        is the current version (a terminate carries it); judge(w, header, payload, metrics,
        arrived, assignment) gives the Outcome of an answer to the assignment it closes."""
        if event[0] == "retire":
            _, w, why = event
            return self.retire_misbehaved(w, why, round)
        if event[0] == "lost":
            _, w, exc = event
            if w in self.gone:
                return None
            a = self.busy.pop(w, None)
            self.stalled.pop(w, None)
            held = f" while it held client {a.client} (round {a.round})" if a else ""
            err = WorkerFailed(f"federated worker rank {w} was lost{held}: {exc}", w, a.client if a else None,
                               a.round if a else None)
            err.__cause__ = exc
            self.retire(w, err, round)
            return Outcome(Outcome.LOST, a, err)
        _, w, h, payload, metrics, arrived = event
        if h.command == TERMINATE or w in self.gone:
            return None  # an acknowledgement (its listener has ended), or a retired worker's
        if w in self.stalled:
            a = self.stalled.pop(w)
            if answers(h, a):
                self.live.add(w)
                del self.lost[w]
                return Outcome(Outcome.BACK, None, None)
            return self._out_of_turn(w, h, None, round)
        a = self.busy.pop(w, None)
        if a is None or not answers(h, a):
            return self._out_of_turn(w, h, a, round)
        return judge(w, h, payload, metrics, arrived, a)

    def retire_misbehaved(self, w: int, why: str, round: int) -> Optional[Outcome]:
        """Worker `w` broke the protocol (`why`): retire it, dropping what it sent. The
        Outcome's error says so (the server warns with it and notes it in the round)."""
        if w in self.gone:
            return None
        a = self.busy.pop(w, None)
        held = a or self.stalled.pop(w, None) or self.expect.get(w)
        where = f" (client {held.client}, round {held.round})" if held else ""
        err = WorkerFailed(f"federated worker rank {w} was retired{where}: {why}; what it sent was dropped",
                           w, held.client if held else None, held.round if held else None)
        self.retire(w, err, round, stop=True)
        return Outcome(Outcome.LOST, a, err)

    def _out_of_turn(self, w: int, h: Header, a: Optional[Assignment], round: int) -> Outcome:
        err = WorkerFailed(f"federated worker rank {w} sent an unexpected {h.name} message "
                           f"(round {h.round}, client {h.client}, seq {h.seq})", w,
                           a.client if a else None, a.round if a else None)
        self.retire(w, err, round, stop=True)
        return Outcome(Outcome.LOST, a, err)

    def retire(self, w: int, err: Exception, round: int, stop: bool = False) -> None:
        """Stop using worker `w` for good. One still connected (`stop`: it answered out of
        turn) gets a terminate, not waited for, so that it stops instead of waiting for
        tasks, and its listener ends with the acknowledgement."""
        self.live.discard(w)
        self.gone.add(w)
        self.lost[w] = err
        if stop:
            try:
                self.terminate(w, round)
            except PyBridgeError:
                pass  # its connection is gone too: nothing left to stop

    def terminate(self, w: int, round: int) -> None:
        """Send `w` a terminate, not waited for (a busy worker takes it after its client);
        its acknowledgement is then expected. A send that fails raises."""
        self.terminating.add(w)
        links = self.links
        self.farewells.append((w, links.isend_header(Header(TERMINATE, round), w, links.down)))

    def send_farewells(self, until: float, skip: Iterable[int]) -> None:
        """Let the terminates sent (and not waited for) leave, until `until`, except those to
        the workers in `skip`. Gloo sends a message only once its receiver has posted the
        receive: a retired worker still busy with its last answer had not, and closing the
        links (or cutting another worker) dropped its terminate, so it failed with "lost the
        server" instead of stopping (seen in the suite; tests/test_federated.py makes it
        happen). Bounded: workers that never receive cost close() FAREWELL_SECONDS at most."""
        for w, work in self.farewells:
            if w in skip:
                continue
            try:
                work.wait(max(until - time.monotonic(), 0.001))
            except PyBridgeError:
                pass  # that worker's connection is gone, or it never received: it is cut off
        self.farewells = []
