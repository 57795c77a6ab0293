"""The server side of a federation, client assignment: its settings, the model's versions,
the hand-out seam that both loops drive (idle_workers, take_client, assign, next_outcome,
retry_client, ...), what an answer is worth (_judge) and shutdown. The loops: the round
modes' in roundloop.py (run_round makes it), the buffered modes' in stream.py; the
aggregation of what comes back is rounds.py, buffered.py (UpdateBuffer) and aggregate.py.

Completion detection: one listener thread per worker (listener.py) reads that worker's up
stream and queues what arrives; the server's own thread takes the events in completion
order, workers.py turns each into an Outcome and moves the worker's state, and the worker
that sent a result gets its next client at once.
"""

import collections
import queue
import time
import warnings
from typing import Any, Iterable, Mapping, Optional

import torch

from ..base import dtypes
from ..comm import world as _world
from ..comm.group import ABORT_POLL_SECONDS, Group
from ..base.checks import integer, positive_seconds
from ..errors import Closed, CommError, InvalidArgument, PyBridgeError, UpdateRefused, WorkerFailed
from . import roundloop, uplink
from .listener import Listeners
from .modes import BUFFERED as BUFFERED_MODES, MODES
from .results import Outcome, Result, RoundResults, client_list
from .integrity import max_norm_setting, refusal
from .stream import Stream
from .protocol import (DEFAULT_LINK_TIMEOUT, DEFAULT_MAX_SAMPLES, EVALUATE, FAILED, SERVER, TRAIN, Header, Links,
                       decode_message, flat)
from .workers import Assignment, Workers

REFUSED_RETRIES = 1  # with requeue, a client whose update was refused is handed out once more
# How long close() lets the terminates it sent leave before it closes the links (see close()).
FAREWELL_SECONDS = 5.0


class Server:
    """Rank 0 of a federated group (default: the world); every other rank runs a Worker.
    Creating it is a collective with the workers' Worker().

    mode: "async" gives a worker its next client as soon as it returns one; "sync" hands
    clients out in waves of one per worker and waits for the whole wave (FLUTE's gloo
    fallback, kept for comparison). "fedbuff" and "fedasync": no rounds for the workers, the
    model advances every K results (K = 1 for fedasync) and stragglers' results are applied
    late, weighted by their staleness; drive them with FedAvgRounds (stream.py).
    timeout: seconds a worker may hold a client (default: the group's timeout).
    requeue: a worker lost while holding a client (dead, or past the timeout) has its client
    handed to the remaining workers, so the round completes; otherwise run_round raises
    WorkerFailed (WorkerTimeout) naming the worker and the client. A refused update's
    client is handed out once more too.
    max_norm: a training update (pseudo-gradient) whose L2 norm is larger is refused
    (default None, or 0: no bound; see set_max_norm). Updates with NaN or Inf elements are
    always refused.
    affinity: {client: worker ranks that hold its data} for clients that not every worker
    holds (see set_affinity); other clients go to any worker.
    max_samples: the largest sample count a result may carry (default 2**31); a worker that
    sends more is retired (see set_max_samples).
    link_timeout: seconds a link may stay silent (the listeners wait that long at most).

    A worker that breaks the protocol (a header that does not answer its task or does not
    match the model, a payload that ends or stalls mid-message, surplus bytes, a sample count
    above max_samples, non-finite metrics, an unknown command) is retired like a lost one:
    named in `lost`, in the round's `retired` and in a RuntimeWarning, what it sent dropped.

    Use it from one thread. docs/federated.md has the failure model.
    """

    def __init__(self, group: Optional[Group] = None, *, mode: str = "async", timeout: Optional[float] = None,
                 requeue: bool = False, max_norm: Optional[float] = None,
                 affinity: Optional[Mapping[int, Optional[Iterable[int]]]] = None,
                 link_timeout: float = DEFAULT_LINK_TIMEOUT, max_samples: Optional[int] = None) -> None:
        g = group or _world.current()
        if mode not in MODES:
            raise InvalidArgument(f"unknown federated mode {mode!r}; choose one of {', '.join(MODES)}")
        if g.size < 2:
            raise InvalidArgument("a federated group needs a server (rank 0) and at least one worker")
        if g.rank != SERVER:
            raise InvalidArgument(f"the server is rank 0 of the federated group; this is rank {g.rank}")
        self.mode = mode
        self.requeue = bool(requeue)
        self.timeout = g.timeout if timeout is None else positive_seconds("timeout", timeout)
        self._max_norm: Optional[float] = None
        self.set_max_norm(max_norm)
        self._max_samples = DEFAULT_MAX_SAMPLES
        if max_samples is not None:
            self.set_max_samples(max_samples)
        self.link_timeout = positive_seconds("link_timeout", link_timeout)
        self.workers = tuple(range(1, g.size))
        self.affinity: dict[int, frozenset[int]] = {}  # client -> frozenset of the worker ranks holding its data
        for client, holders in (affinity or {}).items():
            self.set_affinity(client, holders)
        self._links = Links(g, link_timeout)
        try:
            listener = uplink.Listener(self._links.store, self.workers)
            self.up_address = listener.address  # (host, port) the workers connected to; closed now
            conns = listener.accept(g.timeout)
        except BaseException:
            self._links.close()
            raise
        self._round = 0  # the model version: the round number (buffered modes: moves at every step)
        self._current: Optional[RoundResults] = None  # the latest round's RoundResults
        self._model: Optional[torch.Tensor] = None  # the current version's model, sent to workers that hold an older one
        self.closed = False
        self._workers = Workers(self.workers, self._links)
        for w in self.workers:
            if w not in conns:
                self._workers.events.put(("lost", w, CommError(f"it did not connect its up link within "
                                                               f"{g.timeout:g} s")))
        self._listeners = Listeners(conns, self._workers, self._links.device, self.link_timeout, self.timeout,
                                    lambda: self._max_samples)

    @property
    def round(self) -> int:
        """The current round, which is the model's version: what the headers' round field
        carries (in the buffered modes it moves at every model step)."""
        return self._round

    @property
    def lost(self) -> dict[int, Exception]:
        """{worker rank: the error that retired it} (a stalled worker's until it answers)."""
        return self._workers.lost

    @property
    def current(self) -> Optional[RoundResults]:
        """The latest round's RoundResults (None before the first): its clients, samples,
        metrics and refusals so far."""
        return self._current

    @property
    def max_norm(self) -> Optional[float]:
        """The bound on a training update's L2 norm (None: no bound); see set_max_norm."""
        return self._max_norm

    def set_max_norm(self, max_norm: Optional[float]) -> None:
        """Refuse, from the next result on, training updates whose L2 norm is larger than
        `max_norm`: a finite number >= 0, where 0 or None removes the bound. The one rule
        for Python, C (pb_fed_server_set_max_norm) and Go (WithMaxNorm)."""
        self._max_norm = max_norm_setting(max_norm)

    @property
    def max_samples(self) -> int:
        """The largest sample count a result may carry; see set_max_samples."""
        return self._max_samples

    def set_max_samples(self, max_samples: int) -> None:
        """Retire, from the next result on, a worker whose result claims more than
        `max_samples` samples (an integer >= 1; default 2**31). Sample counts weight the
        FedAvg sum, so set it to the largest client's dataset size: then no single update
        can outweigh the round by claiming more. The one rule for Python, C
        (pb_fed_server_set_max_samples) and Go (WithMaxSamples)."""
        self._max_samples = integer("max_samples", max_samples, low=1)

    def set_affinity(self, client: int, workers: Optional[Iterable[int]]) -> None:
        """Hand `client` only to `workers` (ranks of workers that hold its data), from the
        next assignment on; None or empty: to any worker again."""
        c = integer("client", client, low=0)
        if workers is None:
            self.affinity.pop(c, None)
            return
        try:
            ranks = frozenset(integer("worker rank", w) for w in workers)
        except TypeError:
            raise InvalidArgument(f"workers must be a list of worker ranks, got {workers!r}") from None
        bad = sorted(ranks - set(self.workers))
        if bad:
            raise InvalidArgument(f"client {c}'s workers {bad} are not worker ranks (1 .. {len(self.workers)})")
        if ranks:
            self.affinity[c] = ranks
        else:
            self.affinity.pop(c, None)

    # ---- rounds -----------------------------------------------------------------------------

    def run_round(self, clients: Iterable[int], model: torch.Tensor, *, evaluate: bool = False) -> RoundResults:
        """Start a round: send `model` (a flat tensor, or any tensor: it is flattened) to the
        workers, then hand out `clients` (ids, each once, at least one) to train (or
        evaluate). Returns a RoundResults: an iterator over the Results in completion order
        (the round is over when it ends) that also keeps the round's metrics.
        A round may be left early (over-selection): workers still holding its clients are
        not waited for; their late results are dropped by round number, and they get the
        next round's model and clients once they are back."""
        self.check_open()
        if self.mode in BUFFERED_MODES:  # FedBuff / FedAsync dispatch: no rounds there
            raise InvalidArgument(f"mode {self.mode} hands clients out across model versions, not in rounds: "
                                  "drive it with FedAvgRounds (or server.stream)")
        ids = client_list(clients)
        if not ids:
            raise InvalidArgument("run_round needs at least one client: an empty round would send the "
                                  "model and advance the round for nothing")
        flat_model = flat(model, "model").to(self._links.device)
        self._drain()
        if not self._workers.live:
            raise WorkerFailed(f"no federated workers are left (lost: {self._workers.lost_text()})")
        sent = flat_model.clone()
        self.new_version(sent)
        self._workers.send_model(self.idle_workers(), sent, self.round)
        command = EVALUATE if evaluate else TRAIN
        rr = self._current = RoundResults(self.round, command, roundloop.results(self, command, collections.deque(ids)))
        return rr

    # ---- FedBuff / FedAsync (stream.py): the one entry into the buffered modes -----------------

    def stream(self, model: torch.Tensor) -> Stream:
        """Mode fedbuff or fedasync: a stream.Stream handing clients out on `model` (the
        server's flat model, read at each send) across versions. FedAvgRounds uses it."""
        self.check_open()
        if self.mode not in BUFFERED_MODES:
            raise InvalidArgument(f"stream is for the fedbuff and fedasync modes; this server's mode is {self.mode}")
        if model.device != self._links.device:  # it is sent as is, whenever a worker is behind
            raise InvalidArgument(f"in mode {self.mode} the model must be on the group's device "
                                  f"({self._links.device}), not {model.device}")
        self._drain()
        if not self._workers.live:
            raise WorkerFailed(f"no federated workers are left (lost: {self._workers.lost_text()})")
        return Stream(self, model)

    # ---- the hand-out seam: what run_round's loop and the buffered stream drive -----------------

    def check_open(self) -> None:
        """Raise Closed once the server was closed."""
        if self.closed:
            raise Closed("the federated server was closed")

    def new_version(self, model: Optional[torch.Tensor] = None) -> int:
        """The model changed: the round (the model's version) moves on by one, and a worker
        holding an older version gets the model before its next client. `model` is the tensor
        to send from now on (sent as is, read at each send); None keeps the one there, changed
        in place. Returns the new version."""
        if model is not None:
            self._model = model
        self._round += 1
        return self._round

    def start_summary(self, command: int) -> RoundResults:
        """A fresh summary (RoundResults of `command` at the current version) for the results
        taken from now on: `current`. The caller records results in it (RoundResults.record)."""
        current = self._current = RoundResults(self.round, command)
        return current

    def idle_workers(self) -> list[int]:
        """Live workers that hold no client, in rank order: those take clients now."""
        idle: list[int] = self._workers.idle()
        return idle

    def busy_workers(self) -> list[int]:
        """Workers holding a client (of this round or version, or an earlier one), in rank order."""
        return sorted(self._workers.busy)

    def out(self) -> bool:
        """Whether a client of the current round (version) is out."""
        out: bool = self._workers.out(self.round)
        return out

    def take_client(self, pending: "collections.deque[int]", worker: int) -> Optional[int]:
        """Take out of `pending` (a deque of client ids) the first client `worker` may hold
        (its affinity); None if there is none."""
        for i, c in enumerate(pending):
            if worker in self.affinity.get(c, (worker,)):
                del pending[i]
                return c
        return None

    def assign(self, worker: int, client: int, command: int) -> None:
        """Hand `client` to the idle `worker` to train or evaluate (`command`) on the current
        version, sending the model first if the worker holds an older one. A send that fails
        is a LOST outcome of next_outcome, not an error here."""
        assert self._model is not None  # run_round or stream gave the first version
        self._workers.assign(worker, client, command, self.round, self._model)

    def next_outcome(self) -> Outcome:
        """Wait for the next answer or loss among the busy workers (at least one must be
        busy): an Outcome of kind RESULT, FAILED, REFUSED, LOST or BACK (results.py). A
        worker past its client's timeout is stalled here (LOST, with a WorkerTimeout)."""
        while True:
            w, due = min(self._workers.busy.items(), key=lambda kv: kv[1].start)
            left = due.start + self.timeout - time.monotonic()
            try:  # in slices: an aborted group (Group.abort) ends the wait, which no socket does
                event = self._workers.events.get(timeout=min(max(left, 0.0), ABORT_POLL_SECONDS))
            except queue.Empty:
                self._links.group.check_aborted("the federated server's wait for a result")
                if left > ABORT_POLL_SECONDS:
                    continue
                stalled: Outcome = self._workers.stall(w, due, self.timeout)
                return stalled
            outcome = self._handle(event)
            if outcome is not None:
                return outcome

    def retry_client(self, outcome: Outcome, refusals: "collections.Counter[int]") -> bool:
        """Whether a failed outcome's client goes back to be handed out again. With requeue:
        a lost worker's client always, a refused update's client REFUSED_RETRIES times
        (`refusals`: a Counter per client that the caller keeps for its round); never a
        reported failure. A refusal is noted in current.refused either way."""
        kind, a, value = outcome
        if kind == Outcome.REFUSED:
            assert self._current is not None  # the round (or summary) the refusal is in
            self._current.refused[a.client] = value
            if self.requeue and refusals[a.client] < REFUSED_RETRIES:
                refusals[a.client] += 1
                return True
            return False
        return kind == Outcome.LOST and self.requeue

    def unassignable(self, pending: Iterable[int]) -> WorkerFailed:
        """The error for clients `pending` that no worker left can take (the caller raises it)."""
        if self._workers.live:  # live workers, but none holds these clients' data
            held = "; ".join(f"client {c}: workers {sorted(self.affinity[c])}" for c in pending)
            return WorkerFailed(f"clients {list(pending)} of round {self.round} can go only to workers that are "
                                f"lost ({held}; lost: {self._workers.lost_text()})")
        return WorkerFailed(f"no federated workers are left (lost: {self._workers.lost_text()}); "
                            f"clients {list(pending)} of round {self.round} were not done")

    # ---- events from the listeners ------------------------------------------------------------

    def _handle(self, event: tuple[Any, ...]) -> Optional[Outcome]:
        """The Outcome of one event (workers.py moves the worker's state); a worker retired
        for breaking the protocol is warned about and noted in the round's `retired`."""
        outcome: Optional[Outcome] = self._workers.handle(event, self.round, self._judge)
        if event[0] == "retire" and outcome is not None:
            warnings.warn(str(outcome.value), RuntimeWarning, stacklevel=2)
            if self._current is not None:
                self._current.retired[event[1]] = outcome.value
        return outcome

    def _judge(self, w: int, h: Header, payload: Optional[torch.Tensor], metrics: dict[str, float], arrived: float,
               a: Assignment) -> Outcome:
        """The Outcome of worker `w`'s answer `h` to its assignment `a`: its reported
        failure, a late result of an abandoned round (dropped by the caller), a training
        update that does not fit the model or is refused (integrity.refusal), or a Result."""
        if h.command == FAILED:
            text = decode_message(payload) if payload is not None else ""
            return Outcome(Outcome.FAILED, a, WorkerFailed(
                f"federated worker rank {w} failed on client {a.client} (round {a.round}): {text}",
                w, a.client, a.round))
        if a.round != self.round and self.mode not in BUFFERED_MODES:  # FedBuff / FedAsync apply late ones
            return Outcome(Outcome.RESULT, a, None)  # late, from an abandoned round: dropped by the caller
        if h.command == TRAIN:
            assert self._model is not None  # sent before any client
            if (h.length, h.dtype) != (self._model.numel(), dtypes.code(self._model.dtype)):
                return Outcome(Outcome.FAILED, a, WorkerFailed(
                    f"federated worker rank {w} returned {h.length} elements of dtype code {h.dtype} for "
                    f"client {a.client} (round {a.round}); the model has {self._model.numel()} of dtype "
                    f"code {dtypes.code(self._model.dtype)}", w, a.client, a.round))
            why = refusal(payload, self._max_norm) if payload is not None else None  # none: an empty update
            if why is not None:
                return Outcome(Outcome.REFUSED, a, UpdateRefused(
                    f"federated worker rank {w} returned client {a.client}'s update for round {a.round}, "
                    f"refused: {why}", w, a.client, a.round))
        if payload is None:
            payload = torch.empty(0, dtype=dtypes.BY_CODE[h.dtype], device=self._links.device)
        return Outcome(Outcome.RESULT, a, Result(h.command, h.round, h.client, w, h.samples, payload,
                                                 arrived - a.start, metrics))

    def _drain(self) -> None:
        """Take in the notices already queued (losses, late results, stalled workers back)."""
        while True:
            try:
                event = self._workers.events.get_nowait()
            except queue.Empty:
                return
            self._handle(event)

    # ---- shutdown ---------------------------------------------------------------------------

    def close(self, timeout: Optional[float] = None) -> None:
        """Terminate the workers and end the listener threads. Idle workers stop at once; one
        still holding a client (of an unfinished round) stops after it, and is waited for
        until that client's deadline (hand-out + the server's timeout), or `timeout` seconds
        if given. One past that (a worker that stalled, or hangs) is cut off: the links are
        closed under it, so close() never waits for it beyond its deadline, and leaves no
        thread; such a worker gets an error naming the lost server (rank 0). The terminates
        sent to the others are given up to FAREWELL_SECONDS to leave before anyone is cut off
        (a cut closes every connection of the link), and retired workers' listeners as long
        to end. After the group was aborted (Group.abort) nobody is waited for."""
        if self.closed:
            return
        if timeout is not None:
            timeout = positive_seconds("timeout", timeout)
        self.closed = True
        ws, listeners = self._workers, self._listeners
        aborted = self._links.group.aborted is not None  # its connections are shut: nobody is waited for
        if aborted:
            timeout = 0.0
        now = time.monotonic()
        try:
            self._drain()
            deadline: dict[int, float] = {}
            for w in sorted(ws.live | set(ws.stalled)):
                a = ws.busy.get(w) or ws.stalled.get(w)
                deadline[w] = now + timeout if timeout is not None else \
                    (a.start + self.timeout if a else now + self.timeout)
                try:  # not waited for: a busy worker takes it after its client
                    ws.terminate(w, self.round)
                except PyBridgeError as exc:
                    self._handle(("lost", w, exc))
            for w in listeners.threads:  # a listener ends with its worker's acknowledgement
                listeners.join(w, deadline.get(w, now))  # retired ones: below
        finally:
            # Workers still busy past their deadline are cut off; a cut closes every
            # connection of the down link, so the terminates of the others leave first.
            stuck = {w for w in listeners.threads if listeners.alive(w) and w not in ws.gone}
            until = time.monotonic() + (0.0 if aborted else FAREWELL_SECONDS)
            ws.send_farewells(until, skip=stuck)
            for w in listeners.threads:
                if w not in stuck:  # a retired worker's listener ends on its own, or with its acknowledgement
                    listeners.join(w, until)
            for w in listeners.threads:
                if listeners.alive(w):
                    listeners.shutdown(w)  # its listener's read ends at once
                    if w in stuck:
                        self._links.cut(w)  # and the worker's wait for a task on the down links
            for w in listeners.threads:
                listeners.join(w, time.monotonic() + 5.0)
            self._links.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

