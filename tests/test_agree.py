"""The shared argument checks (checks.integer, checks.index) and the one cross-rank
comparison (agree.check) every "all ranks must pass the same" check uses."""

import numpy as np
import pytest

from pybridge.base import agree
from pybridge.base import checks
from pybridge.errors import InvalidArgument


@pytest.mark.parametrize("kwargs, value, words", [
    ({}, True, "n must be an integer, got True"),
    ({}, 1.0, "n must be an integer, got 1.0"),
    ({"low": 0}, -1, "n must be a non-negative integer, got -1"),
    ({"low": 1}, 0, "n must be a positive integer, got 0"),
    ({"low": 2}, 1, "n must be an integer >= 2, got 1"),
    ({"low": 0, "high": 3}, 4, "n must be an integer in [0, 3], got 4"),
    ({"low": 0, "expected": "at least 0 (a count)"}, -2, "n must be at least 0 (a count), got -2"),
])
def test_integer_refuses_with_one_wording(kwargs, value, words):
    with pytest.raises(InvalidArgument) as err:
        checks.integer("n", value, **kwargs)
    assert str(err.value) == words


def test_integer_accepts_numpy_integers_as_int():
    got = checks.integer("n", np.int64(5), low=0, high=5)
    assert got == 5 and type(got) is int
    assert checks.integer("n", -7) == -7


def test_index():
    assert checks.index("rank", 1, 2, "a group of size 2") == 1
    assert type(checks.index("rank", np.int32(0), 2, "x")) is int
    for bad in (2, -1, True, "0", None):
        with pytest.raises(InvalidArgument, match=r"^rank .* is out of range for a group of size 2$"):
            checks.index("rank", bad, 2, "a group of size 2")


def _message(*args, **kwargs):
    with pytest.raises(InvalidArgument) as err:
        agree.check(*args, **kwargs)
    return str(err.value)


def test_check_passes_when_every_row_is_the_same():
    agree.check("x", [(1, 2)] * 3)
    agree.check("x", {0: "a", 3: "a"})
    agree.check("x", [])


def test_check_names_ranks_in_order_and_the_fields_that_differ_from_the_majority():
    msg = _message("op: ranks disagree", [(1, 2), (1, 3), (1, 2), (0, 3)], fields=("a", "b"),
                   describe=lambda r: f"passed {r[0]}/{r[1]}", hint=". Fix it")
    assert msg == ("op: ranks disagree: ranks [0, 2] passed 1/2; rank 1 passed 1/3 (b differs); "
                   "rank 3 passed 0/3 (a, b differs). Fix it")


def test_check_takes_the_lowest_ranks_row_as_the_reference_on_a_tie():
    msg = _message("w", [(5, 1), (6, 1)], fields=("size", "mode"))
    assert msg == "w: rank 0 (5, 1); rank 1 (6, 1) (size differs)"
    msg = _message("w", {1: 3, 4: 2}, describe=lambda v: f"world size {v}")  # ranks heard so far
    assert msg == "w: rank 1 world size 3; rank 4 world size 2"


def test_check_compares_lists_as_rows():
    assert "rank 1" in _message("x", [[1, 2], [1, 3]])


class _Store:
    """The few Store methods in_store uses, over a dict."""

    def __init__(self):
        self.values = {}

    def set(self, key, value):
        self.values[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys):
        return all(k in self.values for k in keys)

    def get(self, key):
        return self.values[key]


def test_in_store_compares_every_ranks_row():
    store = _Store()
    store.set("k/1", "[2, \"b\"]")
    with pytest.raises(InvalidArgument, match=r"^open: rank 0 \(1, 'b'\); rank 1 \(2, 'b'\) \(n differs\)$"):
        agree.in_store(store, "k", 0, 2, (1, "b"), timeout=1, what="open", fields=("n", "s"))
    store.set("j/1", "[1, \"b\"]")
    agree.in_store(store, "j", 0, 2, (1, "b"), timeout=1, what="open")


def test_in_store_names_the_ranks_that_never_took_part():
    from pybridge.errors import Timeout
    with pytest.raises(Timeout, match=r"open: ranks \[1, 2\] did not take part within 0.05 s"):
        agree.in_store(_Store(), "k", 0, 3, (1,), timeout=0.05, what="open")
