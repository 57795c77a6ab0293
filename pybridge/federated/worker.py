"""The worker side: receive a task (a client to train or evaluate on the round's model),
return its result. Two ways to drive it:

  pull:  task = worker.next_task(); ...; worker.submit(task, weights, samples)
         (what a C or Go worker needs: no callbacks into the caller)
  loop:  worker.serve(train, evaluate)  (Python: calls the functions for each task)

The worker holds the client data; the server sends only client ids.
"""

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch

from ..base import dtypes
from ..comm import world as _world
from ..comm.group import Group
from ..base.checks import integer
from ..errors import Closed, CommError, CorruptData, InvalidArgument
from . import metrics as _metrics
from . import uplink
from .protocol import DEFAULT_LINK_TIMEOUT, EVALUATE, FAILED, SERVER, TERMINATE, TRAIN, UPDATE, Header, Links, encode_message, flat


@dataclass
class Task:
    """A client to train (command TRAIN) or evaluate (EVALUATE) on the round's model.
    `model` is this task's own copy of the model (flat): train it in place if you like."""

    command: int
    round: int
    client: int
    seq: int
    model: torch.Tensor

    @property
    def evaluate(self) -> bool:
        return self.command == EVALUATE


class Worker:
    """A worker of a federated group: any rank but 0 (the server). Creating it is a
    collective with the server's Server() (both create the links).

    link_timeout (seconds) bounds how long the worker waits for its next task. Its results go
    to the server over its own TCP stream (uplink.py), connected here."""

    def __init__(self, group: Optional[Group] = None, *, link_timeout: float = DEFAULT_LINK_TIMEOUT) -> None:
        g = group or _world.current()
        if g.size < 2:
            raise InvalidArgument("a federated group needs a server (rank 0) and at least one worker")
        if g.rank == SERVER:
            raise InvalidArgument("rank 0 of a federated group is the server; create a Server there")
        self.rank = g.rank
        self._links = Links(g, link_timeout)
        try:
            self._up = uplink.connect(self._links.store, g.rank, g.timeout)
        except BaseException:
            self._links.close()
            raise
        self._up.settimeout(link_timeout)
        self._model: Optional[torch.Tensor] = None  # the current round's model, as received
        self.round = 0
        self._task: Optional[Task] = None  # the task handed out and not yet answered
        self.closed = False

    def next_task(self) -> Optional[Task]:
        """Block until the server hands out a client; returns a Task, or None once the server
        has terminated the federation (the worker is then closed)."""
        if self.closed:
            return None
        if self._task is not None:
            raise InvalidArgument(f"client {self._task.client} was not answered yet: "
                                  "submit() or fail() it before asking for the next task")
        links = self._links
        waiting = "while waiting for its next task"
        while True:
            h: Header = self._from_server(waiting, links.recv_header, SERVER, links.down)
            if h.command == UPDATE:
                self._from_server(waiting, self._receive_model, h)
            elif h.command == TERMINATE:
                try:
                    uplink.send_message(self._up, Header(TERMINATE, self.round).tensor().tolist(),
                                        _NOTHING, b"")
                except CommError:
                    pass  # the server does not wait for it
                self.close()
                return None
            elif h.command in (TRAIN, EVALUATE) and self._model is not None and h.round == self.round:
                self._task = Task(h.command, h.round, h.client, h.seq, self._model.clone())
                return self._task
            else:
                raise CorruptData(f"worker {self.rank} got an unexpected {h.name} message for round "
                                  f"{h.round} (its model is for round {self.round})")

    def _from_server(self, doing: str, call: Callable[..., Any], *args: Any) -> Any:
        """call(*args); a lost connection is said to be the server's (it died, or cut this
        worker off at close)."""
        try:
            return call(*args)
        except CommError as exc:
            err = type(exc)(f"federated worker {self.rank} lost the server (rank {SERVER}) {doing}: {exc}")
            raise err from exc

    def _receive_model(self, h: Header) -> None:
        dtype = dtypes.BY_CODE[h.dtype]
        if self._model is None or self._model.numel() != h.length or self._model.dtype != dtype:
            self._model = torch.empty(h.length, dtype=dtype, device=self._links.device)
        self._links.recv_payload(h, SERVER, self._links.down, out=self._model)
        self.round = h.round

    def submit(self, task: Task, result: torch.Tensor, samples: int,
               metrics: Optional[Mapping[str, float]] = None) -> None:
        """Answer `task`. TRAIN: `result` is the client's trained weights (same size and
        dtype as the model) and `samples` the number of examples trained on; the server
        receives the pseudo-gradient (round model - result). EVALUATE: `result` is any flat
        tensor of metrics, sent as is; `samples` the number of examples evaluated.
        `metrics`: a small dict of floats (loss, accuracy, ...) sent with the result; the
        server averages them over the round, weighted by samples."""
        self._send(task, *self._payload(task, result, samples, metrics))

    def fail(self, task: Task, message: object) -> None:
        """Tell the server that `task` could not be done (it raises, naming this worker)."""
        self._check_task(task)
        self._send(task, encode_message(str(message)).to(self._links.device), 0, FAILED, b"")

    def serve(self, train: Callable[..., Any], evaluate: Optional[Callable[..., Any]] = None) -> None:
        """Answer tasks until the server terminates: train(model, client) and
        evaluate(model, client) return (tensor, samples) or (tensor, samples, metrics) as
        submit() takes them. The round is passed too to a function that requires a third
        positional argument, train(model, client, round), or has a parameter named `round`
        (as a keyword); two-argument functions are called as before. An exception in them is reported
        to the server (fail()) and the loop goes on."""
        with_round = {fn: _takes_round(fn) for fn in (train, evaluate) if fn is not None}
        while (task := self.next_task()) is not None:
            fn = evaluate if task.evaluate else train
            try:
                if fn is None:
                    raise InvalidArgument(f"worker {self.rank} has no evaluate function")
                how = with_round[fn]
                value = fn(task.model, task.client, task.round) if how == "positional" else \
                    fn(task.model, task.client, round=task.round) if how == "keyword" else fn(task.model, task.client)
                payload = self._payload(task, *_answer(value))
            except Exception as exc:  # noqa: BLE001 - the server decides what a failed client means
                self.fail(task, f"{type(exc).__name__}: {exc}")
                continue
            self._send(task, *payload)

    def _check_task(self, task: Optional[Task]) -> None:
        if self.closed:
            raise Closed("the federated worker was terminated")
        if task is None or task is not self._task:
            raise InvalidArgument("that task is not this worker's open task (answer each task once)")

    def _payload(self, task: Task, result: Any, samples: int,
                 metrics: Optional[Mapping[str, float]] = None) -> tuple[torch.Tensor, int, int, bytes]:
        self._check_task(task)
        integer("samples", samples, low=0)
        wire = _metrics.encode(_metrics.check(metrics))
        result = flat(result, "result")
        if task.command == TRAIN:
            assert self._model is not None  # a task comes after its round's model
            if result.numel() != self._model.numel() or result.dtype != self._model.dtype:
                raise InvalidArgument(
                    f"trained weights must match the model ({self._model.numel()} x {self._model.dtype}); "
                    f"got {result.numel()} x {result.dtype}")
            result = self._model - result.to(self._model.device)  # the pseudo-gradient
        return result.to(self._links.device), samples, task.command, wire

    def _send(self, task: Task, payload: torch.Tensor, samples: int, command: int, metrics: bytes) -> None:
        self._from_server(f"while sending client {task.client}'s result (round {task.round})",
                          self._send_message, task, payload, samples, command, metrics)
        self._task = None

    def _send_message(self, task: Task, payload: torch.Tensor, samples: int, command: int, metrics: bytes) -> None:
        h = Header(command, task.round, task.client, samples, payload.numel(), dtypes.code(payload.dtype),
                   task.seq, len(metrics))
        uplink.send_message(self._up, h.tensor().tolist(), payload.detach().cpu(), metrics)

    def close(self) -> None:
        """Free the links. The server's terminate does it; call it to leave early."""
        if not self.closed:
            self.closed = True
            self._task = None
            self._up.close()
            self._links.close()


_NOTHING = torch.empty(0, dtype=torch.uint8)


def _takes_round(fn: Callable[..., Any]) -> Optional[str]:
    """How fn gets the round: "positional" when it requires a third positional argument,
    "keyword" when it has a parameter named `round`, else None (the older two-argument
    form; a third parameter with a default is left alone, it may mean something else)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None  # no signature to read (some builtins): the two-argument form
    required = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    if len(required) >= 3:
        return "positional"
    if any(p.name == "round" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params):
        return "keyword"
    return None


def _answer(value: Any) -> tuple[Any, ...]:
    """A train or evaluate function's return value as submit()'s (result, samples, metrics)."""
    if not isinstance(value, tuple) or len(value) not in (2, 3):
        raise InvalidArgument("a train or evaluate function returns (tensor, samples) or "
                              f"(tensor, samples, metrics), got {type(value).__name__}")
    return value
