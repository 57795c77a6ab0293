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
import operator
import queue
import threading
import time
from dataclasses import dataclass

import torch

from .. import dtypes
from .. import group as _group
from ..checks import positive_seconds
from ..errors import Closed, InvalidArgument, PyBridgeError, WorkerFailed, WorkerTimeout, classify
from . import buffered
from .protocol import (DEFAULT_LINK_TIMEOUT, EVALUATE, FAILED, SERVER, TERMINATE, TRAIN,
                       UPDATE, Header, Links, decode_message, flat)

MODES = ("async", "sync") + buffered.MODES  # the last two: FedBuff / FedAsync (buffered.py)


@dataclass
class Result:
    """One client's answer. TRAIN: `payload` is the pseudo-gradient (round model - trained
    weights) from `samples` examples; EVALUATE: the worker's metrics. `seconds`: from
    handing the client out to the result's arrival."""

    command: int
    round: int
    client: int
    worker: int
    samples: int
    payload: torch.Tensor
    seconds: float


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
    WorkerFailed (WorkerTimeout) naming the worker and the client.
    link_timeout: seconds a link may stay silent (the listeners wait that long at most).

    Use it from one thread.
    """

    def __init__(self, group=None, *, mode="async", timeout=None, requeue=False,
                 link_timeout=DEFAULT_LINK_TIMEOUT):
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
        self._links = Links(g, link_timeout)
        self.workers = tuple(range(1, g.size))
        self._live = set(self.workers)
        self.lost = {}  # worker rank -> the error that retired it
        self.round = 0
        self._model = None  # (numel, dtype code) of the current round's model
        self._busy = {}  # worker rank -> _Assignment
        self._seq = dict.fromkeys(self.workers, 0)
        self._events = queue.Queue()
        self._farewells = []  # terminates sent, not waited for, to workers that timed out
        self.closed = False
        self._listeners = [threading.Thread(target=self._listen, args=(w,), daemon=True,
                                            name=f"pybridge-federated-{w}") for w in self.workers]
        for t in self._listeners:
            t.start()

    # ---- rounds -----------------------------------------------------------------------------

    def run_round(self, clients, model, *, evaluate=False):
        """Start a round: send `model` (a flat tensor, or any tensor: it is flattened) to the
        workers, then hand out `clients` (ids, each once) to train (or evaluate). Returns an
        iterator over the Results in completion order; the round is over when it ends.
        A round left unfinished is drained (its results dropped) when the next one starts."""
        self._check_open()
        if self.mode in buffered.MODES:  # FedBuff / FedAsync dispatch: no rounds there
            raise InvalidArgument(f"mode {self.mode} hands clients out across model versions, not in rounds: "
                                  "drive it with FedAvgRounds (or server.stream)")
        clients = _client_list(clients)
        model = flat(model, "model").to(self._links.device)
        self._settle()
        if not self._live:
            raise WorkerFailed(f"no federated workers are left (lost: {self._lost_text()})")
        self.round += 1
        self._model = (model.numel(), dtypes.code(model.dtype))
        self._send_model(model)
        return self._results(collections.deque(clients), EVALUATE if evaluate else TRAIN)

    def _send_model(self, model):
        """The round's model to every live worker, point to point and concurrently. Not a
        collective broadcast: that couples every worker to every other, so one that died
        unnoticed would leave the others waiting inside it, with no way to reach them;
        a send fails only for its own worker, which is then retired like any other."""
        links = self._links
        h = Header(UPDATE, self.round, length=model.numel(), dtype=dtypes.code(model.dtype))
        sends = []
        for w in sorted(self._live):  # every one is idle, waiting for a header
            try:
                links.send_header(h, w, links.down)
                sends.append((w, links.isend_payload(model, w, links.down)))
            except PyBridgeError as exc:
                self._events.put(("lost", w, exc))
        for w, work in sends:
            try:
                work.wait()
            except PyBridgeError as exc:
                self._events.put(("lost", w, exc))

    def _results(self, pending, command):
        mine = self.round
        while True:
            self._check_open()
            if self.round != mine:
                raise InvalidArgument(f"round {mine} was abandoned: round {self.round} started before its "
                                      "results were all taken (the server runs one round at a time)")
            if self.mode == "async" or not self._busy:  # sync: a wave once the last one is back
                for w in self._idle():
                    if not pending:
                        break
                    self._assign(w, pending.popleft(), command)
            if not self._busy:
                if pending:
                    raise WorkerFailed(f"no federated workers are left (lost: {self._lost_text()}); "
                                       f"clients {list(pending)} of round {self.round} were not done")
                return
            kind, a, value = self._next_outcome()
            if a is None or a.round != self.round:
                continue  # a worker lost while idle, or an answer from an abandoned round
            if kind == "result":
                yield value
            elif kind == "lost" and self.requeue:
                pending.appendleft(a.client)
            else:
                raise value

    # ---- FedBuff / FedAsync (buffered.py): the one entry into the buffered modes ---------------

    def stream(self, model):
        """Mode fedbuff or fedasync: a buffered.Stream handing clients out on `model` (the
        server's flat model, read at each send) across versions. FedAvgRounds uses it."""
        self._check_open()
        if self.mode not in buffered.MODES:
            raise InvalidArgument(f"stream is for the fedbuff and fedasync modes; this server's mode is {self.mode}")
        self._settle()
        if not self._live:
            raise WorkerFailed(f"no federated workers are left (lost: {self._lost_text()})")
        return buffered.Stream(self, model)

    # ---------------------------------------------------------------------------------------------

    def _idle(self):
        return [w for w in self.workers if w in self._live and w not in self._busy]

    def _assign(self, w, client, command):
        self._seq[w] += 1
        a = self._busy[w] = _Assignment(self.round, client, command, self._seq[w], time.monotonic())
        try:  # the worker is waiting for it, so this returns at once
            self._links.send_header(Header(command, self.round, client, seq=a.seq), w, self._links.down)
        except PyBridgeError as exc:
            self._events.put(("lost", w, exc))

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
            except Exception as exc:  # noqa: BLE001 - reported to the server's thread
                self._events.put(("lost", w, classify(exc)))
                return
            self._events.put(("message", w, h, payload, time.monotonic()))
            if h.command == TERMINATE:
                return

    def _next_outcome(self):
        """Wait for the next answer or loss among the busy workers: (kind, assignment, value)
        with kind "result" (value a Result), "failed" or "lost" (value the error)."""
        while True:
            w, due = min(self._busy.items(), key=lambda kv: kv[1].start)
            left = due.start + self.timeout - time.monotonic()
            try:
                event = self._events.get(timeout=max(left, 0.0))
            except queue.Empty:
                err = WorkerTimeout(f"federated worker rank {w} did not return client {due.client} "
                                    f"(round {due.round}) within {self.timeout:g} s", w, due.client)
                del self._busy[w]
                self._retire(w, err, stop=True)
                return "lost", due, err
            outcome = self._handle(event)
            if outcome is not None:
                return outcome

    def _handle(self, event):
        if event[0] == "lost":
            _, w, exc = event
            if w not in self._live:
                return None
            a = self._busy.pop(w, None)
            held = f" while it held client {a.client} (round {a.round})" if a else ""
            err = WorkerFailed(f"federated worker rank {w} was lost{held}: {exc}", w, a and a.client)
            err.__cause__ = exc
            self._retire(w, err)
            return "lost", a, err
        _, w, h, payload, arrived = event
        if h.command == TERMINATE:
            return None  # an acknowledgement: its listener has ended
        if w not in self._live:
            return None  # a late answer from a worker retired after a timeout
        a = self._busy.pop(w, None)
        if a is None or (h.round, h.client, h.seq) != (a.round, a.client, a.seq) \
                or h.command not in (a.command, FAILED):
            err = WorkerFailed(f"federated worker rank {w} sent an unexpected {h.name} message "
                               f"(round {h.round}, client {h.client}, seq {h.seq})", w, a and a.client)
            self._retire(w, err, stop=True)
            return "lost", a, err
        if h.command == FAILED:
            text = decode_message(payload) if payload is not None else ""
            return "failed", a, WorkerFailed(f"federated worker rank {w} failed on client {a.client} "
                                             f"(round {a.round}): {text}", w, a.client)
        if h.command == TRAIN and a.round == self.round and (h.length, h.dtype) != self._model:
            return "failed", a, WorkerFailed(
                f"federated worker rank {w} returned {h.length} elements of dtype code {h.dtype} for "
                f"client {a.client}; the model has {self._model[0]} of dtype code {self._model[1]}",
                w, a.client)
        if payload is None:
            payload = torch.empty(0, dtype=dtypes.BY_CODE[h.dtype], device=self._links.device)
        return "result", a, Result(h.command, h.round, h.client, w, h.samples, payload, arrived - a.start)

    def _retire(self, w, err, stop=False):
        """Stop using worker `w`. One still connected (`stop`: it timed out, or answered out
        of turn) gets a terminate, not waited for, so that it stops after its client instead
        of waiting for tasks, and its listener ends with the acknowledgement."""
        self._live.discard(w)
        self.lost[w] = err
        if stop:
            try:
                self._farewells.append(self._links.isend_header(Header(TERMINATE, self.round), w,
                                                                self._links.down))
            except PyBridgeError:
                pass  # its connection is gone too: nothing left to stop

    def _settle(self):
        """Take in the notices already queued, and wait for every client still out."""
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            self._handle(event)
        while self._busy:
            self._next_outcome()

    def _lost_text(self):
        return "; ".join(f"rank {w}: {e}" for w, e in sorted(self.lost.items())) or "none"

    # ---- shutdown ---------------------------------------------------------------------------

    def close(self, timeout=None):
        """Terminate the workers (after the clients still out are back) and stop the
        listeners, waiting `timeout` seconds at most (default: the server's timeout) for
        the acknowledgements, also from workers that timed out. A worker that is alive but
        never answers keeps its listener thread (a daemon) until its connection closes or
        the link timeout passes."""
        if self.closed:
            return
        timeout = self.timeout if timeout is None else positive_seconds("timeout", timeout)
        self.closed = True
        links = self._links
        deadline = time.monotonic() + timeout
        try:
            self._settle()
            for w in sorted(self._live):
                try:
                    links.send_header(Header(TERMINATE, self.round), w, links.down)
                except PyBridgeError as exc:
                    self._handle(("lost", w, exc))
        finally:
            # A listener ends with its worker's acknowledgement (or its connection).
            for t in self._listeners:
                t.join(max(deadline - time.monotonic(), 0.0))
            if not any(t.is_alive() for t in self._listeners):
                self._farewells = []
                links.close()

    def _check_open(self):
        if self.closed:
            raise Closed("the federated server was closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _client_list(clients):
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
