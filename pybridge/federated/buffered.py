"""Buffered asynchronous aggregation: FedBuff (Nguyen et al. 2022) and FedAsync (Xie et
al. 2019) as server modes, and the weighted sum every mode aggregates with.

In these modes there are no rounds for the workers: a worker that returns a result gets
its next client at once, on the newest model version (the server sends it that version
first if it holds an older one), and nobody waits for a straggler. The server's model
advances every K training results (FedBuff; K = 1 is FedAsync); a result computed on a
version tau steps older than the current one is weighted by s(tau) (staleness.py), and
one older than max_staleness versions is refused. FedAvgRounds drives it; Stream is the
hand-out part, UpdateBuffer the arithmetic.

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

import collections

import torch

from ..base.checks import integer
from ..errors import InvalidArgument
from .modes import BUFFERED as MODES  # noqa: F401  (buffered.MODES: the modes handled here)
from .protocol import EVALUATE, TRAIN
from .results import RoundResults, client_list
from .staleness import Staleness

REFUSED_RETRIES = 1  # with requeue, a client whose update was refused (NaN, Inf, norm) goes out once more
DEFAULT_BUFFER = 10  # FedBuff's K when none is given


class StaleUpdate(InvalidArgument):
    """A result computed on a model older than max_staleness versions: not aggregated."""

    def __init__(self, message, worker, client, staleness):
        super().__init__(message)
        self.worker, self.client, self.staleness = worker, client, staleness


class UpdateBuffer:
    """The weighted float64 sum of the training results since the last step (see the module
    docstring). `dp` is a strategies.CentralDP or None."""

    def __init__(self, numel, device, staleness=None, max_staleness=None, dp=None):
        self.numel = numel
        self.staleness = staleness or Staleness()
        self.max_staleness = None if max_staleness is None else integer("max_staleness", max_staleness, low=0)
        self.dp = dp
        self._sum = torch.zeros(numel, dtype=torch.float64, device=device)
        self._reset()

    def _reset(self):
        self._sum.zero_()
        self.samples = 0
        self.clients = []  # (worker, client, staleness, weight) per update in the buffer
        self.clipped = 0

    def __len__(self):
        return len(self.clients)

    def weight(self, samples, tau):
        """The update's weight in the sum: s(tau) * samples, or s(tau) under DP."""
        return self.staleness(tau) * (1 if self.dp is not None else samples)

    def add(self, result, tau=0):
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

    def take(self):
        """(g, record): the step's pseudo-gradient (float64) and what went into it; the buffer
        is then empty."""
        n = len(self.clients)
        if n == 0 or (self.dp is None and self.samples == 0):
            raise InvalidArgument("no samples to average this round (no results added, or all had 0 samples)")
        record = {"clients": n, "samples": self.samples, "staleness": [c[2] for c in self.clients],
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


class Stream:
    """Hands clients out through a Server in a buffered mode, across model versions.

    `model` is the server's flat model (FedAvgRounds.model), which the server sends to a
    worker holding an older version before its next client; advance() says it changed.
    Results come in completion order from next(), which returns None when nothing is left
    to hand out and a worker is idle: clients still out stay out, and their results come
    with later calls (applied late). Evaluations are handed out before training clients."""

    def __init__(self, server, model):
        self.server = server
        self.pending = {EVALUATE: collections.deque(), TRAIN: collections.deque()}
        self._refusals = collections.Counter()
        server._model = model  # the live model: the server sends it, as is, to workers behind
        server.round += 1  # the version numbers travel in the headers' round field

    @property
    def version(self):
        return self.server.round

    def advance(self):
        self.server.round += 1

    def add(self, clients, command):
        """A round: `clients` join the queue, and the server's `current` summary (metrics,
        samples, refusals) starts afresh for the results taken from now on."""
        self.pending[command].extend(client_list(clients))
        self.server.current = RoundResults(self.server.round, command)  # filled by _record, not iterated

    def _left(self):
        return [c for q in self.pending.values() for c in q]

    def next(self, wait=False):
        """The next Result, or None: with nothing left to hand out, as soon as a worker is
        idle, or (`wait`) once no client is out."""
        s = self.server
        while True:
            s._check_open()
            for w in s._idle():
                for command, queue in self.pending.items():
                    client = s._take(queue, w)  # the first this worker may hold (affinity)
                    if client is not None:
                        s._assign(w, client, command)  # sends the newest version first if need be
                        break
            left = self._left()
            if not left and (not s._busy or (s._idle() and not wait)):
                return None
            if not s._busy:
                raise s._stuck(left, s.round)
            kind, a, value = s._next_outcome()
            if a is None:
                continue  # a worker lost while idle, or a stalled one taken back
            if kind == "result":
                return _record(s.current, value)
            if kind == "refused":
                s.current.refused[a.client] = value
            if kind == "refused" and s.requeue and self._refusals[a.client] < REFUSED_RETRIES:
                self._refusals[a.client] += 1
                self.pending[a.command].appendleft(a.client)
            elif kind == "lost" and s.requeue:
                self.pending[a.command].appendleft(a.client)
            else:
                for queue in self.pending.values():  # an error ends the round, as in the round modes
                    queue.clear()
                raise value


def _record(rr, r):
    """Add Result r to the round summary rr (server.RoundResults), as its iterator does."""
    rr.clients.append(r.client)
    rr.samples += r.samples
    rr._metrics.add(r.samples, r.metrics)
    return r
