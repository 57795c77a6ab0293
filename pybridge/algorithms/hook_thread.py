"""One thread per hook state that runs the hook's collectives in the order they were queued.

Hooks whose bucket takes several dependent collectives (gossip: node average, exchange,
broadcast; hierarchical: node sum, leaders' allreduce, broadcast) run them here: queued
in bucket order on every rank, they go out in the same order everywhere, the caller
(backward) does not wait, and the hook can be declared eager. The groups the thread
uses must be the state's own: collectives on one group from two threads could interleave
differently on each rank.
"""

import queue
import threading
from typing import Callable, Optional, TypeVar

import torch

_T = TypeVar("_T")


class HookThread:
    """A thread that runs submitted work in order, each result a torch future."""

    def __init__(self, name: str) -> None:
        self._jobs: "queue.Queue[Optional[tuple[torch.futures.Future[object], Callable[[], object]]]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], _T]) -> "torch.futures.Future[_T]":
        """A torch.futures.Future of work(), which runs after everything submitted before."""
        fut: torch.futures.Future[_T] = torch.futures.Future()
        self._jobs.put((fut, work))  # type: ignore[arg-type]  # (one queue for every result type)
        return fut

    def is_alive(self) -> bool:
        """Whether the thread still runs (close() ends it)."""
        return self._thread.is_alive()

    def close(self, timeout: float = 30) -> None:
        """Finish the queued work (bounded) and stop the thread; a second call is a no-op."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fut, work = job
            try:
                fut.set_result(work())
            except Exception as exc:  # noqa: BLE001 - handed to whoever waits on the future
                fut.set_exception(exc)
