"""The server side: hand clients to workers and collect their results as they finish.

Completion detection: one listener thread per worker blocks in a receive from that worker
(on the `up` link) and queues what arrives; the server's own thread takes results from the
queue in completion order and gives the worker that sent one its next client at once.
A receive from ANY rank (gloo's recv_anysource) would need one thread in all, but when a
worker dies it only times out, without saying which; a receive per worker fails at once
with the connection, so the error names the worker (docs/federated.md has the figures,
from bench/federated_mechanisms.py).
"""

import collections
import queue
import threading
import time
from dataclasses import dataclass

import torch

from ..base import dtypes
from ..comm import group as _group
from ..base.checks import integer, positive_finite, positive_seconds
from ..errors import Closed, InvalidArgument, PyBridgeError, UpdateRefused, WorkerFailed, WorkerTimeout, classify
from . import buffered
from .modes import BUFFERED as BUFFERED_MODES, MODES
from .results import Result, RoundResults, client_list
from .integrity import refusal
from .metrics import decode as decode_metrics
from .protocol import DEFAULT_LINK_TIMEOUT, EVALUATE, FAILED, SERVER, TERMINATE, TRAIN, UPDATE, Header, Links, decode_message, flat

REFUSED_RETRIES = 1  # with requeue, a client whose update was refused is handed out once more


@dataclass
class _Assignment:
    round: int
    client: int
    command: int
    seq: int
    start: float


class Server:
    """Rank 0 of a federated group (default: the world); every other rank runs a Worker.
    Creating it is a collective with the workers' Worker().

    mode: "async" gives a worker its next client as soon as it returns one; "sync" hands
    clients out in waves of one per worker and waits for the whole wave (FLUTE's gloo
    fallback, kept for comparison). "fedbuff" and "fedasync": no rounds for the workers, the
    model advances every K results (K = 1 for fedasync) and stragglers' results are applied
    late, weighted by their staleness; drive them with FedAvgRounds (buffered.py).
    timeout: seconds a worker may hold a client (default: the group's timeout).
    requeue: a worker lost while holding a client (dead, or past the timeout) has its client
    handed to the remaining workers, so the round completes; otherwise run_round raises
    WorkerFailed (WorkerTimeout) naming the worker and the client. A refused update's
    client is handed out once more too.
    max_norm: a training update (pseudo-gradient) whose L2 norm is larger is refused
    (default None: no bound). Updates with NaN or Inf elements are always refused.
    affinity: {client: worker ranks that hold its data} for clients that not every worker
    holds (see set_affinity); other clients go to any worker.
    link_timeout: seconds a link may stay silent (the listeners wait that long at most).

    Use it from one thread. docs/federated.md has the failure model.
    """

    def __init__(self, group=None, *, mode="async", timeout=None, requeue=False, max_norm=None,
                 affinity=None, link_timeout=DEFAULT_LINK_TIMEOUT):
        g = group or _group.current()
        if mode not in MODES:
            raise InvalidArgument(f"unknown federated mode {mode!r}; choose one of {', '.join(MODES)}")
        if g.size < 2:
            raise InvalidArgument("a federated group needs a server (rank 0) and at least one worker")
        if g.rank != SERVER:
            raise InvalidArgument(f"the server is rank 0 of the federated group; this is rank {g.rank}")
        self.mode = mode
        self.requeue = bool(requeue)
        self.timeout = g.timeout if timeout is None else positive_seconds("timeout", timeout)
        self.max_norm = None if max_norm is None else positive_finite("max_norm", max_norm)
        self.workers = tuple(range(1, g.size))
        self.affinity = {}  # client -> frozenset of the worker ranks holding its data
        for client, holders in (affinity or {}).items():
            self.set_affinity(client, holders)
        self._links = Links(g, link_timeout)
        self._live = set(self.workers)  # connected and taking clients (idle or busy)
        self.lost = {}  # worker rank -> the error that retired it (a stalled one's until it answers)
        self._gone = set()  # retired for good: connection lost or out of protocol
        self._stalled = {}  # worker rank -> the assignment it timed out on: taken back if it answers
        self.round = 0
        self.current = None  # the latest round's RoundResults
        self._model = None  # the current round's model (a copy: late workers get it when they free up)
        self._has = {}  # worker rank -> the round of the model it holds
        self._busy = {}  # worker rank -> _Assignment, of this round or an abandoned one
        self._seq = dict.fromkeys(self.workers, 0)
        self._events = queue.Queue()
        self._farewells = []  # terminates sent, not waited for
        self.closed = False
        self._listeners = {w: threading.Thread(target=self._listen, args=(w,), daemon=True,
                                               name=f"pybridge-federated-{w}") for w in self.workers}
        for t in self._listeners.values():
            t.start()

    def set_affinity(self, client, workers):
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

    def run_round(self, clients, model, *, evaluate=False):
        """Start a round: send `model` (a flat tensor, or any tensor: it is flattened) to the
        workers, then hand out `clients` (ids, each once, at least one) to train (or
        evaluate). Returns a RoundResults: an iterator over the Results in completion order
        (the round is over when it ends) that also keeps the round's metrics.
        A round may be left early (over-selection): workers still holding its clients are
        not waited for; their late results are dropped by round number, and they get the
        next round's model and clients once they are back."""
        self._check_open()
        if self.mode in BUFFERED_MODES:  # FedBuff / FedAsync dispatch: no rounds there
            raise InvalidArgument(f"mode {self.mode} hands clients out across model versions, not in rounds: "
                                  "drive it with FedAvgRounds (or server.stream)")
        clients = client_list(clients)
        if not clients:
            raise InvalidArgument("run_round needs at least one client: an empty round would send the "
                                  "model and advance the round for nothing")
        model = flat(model, "model").to(self._links.device)
        self._drain()
        if not self._live:
            raise WorkerFailed(f"no federated workers are left (lost: {self._lost_text()})")
        self.round += 1
        self._model = model.clone()
        self._send_model([w for w in sorted(self._live) if w not in self._busy])
        rr = self.current = RoundResults(self.round, EVALUATE if evaluate else TRAIN)
        rr._gen = self._results(rr, collections.deque(clients))
        return rr

    def _send_model(self, workers):
        """The round's model to idle `workers`, point to point and concurrently. Not a
        collective broadcast: that couples every worker to every other, so one that died
        unnoticed would leave the others waiting inside it, with no way to reach them;
        a send fails only for its own worker, which is then retired like any other."""
        links, model = self._links, self._model
        h = Header(UPDATE, self.round, length=model.numel(), dtype=dtypes.code(model.dtype))
        sends = []
        for w in workers:  # every one is idle, waiting for a header
            try:
                links.send_header(h, w, links.down)
                sends.append((w, links.isend_payload(model, w, links.down)))
            except PyBridgeError as exc:
                self._events.put(("lost", w, exc))
        for w, work in sends:
            try:
                work.wait()
                self._has[w] = self.round
            except PyBridgeError as exc:
                self._events.put(("lost", w, exc))

    def _results(self, rr, pending):
        mine, command = self.round, rr.command
        refusals = collections.Counter()
        while True:
            self._check_open()
            if self.round != mine:
                raise InvalidArgument(f"round {mine} was abandoned: round {self.round} started before its "
                                      "results were all taken (the server runs one round at a time)")
            if self.mode == "async" or not self._out():  # sync: a wave once the last one is back
                for w in self._idle():
                    client = self._take(pending, w)
                    if client is not None:
                        self._assign(w, client, command)
            if not self._out():
                if not pending:
                    return
                if not self._busy:  # nobody left to free up (a straggler of an earlier round would)
                    raise self._stuck(pending, mine)
            kind, a, value = self._next_outcome()
            if a is None or a.round != mine:
                continue  # a worker lost while idle, taken back, or late from an abandoned round
            if kind == "result":
                yield value
                continue
            if kind == "refused":
                rr.refused[a.client] = value
                if self.requeue and refusals[a.client] < REFUSED_RETRIES:
                    refusals[a.client] += 1
                    pending.appendleft(a.client)
                    continue
            elif kind == "lost" and self.requeue:
                pending.appendleft(a.client)
                continue
            raise value

    def _take(self, pending, w):
        """The first pending client that worker `w` may train (its affinity), taken out."""
        for i, c in enumerate(pending):
            if w in self.affinity.get(c, (w,)):
                del pending[i]
                return c
        return None

    def _stuck(self, pending, mine):
        if self._live:  # live workers, but none holds these clients' data
            held = "; ".join(f"client {c}: workers {sorted(self.affinity[c])}" for c in pending)
            return WorkerFailed(f"clients {list(pending)} of round {mine} can go only to workers that are "
                                f"lost ({held}; lost: {self._lost_text()})")
        return WorkerFailed(f"no federated workers are left (lost: {self._lost_text()}); "
                            f"clients {list(pending)} of round {mine} were not done")

    def _out(self):
        """Whether a client of the current round is out."""
        return any(a.round == self.round for a in self._busy.values())

    # ---- FedBuff / FedAsync (buffered.py): the one entry into the buffered modes ---------------

    def stream(self, model):
        """Mode fedbuff or fedasync: a buffered.Stream handing clients out on `model` (the
        server's flat model, read at each send) across versions. FedAvgRounds uses it."""
        self._check_open()
        if self.mode not in BUFFERED_MODES:
            raise InvalidArgument(f"stream is for the fedbuff and fedasync modes; this server's mode is {self.mode}")
        if model.device != self._links.device:  # it is sent as is, whenever a worker is behind
            raise InvalidArgument(f"in mode {self.mode} the model must be on the group's device "
                                  f"({self._links.device}), not {model.device}")
        self._drain()
        if not self._live:
            raise WorkerFailed(f"no federated workers are left (lost: {self._lost_text()})")
        return buffered.Stream(self, model)

    # ---------------------------------------------------------------------------------------------

    def _idle(self):
        return [w for w in self.workers if w in self._live and w not in self._busy]

    def _assign(self, w, client, command):
        if self._has.get(w) != self.round:  # back from an earlier round's client, or taken back
            self._send_model([w])
            if self._has.get(w) != self.round:
                return self._assign_failed(w, client, command)
        self._seq[w] += 1
        a = self._busy[w] = _Assignment(self.round, client, command, self._seq[w], time.monotonic())
        try:  # the worker is waiting for it, so this returns at once
            self._links.send_header(Header(command, self.round, client, seq=a.seq), w, self._links.down)
        except PyBridgeError as exc:
            self._events.put(("lost", w, exc))

    def _assign_failed(self, w, client, command):
        """The model could not reach `w` (its loss is queued): hold the client as out, so
        that handling the loss gives it back (requeue) or names it."""
        self._busy[w] = _Assignment(self.round, client, command, self._seq[w], time.monotonic())

    # ---- events from the listeners ------------------------------------------------------------

    def _listen(self, w):
        """Receive everything worker `w` sends, in order, until its terminate or its end."""
        links = self._links
        if links.device.type == "cuda":
            torch.cuda.set_device(links.device)  # the current device is per thread
        while True:
            try:
                h = links.recv_header(w, links.up)
                payload = links.recv_payload(h, w, links.up) if h.length else None
                metrics = decode_metrics(links.recv_metrics(h, w)) if h.metrics else {}
            except Exception as exc:  # noqa: BLE001 - reported to the server's thread
                self._events.put(("lost", w, classify(exc)))
                return
            self._events.put(("message", w, h, payload, metrics, time.monotonic()))
            if h.command == TERMINATE:
                return

    def _next_outcome(self):
        """Wait for the next answer or loss among the busy workers: (kind, assignment, value)
        with kind "result" (value a Result), "failed", "refused" or "lost" (value the error),
        or "back" (a stalled worker answered: taken back, no assignment)."""
        while True:
            w, due = min(self._busy.items(), key=lambda kv: kv[1].start)
            left = due.start + self.timeout - time.monotonic()
            try:
                event = self._events.get(timeout=max(left, 0.0))
            except queue.Empty:
                return self._stall(w, due)
            outcome = self._handle(event)
            if outcome is not None:
                return outcome

    def _stall(self, w, a):
        """`w` held its client past the timeout: stop giving it clients, but keep listening,
        so that it is taken back once it answers (its late result is dropped)."""
        err = WorkerTimeout(f"federated worker rank {w} did not return client {a.client} (round {a.round}) "
                            f"within {self.timeout:g} s", w, a.client, a.round)
        del self._busy[w]
        self._live.discard(w)
        self._stalled[w] = a
        self.lost[w] = err
        return "lost", a, err

    def _handle(self, event):
        if event[0] == "lost":
            _, w, exc = event
            if w in self._gone:
                return None
            a = self._busy.pop(w, None)
            self._stalled.pop(w, None)
            held = f" while it held client {a.client} (round {a.round})" if a else ""
            err = WorkerFailed(f"federated worker rank {w} was lost{held}: {exc}", w, a and a.client,
                               a and a.round)
            err.__cause__ = exc
            self._retire(w, err)
            return "lost", a, err
        _, w, h, payload, metrics, arrived = event
        if h.command == TERMINATE or w in self._gone:
            return None  # an acknowledgement (its listener has ended), or a retired worker's
        if w in self._stalled:
            a = self._stalled.pop(w)
            if _answers(h, a):
                self._live.add(w)
                del self.lost[w]
                return "back", None, None
            return self._out_of_turn(w, h, None)
        a = self._busy.pop(w, None)
        if a is None or not _answers(h, a):
            return self._out_of_turn(w, h, a)
        if h.command == FAILED:
            text = decode_message(payload) if payload is not None else ""
            return "failed", a, WorkerFailed(f"federated worker rank {w} failed on client {a.client} "
                                             f"(round {a.round}): {text}", w, a.client, a.round)
        if a.round != self.round and self.mode not in BUFFERED_MODES:  # FedBuff / FedAsync apply late ones
            return "result", a, None  # late, from an abandoned round: dropped by the caller
        if h.command == TRAIN:
            if (h.length, h.dtype) != (self._model.numel(), dtypes.code(self._model.dtype)):
                return "failed", a, WorkerFailed(
                    f"federated worker rank {w} returned {h.length} elements of dtype code {h.dtype} for "
                    f"client {a.client} (round {a.round}); the model has {self._model.numel()} of dtype "
                    f"code {dtypes.code(self._model.dtype)}", w, a.client, a.round)
            why = refusal(payload, self.max_norm)
            if why is not None:
                return "refused", a, UpdateRefused(
                    f"federated worker rank {w} returned client {a.client}'s update for round {a.round}, "
                    f"refused: {why}", w, a.client, a.round)
        if payload is None:
            payload = torch.empty(0, dtype=dtypes.BY_CODE[h.dtype], device=self._links.device)
        return "result", a, Result(h.command, h.round, h.client, w, h.samples, payload, arrived - a.start,
                                   metrics)

    def _out_of_turn(self, w, h, a):
        err = WorkerFailed(f"federated worker rank {w} sent an unexpected {h.name} message "
                           f"(round {h.round}, client {h.client}, seq {h.seq})", w, a and a.client,
                           a and a.round)
        self._retire(w, err, stop=True)
        return "lost", a, err

    def _retire(self, w, err, stop=False):
        """Stop using worker `w` for good. One still connected (`stop`: it answered out of
        turn) gets a terminate, not waited for, so that it stops instead of waiting for
        tasks, and its listener ends with the acknowledgement."""
        self._live.discard(w)
        self._gone.add(w)
        self.lost[w] = err
        if stop:
            try:
                self._farewells.append(self._links.isend_header(Header(TERMINATE, self.round), w,
                                                                self._links.down))
            except PyBridgeError:
                pass  # its connection is gone too: nothing left to stop

    def _drain(self):
        """Take in the notices already queued (losses, late results, stalled workers back)."""
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            self._handle(event)

    def _lost_text(self):
        return "; ".join(f"rank {w}: {e}" for w, e in sorted(self.lost.items())) or "none"

    # ---- shutdown ---------------------------------------------------------------------------

    def close(self, timeout=None):
        """Terminate the workers and end the listener threads. Idle workers stop at once; one
        still holding a client (of an unfinished round) stops after it, and is waited for
        until that client's deadline (hand-out + the server's timeout), or `timeout` seconds
        if given. One past that (a worker that stalled, or hangs) is cut off: the links are
        closed under it, so close() never waits for it beyond its deadline, and leaves no
        thread; such a worker gets an error naming the lost server (rank 0)."""
        if self.closed:
            return
        if timeout is not None:
            timeout = positive_seconds("timeout", timeout)
        self.closed = True
        links = self._links
        now = time.monotonic()
        try:
            self._drain()
            deadline = {}
            for w in sorted(self._live | set(self._stalled)):
                a = self._busy.get(w) or self._stalled.get(w)
                deadline[w] = now + timeout if timeout is not None else \
                    (a.start + self.timeout if a else now + self.timeout)
                try:  # not waited for: a busy worker takes it after its client
                    self._farewells.append(links.isend_header(Header(TERMINATE, self.round), w, links.down))
                except PyBridgeError as exc:
                    self._handle(("lost", w, exc))
            for w, t in self._listeners.items():  # a listener ends with its worker's acknowledgement
                t.join(max(deadline.get(w, now) - time.monotonic(), 0.0))  # retired ones: not waited for
        finally:
            for w in [w for w, t in self._listeners.items() if t.is_alive()]:
                if self._listeners[w].is_alive():
                    links.cut(w)
            for t in self._listeners.values():
                t.join(5.0)  # a cut receive fails at once
            self._farewells = []
            links.close()

    def _check_open(self):
        if self.closed:
            raise Closed("the federated server was closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _answers(h, a):
    """Whether header `h` answers assignment `a` (its result, or its reported failure)."""
    return (h.round, h.client, h.seq) == (a.round, a.client, a.seq) and h.command in (a.command, FAILED)
