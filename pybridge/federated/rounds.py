"""FedAvg rounds over a flat model, run by the server: the one implementation behind the C
ABI's and Go's federated server, usable from Python too.

The caller's model buffer is read when a round starts and written only by `aggregate`, so
it may change (or, from C, go away) in between: the rounds keep their own copy of the
model, which the server strategy (strategies.py: FedAvg's SGD by default, FedAdam,
FedYogi, FedAdagrad) updates. The results are summed by a buffered.UpdateBuffer (float64,
with central DP's clipping and noise when `dp` is given). In the buffered modes (a Server
with mode "fedbuff" or "fedasync", handing clients out through a stream.Stream) the model
steps by itself every `buffer_size` training results, and a round is the clients given to
one `start`.
"""

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional, Union

import torch

from ..base.checks import integer, positive_finite
from ..errors import InvalidArgument
from . import buffered
from .modes import BUFFERED
from .protocol import EVALUATE, TRAIN, flat
from .results import Result, RoundResults, client_list
from .staleness import Staleness, parse as parse_staleness
from ..base.registry import provides
from .strategies import CentralDP, ServerSGD, Strategy

if TYPE_CHECKING:  # the server imports nothing of this module; kept lazy as before
    from .server import Server
    from .stream import Stream


class FedAvgRounds:
    """FedAvg rounds driven through `server` (a Server, which this object then owns: close()
    closes it).

        rounds = FedAvgRounds(Server(g, requeue=True))
        for r in range(100):
            rounds.start(clients, model)           # copies model
            for result in rounds:                  # completion order; TRAIN ones are summed
                log(result)
            rounds.aggregate(lr=1.0, out=model)    # the new model, written into `model`

    or `rounds.train_round(clients, model, lr=1.0)` for all three steps. Use it from one thread.

    strategy: a strategies.Strategy, such as a ServerOptimizer (default ServerSGD(eta=1.0):
    plain FedAvg) or strategies.build(name) of a registered one.
    dp: a strategies.CentralDP (clip each client's delta, add Gaussian noise per step).
    buffer_size, staleness, max_staleness: the buffered modes' K (default 10 for fedbuff,
    1 for fedasync), staleness function (a staleness.Staleness or a string such as
    "polynomial:0.5"; default constant) and the oldest update accepted, in versions
    (default: any).
    history: one dict per model step (version, lr, clients, samples, staleness, weights,
    the strategy's settings and DP's clip_norm, noise_multiplier, noise_std, clipped);
    refused: the buffered.StaleUpdate errors of the results refused as too stale.
    """

    def __init__(self, server: "Server", *, strategy: Optional[Strategy] = None, dp: Optional[CentralDP] = None,
                 buffer_size: Optional[int] = None, staleness: Union[Staleness, str, None] = None,
                 max_staleness: Optional[int] = None) -> None:
        self.server = server
        self.mode = getattr(server, "mode", "async")
        self.buffered = self.mode in BUFFERED
        if strategy is not None:
            provides(f"strategy {strategy!r}", strategy, Strategy)
        self.strategy: Strategy = strategy if strategy is not None else ServerSGD()
        self.dp = dp
        if not self.buffered and (buffer_size, staleness, max_staleness) != (None, None, None):
            raise InvalidArgument(f"buffer_size, staleness and max_staleness are for the fedbuff and fedasync "
                                  f"modes; this server's mode is {self.mode!r}")
        if self.mode == "fedasync" and buffer_size not in (None, 1):
            raise InvalidArgument(f"fedasync steps at every result (buffer_size 1), got buffer_size {buffer_size}")
        self.buffer_size = integer("buffer_size", buffered.DEFAULT_BUFFER if buffer_size is None
                                   else buffer_size, low=1) if self.mode != "fedasync" else 1
        self.staleness = parse_staleness(staleness)
        self.max_staleness = None if max_staleness is None else integer("max_staleness", max_staleness, low=0)
        self.model: Optional[torch.Tensor] = None  # the server's flat copy of the model (what the strategy updates)
        self.history: list[dict[str, Any]] = []
        self.refused: list[buffered.StaleUpdate] = []
        self._results: Optional[RoundResults] = None  # the current round's iterator (round modes)
        self._stream: Optional["Stream"] = None  # the buffered modes' hand-out across versions
        self._buf: Optional[buffered.UpdateBuffer] = None  # the training results summed since the last step
        self._aggregated = 0  # clients stepped since the last aggregate (buffered modes)
        self._draining = False
        self._ended = False  # a buffered round ended by an error
        self._failed: Optional[Exception] = None  # the round-mode round's error (its sum is not applied)

    @property
    def started(self) -> bool:
        """Whether a round was started (its results may all be taken)."""
        return self._buf is not None

    @property
    def version(self) -> int:
        """The model's version: the server's round number (in the buffered modes it moves
        at every step)."""
        version: int = self.server.round
        return version

    def start(self, clients: Iterable[int], model: torch.Tensor, *, evaluate: bool = False) -> None:
        """Start a round on a copy of `model` (a floating-point tensor, flattened): train
        `clients` (or evaluate them, `evaluate=True`). In the round modes an unfinished round
        is dropped. In the buffered modes the clients join the queue of those to hand out,
        clients still out stay out, and `model` becomes a new version only if it differs
        from the server's (pass back what aggregate wrote)."""
        m = flat(model, "model")
        if not m.dtype.is_floating_point:
            raise InvalidArgument(f"the model must have a floating-point dtype, got {m.dtype}")
        own = self.model
        fresh = own is None or own.numel() != m.numel() or own.dtype != m.dtype or own.device != m.device
        if self.buffered and self._stream is not None:
            assert own is not None  # the stream hands out this model
            if fresh:
                raise InvalidArgument(f"the model must keep its size, dtype and device between the rounds of "
                                      f"mode {self.mode} ({own.numel()} x {own.dtype})")
            ids = client_list(clients)  # checked before the model changes
            if not torch.equal(own, m):
                own.copy_(m)
                self._stream.advance()
            self._stream.add(ids, EVALUATE if evaluate else TRAIN)  # its summary starts at the new version
            self._ended = False
            return
        if fresh or own is None:
            own = self.model = torch.empty(m.numel(), dtype=m.dtype, device=m.device)
        own.copy_(m)
        self._results = self._buf = None  # an earlier round's are of no use now, even if this start fails
        self._failed = None
        if self.buffered:
            stream = self.server.stream(own)
            stream.add(clients, EVALUATE if evaluate else TRAIN)
            self._stream, self._ended = stream, False
        else:
            self._results = self.server.run_round(clients, own, evaluate=evaluate)
        self._buf = buffered.UpdateBuffer(own.numel(), own.device, self.staleness,
                                          self.max_staleness, self.dp)

    def next_result(self) -> Optional[Result]:
        """The round's next Result in completion order (a TRAIN one is added to the sum; in
        the buffered modes the model steps when the buffer is full), or None once the round
        is over. A worker's failure raises and ends the round. A buffered-mode result too
        stale is returned but not aggregated (it is added to `refused`)."""
        if self._buf is None:
            raise InvalidArgument("no round was started: call start first")
        if not self.buffered:
            results = self._results
            assert results is not None  # run_round gave it before the sum was made
            try:
                r = next(results, None)
            except Exception as exc:
                self._failed = exc  # the round is over: its partial sum must not be applied
                raise
            if r is not None and r.command == TRAIN:
                self._buf.add(r)
            return r
        if self._ended:
            return None
        assert self._stream is not None  # a buffered round's start made it
        try:
            taken: Optional[Result] = self._stream.next(wait=self._draining)
        except Exception:
            self._ended = True  # until the next start, as a round-mode round that raised
            raise
        if taken is not None and taken.command == TRAIN:
            try:
                self._buf.add(taken, self.version - taken.round)
            except buffered.StaleUpdate as exc:
                self.refused.append(exc)
                return taken
            if len(self._buf) >= self.buffer_size:
                self._aggregated += self._step(None)
        return taken

    def __iter__(self) -> Iterator[Result]:
        return iter(self.next_result, None)

    def _step(self, lr: Optional[float]) -> int:
        assert self._buf is not None and self.model is not None  # a started round
        g, record = self._buf.take()
        lr = self.strategy.eta if lr is None else lr
        self.strategy.step(self.model, g.to(self.model.device), lr)
        if self._stream is not None:
            self._stream.advance()
        self.history.append({"version": self.version, "lr": lr, **record, **self.strategy.settings()})
        clients: int = record["clients"]
        return clients

    def aggregate(self, lr: Optional[float] = None, out: Optional[torch.Tensor] = None) -> int:
        """Round modes: one step of the strategy over the TRAIN results taken this round at
        server learning rate `lr` (default: the strategy's eta; 1.0 for plain FedAvg), then
        the model is copied into `out` (a tensor of the model's size and dtype) if given.
        Returns the number of clients aggregated. Refused when no training result was taken
        since the round started (or since the last call).
        Buffered modes: the model steps by itself; this copies it into `out` and returns the
        clients stepped since the last call (possibly 0). `lr`, if given, becomes the
        strategy's eta for the steps to come."""
        if self._buf is None:
            raise InvalidArgument("no round was started: call start first")
        model = self.model
        assert model is not None  # a started round's
        if lr is not None:
            lr = positive_finite("lr", lr)
        if out is not None and not isinstance(out, torch.Tensor):
            raise InvalidArgument(f"out must be a torch tensor, got {type(out).__name__}")
        if out is not None and (out.numel() != model.numel() or out.dtype != model.dtype):
            raise InvalidArgument(f"the model to write must match the round's model ({model.numel()} x "
                                  f"{model.dtype}); got {out.numel()} x {out.dtype}")
        if self.buffered:
            if lr is not None:
                self.strategy.eta = lr
            count, self._aggregated = self._aggregated, 0
        elif getattr(self, "_failed", None) is not None:
            raise InvalidArgument(f"this round failed ({self._failed}); its partial sum is not applied: "
                                  "start the next round")
        else:
            count = self._step(lr)
        if out is not None:
            out.detach().copy_(model.view(out.shape))
        return count

    def drain(self) -> Iterator[Result]:
        """Buffered modes: the results of every client still out, in completion order, added
        (and stepped) as next_result does; what the last round's stragglers send."""
        if not self.buffered or self._buf is None:
            raise InvalidArgument("drain is for a started round of the fedbuff and fedasync modes")
        self._draining, self._ended = True, False
        try:
            while (r := self.next_result()) is not None:
                yield r
        finally:
            self._draining = False

    def flush(self) -> int:
        """Buffered modes: step now over the results in the buffer (fewer than buffer_size).
        Returns the number of clients stepped (0 with an empty buffer)."""
        if not self.buffered or self._buf is None:
            raise InvalidArgument("flush is for a started round of the fedbuff and fedasync modes")
        if not len(self._buf):
            return 0
        n = self._step(None)
        self._aggregated += n
        return n

    def train_round(self, clients: Iterable[int], model: torch.Tensor, lr: Optional[float] = None) -> int:
        """One whole training round: start, take every result, aggregate into `model` (in
        place). Returns the number of clients aggregated."""
        self.start(clients, model)
        for _ in self:
            pass
        return self.aggregate(lr, out=model)

    def close(self) -> None:
        """Drop the round and close the server (terminating the workers)."""
        self._results = self._buf = self._stream = None
        self.server.close()

    def __enter__(self) -> "FedAvgRounds":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
