"""bench/common.py's Ranks: a benchmark case that dies, raises or hangs is ended within its
bound (every rank killed) with a one-line CaseFailed, and the next case runs on fresh ranks."""

import os
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from common import CaseFailed, Ranks  # noqa: E402


def echo(rank, conn):
    conn.send(f"up {rank}")
    while (n := conn.recv()) is not None:
        conn.send(n * 10 + rank)


def rank1_aborts(rank, conn):
    """Rank 1 dies the way gloo does on a collective mismatch; rank 0 waits on it for ever."""
    conn.send("up")
    conn.recv()
    if rank == 1:
        os.write(2, b"terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
                    b"  what():  fake collective mismatch\n")
        os.abort()
    time.sleep(3600)


def rank1_hangs(rank, conn):
    conn.send("up")
    conn.recv()
    if rank == 0:
        conn.send("done")
    time.sleep(3600)


def rank0_raises(rank, conn):
    conn.send("up")
    conn.recv()
    if rank == 0:
        raise ValueError("no such bucket\nsecond line")
    time.sleep(3600)


def assert_gone(case):
    assert all(not proc.is_alive() for proc, _ in case.ranks)


# bound: the case's timeout; a dead rank must end the case long before it (a rank waiting
# on its dead peer would otherwise hold the run until then).
@pytest.mark.parametrize("target,words,bound", [
    (rank1_aborts, ["rank 1 was killed by SIGABRT", "what(): fake collective mismatch"], 60),
    (rank0_raises, ["rank 0 raised ValueError: no such bucket"], 60),
    (rank1_hangs, ["no answer from rank 1 within 3 s (hung)"], 3),
])
def test_a_failed_case_is_bounded_and_the_next_runs(target, words, bound):
    case = Ranks(target, 2, name="bad")
    try:
        assert case.ask(60) == ["up", "up"]
        t0 = time.monotonic()
        with pytest.raises(CaseFailed) as err:
            case.ask(bound, 1)
        took = time.monotonic() - t0
    finally:
        case.kill()
    why = str(err.value)
    assert "\n" not in why
    for w in words:
        assert w in why
    assert took < min(bound, 20) + 10
    assert_gone(case)

    # The run goes on: the next case gets fresh processes and a fresh port.
    good = Ranks(echo, 2, name="good")
    try:
        assert good.ask(60) == ["up 0", "up 1"]
        assert good.ask(30, 4) == [40, 41]
        good.close()
        assert_gone(good)
    finally:
        good.kill()
