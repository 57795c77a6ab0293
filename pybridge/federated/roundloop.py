"""The round modes' loop (async, sync): a round's clients handed out and its results
yielded as they come, driven through the server's hand-out seam only (server.py: check_open,
idle_workers, busy_workers, out, take_client, assign, next_outcome, retry_client,
unassignable), as the buffered modes' stream.py is, so refusal, requeue and affinity hold
the same in every mode. Server.run_round makes it.
"""

import collections
from typing import Iterator

from ..errors import InvalidArgument
from .results import HandOut, Outcome, Result


def results(server: HandOut, command: int, pending: "collections.deque[int]") -> Iterator[Result]:
    """Hand out `pending` (a deque of client ids) to `command` (TRAIN or EVALUATE) on the
    server's current round, and yield the round's Results as they come: in mode async a
    worker gets its next client at once, in mode sync clients go out in waves of one per
    worker, the next wave once the last one is back. A lost worker's or a refused update's
    client goes back to `pending` when server.retry_client says so; otherwise the failure
    is raised. Ends when every client has answered."""
    s = server
    mine = s.round
    refusals: collections.Counter[int] = collections.Counter()
    while True:
        s.check_open()
        if s.round != mine:
            raise InvalidArgument(f"round {mine} was abandoned: round {s.round} started before its "
                                  "results were all taken (the server runs one round at a time)")
        if s.mode == "async" or not s.out():  # sync: a wave once the last one is back
            for w in s.idle_workers():
                client = s.take_client(pending, w)
                if client is not None:
                    s.assign(w, client, command)
        if not s.out():
            if not pending:
                return
            if not s.busy_workers():  # nobody left to free up (a straggler of an earlier round would)
                raise s.unassignable(pending)
        outcome = s.next_outcome()
        a = outcome.assignment
        if a is None or a.round != mine:
            continue  # a worker lost while idle, taken back, or late from an abandoned round
        if outcome.kind == Outcome.RESULT:
            yield outcome.value
        elif s.retry_client(outcome, refusals):
            pending.appendleft(a.client)
        else:
            raise outcome.value
