"""Ending a join from another thread: init(), elastic training's init and reset.

A call on a live group is ended by aborting the group (Group.abort, group.py). A join has
no group to abort until it has formed one, and waits meanwhile on the store and its
peers: its wait loops (the store's host, the roster, elastic's rounds) call check(), and
abort() (C: pb_init_abort; Go: the context of Init, ElasticInit or ElasticState.Reset)
makes the next check raise Canceled and aborts the world the join formed, if any.

One join runs at a time in a process (init holds the groups' lock; elastic's reset runs
init inside itself, hence the depth). An abort with no join in progress does nothing: the
caller asks again if the join may not have begun yet (Go does, until the call returns).
"""

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol

from ..errors import Canceled


class Abortable(Protocol):
    """What a join forms (a Group): aborted with the join."""

    def abort(self, reason: str | None = None) -> None: ...


_lock = threading.Lock()
_depth = 0  # joins in progress (nested: an elastic reset's init)
_reason: str | None = None  # why the join in progress was aborted, once it was
_worlds: list[Abortable] = []  # groups the joins in progress formed: aborted with them


@contextlib.contextmanager
def joining() -> Iterator[None]:
    """The scope of a join: abort() ends it until the outermost one returns."""
    global _depth, _reason
    with _lock:
        if _depth == 0:
            _reason = None
            _worlds.clear()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _reason = None
                _worlds.clear()


def formed(group: Abortable) -> None:
    """The join in progress made `group`: aborting the join aborts it too (at once if the
    join was aborted already)."""
    with _lock:
        if _depth == 0:
            return
        _worlds.append(group)
        reason = _reason
    if reason is not None:
        group.abort(reason)


def abort(reason: str | None = None) -> bool:
    """End the join in progress, if any: its next check() raises Canceled and the worlds it
    formed are aborted. Returns whether a join was in progress."""
    global _reason
    with _lock:
        if _depth == 0:
            return False
        if _reason is None:
            _reason = str(reason) if reason else "aborted"
        reason, worlds = _reason, list(_worlds)
    for g in worlds:
        g.abort(reason)
    return True


def check(what: str) -> None:
    """Raise Canceled, naming `what`, when the join in progress was aborted."""
    reason = _reason
    if reason is not None and _depth > 0:
        raise Canceled(f"{what} was canceled: {reason}")
