"""The server side, client assignment: the links, the worker states, handing clients to
workers and collecting their results as they finish, and the round modes' loop (run_round).

The buffered modes' hand-out (stream.py) and the round loop both go through the hand-out
seam below (idle_workers, take_client, assign, next_outcome, retry_client, ...); the
aggregation of what comes back is rounds.py, buffered.py (UpdateBuffer) and aggregate.py.

Completion detection: one listener thread per worker blocks in a read of that worker's up
stream (uplink.py) and queues what arrives, after checking each header against the task the
worker holds and the model it was sent (a worker that breaks the protocol is retired); the server's own thread takes results from the
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
import warnings
from dataclasses import dataclass

import torch

from ..base import dtypes
from ..comm import world as _world
from ..comm.group import ABORT_POLL_SECONDS
from ..base.checks import integer, positive_seconds
from ..errors import (Closed, CommError, InvalidArgument, PyBridgeError, Timeout, UpdateRefused, WorkerFailed,
                      WorkerTimeout, classify)
from . import metrics as _metrics
from . import uplink
from .modes import BUFFERED as BUFFERED_MODES, MODES
from .results import Outcome, Result, RoundResults, client_list
from .integrity import max_norm_setting, refusal
from .stream import Stream
from .protocol import (DEFAULT_LINK_TIMEOUT, DEFAULT_MAX_SAMPLES, EVALUATE, FAILED, MAX_MESSAGE, MIN_EVALUATE_BYTES,
                       NAMES, SERVER, TERMINATE, TRAIN, UPDATE, Header, Links, decode_message, flat)

REFUSED_RETRIES = 1  # with requeue, a client whose update was refused is handed out once more
# How long close() lets the terminates it sent leave before it closes the links (see close()).
FAREWELL_SECONDS = 5.0


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

    def __init__(self, group=None, *, mode="async", timeout=None, requeue=False, max_norm=None,
                 affinity=None, link_timeout=DEFAULT_LINK_TIMEOUT, max_samples=None):
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
        self._max_norm = None
        self.set_max_norm(max_norm)
        self._max_samples = DEFAULT_MAX_SAMPLES
        if max_samples is not None:
            self.set_max_samples(max_samples)
        self.link_timeout = positive_seconds("link_timeout", link_timeout)
        self.workers = tuple(range(1, g.size))
        self.affinity = {}  # client -> frozenset of the worker ranks holding its data
        for client, holders in (affinity or {}).items():
            self.set_affinity(client, holders)
        self._links = Links(g, link_timeout)
        try:
            listener = uplink.Listener(self._links.store, self.workers)
            self.up_address = listener.address  # (host, port) the workers connected to; closed now
            self._conns = listener.accept(g.timeout)
        except BaseException:
            self._links.close()
            raise
        self._expect = {}  # worker rank -> the Assignment its next answer must answer (listeners read it)
        self._terminating = set()  # workers sent a terminate: their acknowledgement is expected
        self._live = set(self.workers)  # connected and taking clients (idle or busy)
        self.lost = {}  # worker rank -> the error that retired it (a stalled one's until it answers)
        self._gone = set()  # retired for good: connection lost or out of protocol
        self._stalled = {}  # worker rank -> the assignment it timed out on: taken back if it answers
        self._round = 0  # the model version: the round number (buffered modes: moves at every step)
        self._current = None  # the latest round's RoundResults
        self._model = None  # the current version's model, sent to workers that hold an older one
        self._has = {}  # worker rank -> the round of the model it holds
        self._busy = {}  # worker rank -> Assignment, of this round or an abandoned one
        self._seq = dict.fromkeys(self.workers, 0)
        self._events = queue.Queue()
        self._farewells = []  # (worker, terminate sent and not waited for)
        self.closed = False
        self._listeners = {w: threading.Thread(target=self._listen, args=(w,), daemon=True,
                                               name=f"pybridge-federated-{w}") for w in self._conns}
        for w in self.workers:
            if w not in self._conns:
                self._events.put(("lost", w, CommError(f"it did not connect its up link within {g.timeout:g} s")))
        for t in self._listeners.values():
            t.start()

    @property
    def round(self):
        """The current round, which is the model's version: what the headers' round field
        carries (in the buffered modes it moves at every model step)."""
        return self._round

    @property
    def current(self):
        """The latest round's RoundResults (None before the first): its clients, samples,
        metrics and refusals so far."""
        return self._current

    @property
    def max_norm(self):
        """The bound on a training update's L2 norm (None: no bound); see set_max_norm."""
        return self._max_norm

    def set_max_norm(self, max_norm):
        """Refuse, from the next result on, training updates whose L2 norm is larger than
        `max_norm`: a finite number >= 0, where 0 or None removes the bound. The one rule
        for Python, C (pb_fed_server_set_max_norm) and Go (WithMaxNorm)."""
        self._max_norm = max_norm_setting(max_norm)

    @property
    def max_samples(self):
        """The largest sample count a result may carry; see set_max_samples."""
        return self._max_samples

    def set_max_samples(self, max_samples):
        """Retire, from the next result on, a worker whose result claims more than
        `max_samples` samples (an integer >= 1; default 2**31). Sample counts weight the
        FedAvg sum, so set it to the largest client's dataset size: then no single update
        can outweigh the round by claiming more. The one rule for Python, C
        (pb_fed_server_set_max_samples) and Go (WithMaxSamples)."""
        self._max_samples = integer("max_samples", max_samples, low=1)

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
        self.check_open()
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
        self.new_version(model.clone())
        self._send_model(self.idle_workers())
        command = EVALUATE if evaluate else TRAIN
        rr = self._current = RoundResults(self.round, command, self._results(command, collections.deque(clients)))
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

    def _results(self, command, pending):
        """The round modes' loop: hand out `pending` through the seam below and yield the
        round's Results as they come (async: a worker's next client at once; sync: in waves)."""
        mine = self.round
        refusals = collections.Counter()
        while True:
            self.check_open()
            if self.round != mine:
                raise InvalidArgument(f"round {mine} was abandoned: round {self.round} started before its "
                                      "results were all taken (the server runs one round at a time)")
            if self.mode == "async" or not self._out():  # sync: a wave once the last one is back
                for w in self.idle_workers():
                    client = self.take_client(pending, w)
                    if client is not None:
                        self.assign(w, client, command)
            if not self._out():
                if not pending:
                    return
                if not self.busy_workers():  # nobody left to free up (a straggler of an earlier round would)
                    raise self.unassignable(pending)
            outcome = self.next_outcome()
            a = outcome.assignment
            if a is None or a.round != mine:
                continue  # a worker lost while idle, taken back, or late from an abandoned round
            if outcome.kind == Outcome.RESULT:
                yield outcome.value
            elif self.retry_client(outcome, refusals):
                pending.appendleft(a.client)
            else:
                raise outcome.value

    def _out(self):
        """Whether a client of the current round is out."""
        return any(a.round == self.round for a in self._busy.values())

    # ---- FedBuff / FedAsync (stream.py): the one entry into the buffered modes -----------------

    def stream(self, model):
        """Mode fedbuff or fedasync: a stream.Stream handing clients out on `model` (the
        server's flat model, read at each send) across versions. FedAvgRounds uses it."""
        self.check_open()
        if self.mode not in BUFFERED_MODES:
            raise InvalidArgument(f"stream is for the fedbuff and fedasync modes; this server's mode is {self.mode}")
        if model.device != self._links.device:  # it is sent as is, whenever a worker is behind
            raise InvalidArgument(f"in mode {self.mode} the model must be on the group's device "
                                  f"({self._links.device}), not {model.device}")
        self._drain()
        if not self._live:
            raise WorkerFailed(f"no federated workers are left (lost: {self._lost_text()})")
        return Stream(self, model)

    # ---- the hand-out seam: what run_round's loop and the buffered stream drive -----------------

    def check_open(self):
        """Raise Closed once the server was closed."""
        if self.closed:
            raise Closed("the federated server was closed")

    def new_version(self, model=None):
        """The model changed: the round (the model's version) moves on by one, and a worker
        holding an older version gets the model before its next client. `model` is the tensor
        to send from now on (sent as is, read at each send); None keeps the one there, changed
        in place. Returns the new version."""
        if model is not None:
            self._model = model
        self._round += 1
        return self._round

    def start_summary(self, command):
        """A fresh summary (RoundResults of `command` at the current version) for the results
        taken from now on: `current`. The caller records results in it (RoundResults.record)."""
        self._current = RoundResults(self.round, command)
        return self._current

    def idle_workers(self):
        """Live workers that hold no client, in rank order: those take clients now."""
        return [w for w in self.workers if w in self._live and w not in self._busy]

    def busy_workers(self):
        """Workers holding a client (of this round or version, or an earlier one), in rank order."""
        return sorted(self._busy)

    def take_client(self, pending, worker):
        """Take out of `pending` (a deque of client ids) the first client `worker` may hold
        (its affinity); None if there is none."""
        for i, c in enumerate(pending):
            if worker in self.affinity.get(c, (worker,)):
                del pending[i]
                return c
        return None

    def assign(self, worker, client, command):
        """Hand `client` to the idle `worker` to train or evaluate (`command`) on the current
        version, sending the model first if the worker holds an older one. A send that fails
        is a LOST outcome of next_outcome, not an error here."""
        if self._has.get(worker) != self.round:  # back from an earlier round's client, or taken back
            self._send_model([worker])
            if self._has.get(worker) != self.round:
                return self._assign_failed(worker, client, command)
        self._seq[worker] += 1
        a = self._busy[worker] = Assignment(self.round, client, command, self._seq[worker], time.monotonic(),
                                            self._model.numel(), dtypes.code(self._model.dtype))
        self._expect[worker] = a  # before the header goes out: the answer cannot come sooner
        try:  # the worker is waiting for it, so this returns at once
            self._links.send_header(Header(command, self.round, client, seq=a.seq), worker, self._links.down)
        except PyBridgeError as exc:
            self._events.put(("lost", worker, exc))

    def next_outcome(self):
        """Wait for the next answer or loss among the busy workers (at least one must be
        busy): an Outcome of kind RESULT, FAILED, REFUSED, LOST or BACK (results.py). A
        worker past its client's timeout is stalled here (LOST, with a WorkerTimeout)."""
        while True:
            w, due = min(self._busy.items(), key=lambda kv: kv[1].start)
            left = due.start + self.timeout - time.monotonic()
            try:  # in slices: an aborted group (Group.abort) ends the wait, which no socket does
                event = self._events.get(timeout=min(max(left, 0.0), ABORT_POLL_SECONDS))
            except queue.Empty:
                self._links.group.check_aborted("the federated server's wait for a result")
                if left > ABORT_POLL_SECONDS:
                    continue
                return self._stall(w, due)
            outcome = self._handle(event)
            if outcome is not None:
                return outcome

    def retry_client(self, outcome, refusals):
        """Whether a failed outcome's client goes back to be handed out again. With requeue:
        a lost worker's client always, a refused update's client REFUSED_RETRIES times
        (`refusals`: a Counter per client that the caller keeps for its round); never a
        reported failure. A refusal is noted in current.refused either way."""
        kind, a, value = outcome
        if kind == Outcome.REFUSED:
            self._current.refused[a.client] = value
            if self.requeue and refusals[a.client] < REFUSED_RETRIES:
                refusals[a.client] += 1
                return True
            return False
        return kind == Outcome.LOST and self.requeue

    def unassignable(self, pending):
        """The error for clients `pending` that no worker left can take (the caller raises it)."""
        if self._live:  # live workers, but none holds these clients' data
            held = "; ".join(f"client {c}: workers {sorted(self.affinity[c])}" for c in pending)
            return WorkerFailed(f"clients {list(pending)} of round {self.round} can go only to workers that are "
                                f"lost ({held}; lost: {self._lost_text()})")
        return WorkerFailed(f"no federated workers are left (lost: {self._lost_text()}); "
                            f"clients {list(pending)} of round {self.round} were not done")

    # ---------------------------------------------------------------------------------------------

    def _assign_failed(self, w, client, command):
        """The model could not reach `w` (its loss is queued): hold the client as out, so
        that handling the loss gives it back (requeue) or names it."""
        self._busy[w] = Assignment(self.round, client, command, self._seq[w], time.monotonic())

    # ---- events from the listeners ------------------------------------------------------------

    def _listen(self, w):
        """Read everything worker `w` sends on its up stream, in order, until its terminate
        acknowledgement or its end. Each header is checked (_check) before anything more is
        read or allocated; a worker that breaks the protocol is reported ("retire") and its
        stream closed, dropping what it sent."""
        conn = self._conns[w]
        if self._links.device.type == "cuda":
            torch.cuda.set_device(self._links.device)  # the current device is per thread
        answered = 0  # the seq of the last task it answered
        try:
            while True:
                fields = conn.read_header(self.link_timeout, self.timeout)
                h = Header(*fields)
                self._check(w, h, answered)
                what = f"{NAMES[h.command]} message (round {h.round}, client {h.client})"
                payload = conn.read_tensor(h.length, h.dtype, self.timeout, f"its {what}'s payload") \
                    if h.length else None
                text = conn.read_bytes(h.metrics, self.timeout, f"its {what}'s metrics")
                end = conn.read_bytes(len(uplink.TRAILER), self.timeout, f"its {what}'s end mark")
                if end != uplink.TRAILER:
                    raise uplink.Misbehaved(f"its {what} did not end where its header said (more bytes "
                                            f"than announced, or fewer): {end!r} instead of the end mark")
                try:
                    metrics = _metrics.decode(text)
                except Exception as exc:  # noqa: BLE001 - CorruptData: named, the worker retired
                    raise uplink.Misbehaved(f"its {what} has bad metrics: {exc}") from None
                if payload is not None and payload.device != self._links.device:
                    payload = payload.to(self._links.device)
                if h.command != TERMINATE:
                    answered = h.seq
                self._events.put(("message", w, h, payload, metrics, time.monotonic()))
                if h.command == TERMINATE:
                    return
        except uplink.Misbehaved as exc:
            self._events.put(("retire", w, str(exc)))
        except EOFError:
            self._events.put(("lost", w, CommError(f"worker rank {w} closed its up link")))
        except Timeout as exc:
            self._events.put(("lost", w, Timeout(f"worker rank {w} sent nothing: {exc}")))
        except Exception as exc:  # noqa: BLE001 - reported to the server's thread
            self._events.put(("lost", w, classify(exc)))
        finally:
            conn.close()

    def _check(self, w, h, answered):
        """Raise uplink.Misbehaved unless header `h` from worker `w` is one the server
        expects: the acknowledgement of a terminate it was sent, or the answer to its open
        task (round, client, seq; a TRAIN result of the model's exact size and dtype,
        an EVALUATE payload at most the model's bytes or MIN_EVALUATE_BYTES, a FAILED text of
        at most MAX_MESSAGE bytes) with a sample count in [0, max_samples] and metrics of at
        most metrics.MAX_BYTES. Checked before any byte of the payload is read or allocated."""
        def bad(why):
            return uplink.Misbehaved(f"its header (command {h.command}, round {h.round}, client {h.client}, seq "
                                     f"{h.seq}, samples {h.samples}, length {h.length}, dtype code {h.dtype}, "
                                     f"metrics {h.metrics}) {why}")
        if h.command not in NAMES or h.command == UPDATE:
            raise bad(f"has an unknown command {h.command}")
        if not 0 <= h.metrics <= _metrics.MAX_BYTES:
            raise bad(f"announces {h.metrics} bytes of metrics (at most {_metrics.MAX_BYTES})")
        if not 0 <= h.samples <= self._max_samples:
            raise bad(f"claims {h.samples} samples (at most max_samples = {self._max_samples})")
        if h.command == TERMINATE:
            if w not in self._terminating:
                raise bad("acknowledges a terminate it was not sent")
            if h.length or h.metrics:
                raise bad("is a terminate acknowledgement with a payload")
            return
        a = self._expect.get(w)
        if a is None or a.seq <= answered:
            raise bad("answers no task (it holds none)")
        if (h.round, h.client, h.seq) != (a.round, a.client, a.seq) or h.command not in (a.command, FAILED):
            raise bad(f"does not answer its task ({NAMES[a.command]} client {a.client}, round {a.round}, "
                      f"seq {a.seq})")
        if h.dtype not in dtypes.BY_CODE:
            raise bad(f"has an unknown dtype code {h.dtype}")
        size = dtypes.BY_CODE[h.dtype].itemsize
        if h.command == TRAIN and (h.length, h.dtype) != (a.numel, a.dtype):
            raise bad(f"announces an update of {h.length} elements of dtype code {h.dtype}; the model it was "
                      f"sent has {a.numel} of dtype code {a.dtype}")
        if h.command == EVALUATE:
            limit = max(a.numel * dtypes.BY_CODE[a.dtype].itemsize, MIN_EVALUATE_BYTES)
            if not 0 <= h.length <= limit // size:
                raise bad(f"announces an evaluation of {h.length} elements (at most {limit} bytes)")
        if h.command == FAILED and (h.dtype != dtypes.UINT8 or not 0 <= h.length <= MAX_MESSAGE):
            raise bad(f"announces a failure text of {h.length} elements of dtype code {h.dtype} "
                      f"(at most {MAX_MESSAGE} bytes, dtype code {dtypes.UINT8})")

    def _stall(self, w, a):
        """`w` held its client past the timeout: stop giving it clients, but keep listening,
        so that it is taken back once it answers (its late result is dropped)."""
        err = WorkerTimeout(f"federated worker rank {w} did not return client {a.client} (round {a.round}) "
                            f"within {self.timeout:g} s", w, a.client, a.round)
        del self._busy[w]
        self._live.discard(w)
        self._stalled[w] = a
        self.lost[w] = err
        return Outcome(Outcome.LOST, a, err)

    def _handle(self, event):
        if event[0] == "retire":
            return self._retire_misbehaved(*event[1:])
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
            return Outcome(Outcome.LOST, a, err)
        _, w, h, payload, metrics, arrived = event
        if h.command == TERMINATE or w in self._gone:
            return None  # an acknowledgement (its listener has ended), or a retired worker's
        if w in self._stalled:
            a = self._stalled.pop(w)
            if _answers(h, a):
                self._live.add(w)
                del self.lost[w]
                return Outcome(Outcome.BACK, None, None)
            return self._out_of_turn(w, h, None)
        a = self._busy.pop(w, None)
        if a is None or not _answers(h, a):
            return self._out_of_turn(w, h, a)
        if h.command == FAILED:
            text = decode_message(payload) if payload is not None else ""
            return Outcome(Outcome.FAILED, a, WorkerFailed(
                f"federated worker rank {w} failed on client {a.client} (round {a.round}): {text}",
                w, a.client, a.round))
        if a.round != self.round and self.mode not in BUFFERED_MODES:  # FedBuff / FedAsync apply late ones
            return Outcome(Outcome.RESULT, a, None)  # late, from an abandoned round: dropped by the caller
        if h.command == TRAIN:
            if (h.length, h.dtype) != (self._model.numel(), dtypes.code(self._model.dtype)):
                return Outcome(Outcome.FAILED, a, WorkerFailed(
                    f"federated worker rank {w} returned {h.length} elements of dtype code {h.dtype} for "
                    f"client {a.client} (round {a.round}); the model has {self._model.numel()} of dtype "
                    f"code {dtypes.code(self._model.dtype)}", w, a.client, a.round))
            why = refusal(payload, self._max_norm)
            if why is not None:
                return Outcome(Outcome.REFUSED, a, UpdateRefused(
                    f"federated worker rank {w} returned client {a.client}'s update for round {a.round}, "
                    f"refused: {why}", w, a.client, a.round))
        if payload is None:
            payload = torch.empty(0, dtype=dtypes.BY_CODE[h.dtype], device=self._links.device)
        return Outcome(Outcome.RESULT, a, Result(h.command, h.round, h.client, w, h.samples, payload,
                                                 arrived - a.start, metrics))

    def _retire_misbehaved(self, w, why):
        """Worker `w` broke the protocol (`why`): retire it, dropping what it sent."""
        if w in self._gone:
            return None
        a = self._busy.pop(w, None)
        held = a or self._stalled.pop(w, None) or self._expect.get(w)
        where = f" (client {held.client}, round {held.round})" if held else ""
        err = WorkerFailed(f"federated worker rank {w} was retired{where}: {why}; what it sent was dropped",
                           w, held and held.client, held and held.round)
        warnings.warn(str(err), RuntimeWarning, stacklevel=2)
        if self._current is not None:
            self._current.retired[w] = err
        self._retire(w, err, stop=True)
        return Outcome(Outcome.LOST, a, err)

    def _out_of_turn(self, w, h, a):
        err = WorkerFailed(f"federated worker rank {w} sent an unexpected {h.name} message "
                           f"(round {h.round}, client {h.client}, seq {h.seq})", w, a and a.client,
                           a and a.round)
        self._retire(w, err, stop=True)
        return Outcome(Outcome.LOST, a, err)

    def _retire(self, w, err, stop=False):
        """Stop using worker `w` for good. One still connected (`stop`: it answered out of
        turn) gets a terminate, not waited for, so that it stops instead of waiting for
        tasks, and its listener ends with the acknowledgement."""
        self._live.discard(w)
        self._gone.add(w)
        self.lost[w] = err
        if stop:
            self._terminating.add(w)
            try:
                self._farewells.append((w, self._links.isend_header(Header(TERMINATE, self.round), w,
                                                                    self._links.down)))
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
        thread; such a worker gets an error naming the lost server (rank 0). The terminates
        sent to the others are given up to FAREWELL_SECONDS to leave before anyone is cut off
        (a cut closes every connection of the link), and retired workers' listeners as long
        to end. After the group was aborted (Group.abort) nobody is waited for."""
        if self.closed:
            return
        if timeout is not None:
            timeout = positive_seconds("timeout", timeout)
        self.closed = True
        links = self._links
        aborted = links.group.aborted is not None  # its connections are shut: nobody is waited for
        if aborted:
            timeout = 0.0
        now = time.monotonic()
        try:
            self._drain()
            deadline = {}
            for w in sorted(self._live | set(self._stalled)):
                a = self._busy.get(w) or self._stalled.get(w)
                deadline[w] = now + timeout if timeout is not None else \
                    (a.start + self.timeout if a else now + self.timeout)
                self._terminating.add(w)
                try:  # not waited for: a busy worker takes it after its client
                    self._farewells.append((w, links.isend_header(Header(TERMINATE, self.round), w, links.down)))
                except PyBridgeError as exc:
                    self._handle(("lost", w, exc))
            for w, t in self._listeners.items():  # a listener ends with its worker's acknowledgement
                t.join(max(deadline.get(w, now) - time.monotonic(), 0.0))  # retired ones: below
        finally:
            # Workers still busy past their deadline are cut off; a cut closes every
            # connection of the down link, so the terminates of the others leave first.
            stuck = {w for w, t in self._listeners.items() if t.is_alive() and w not in self._gone}
            until = time.monotonic() + (0.0 if aborted else FAREWELL_SECONDS)
            self._send_farewells(until, skip=stuck)
            for w, t in self._listeners.items():
                if w not in stuck:  # a retired worker's listener ends on its own, or with its acknowledgement
                    t.join(max(until - time.monotonic(), 0.0))
            for w, t in self._listeners.items():
                if t.is_alive():
                    self._conns[w].shutdown()  # its listener's read ends at once
                    if w in stuck:
                        links.cut(w)  # and the worker's wait for a task on the down links
            for t in self._listeners.values():
                t.join(5.0)
            links.close()

    def _send_farewells(self, until, skip):
        """Let the terminates sent (and not waited for) leave, until `until`, except those to
        the workers in `skip`. Gloo sends a message only once its receiver has posted the
        receive: a retired worker still busy with its last answer had not, and closing the
        links (or cutting another worker) dropped its terminate, so it failed with "lost the
        server" instead of stopping (seen in the suite; tests/test_federated.py makes it
        happen). Bounded: workers that never receive cost close() FAREWELL_SECONDS at most."""
        for w, work in self._farewells:
            if w in skip:
                continue
            try:
                work.wait(max(until - time.monotonic(), 0.001))
            except PyBridgeError:
                pass  # that worker's connection is gone, or it never received: it is cut off
        self._farewells = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _answers(h, a):
    """Whether header `h` answers assignment `a` (its result, or its reported failure)."""
    return (h.round, h.client, h.seq) == (a.round, a.client, a.seq) and h.command in (a.command, FAILED)
