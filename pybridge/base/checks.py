"""Argument checks shared by the core (and so by the C ABI): a bad number is an
InvalidArgument naming it, never an overflow or a NaN deeper down."""

import math
from typing import Any, Optional

import numpy as np

from ..errors import InvalidArgument

MAX_SECONDS = 1e7  # about 115 days: longer than any job, far inside what timedelta and torch take


def integer(what: str, value: Any, *, low: Optional[int] = None, high: Optional[int] = None,
            expected: Optional[str] = None) -> int:
    """`value` as an int, checked: an int or numpy integer (never a bool) in [low, high]
    (either bound may be None). The error reads "{what} must be {expected}, got {value!r}";
    `expected` defaults to words for the bounds ("a non-negative integer", "an integer in [0, 9]")."""
    if type(value) is int and (low is None or value >= low) and (high is None or value <= high):
        return value  # the common case, checked in one step
    ok = not isinstance(value, bool) and isinstance(value, (int, np.integer))
    if not ok or (low is not None and value < low) or (high is not None and value > high):
        raise InvalidArgument(f"{what} must be {expected or _bounds(low, high)}, got {value!r}")
    return int(value)


def _bounds(low: Optional[int], high: Optional[int]) -> str:
    if high is not None:
        return f"an integer in [{'-inf' if low is None else low}, {high}]"
    return {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(
        low, f"an integer >= {low}")


def index(what: str, value: Any, size: int, of: str) -> int:
    """`value` as an int in [0, size), else InvalidArgument "{what} {value!r} is out of range
    for {of}" (e.g. "root rank 3 is out of range for a group of size 2")."""
    if type(value) is int and 0 <= value < size:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < size:
        raise InvalidArgument(f"{what} {value!r} is out of range for {of}")
    return int(value)


def positive_seconds(name: str, value: Any) -> float:
    """A timeout in seconds: a number in (0, MAX_SECONDS]; NaN and infinity are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_SECONDS:
        raise InvalidArgument(f"{name} must be a number of seconds in (0, {MAX_SECONDS:g}], got {value!r}")
    return float(value)


def positive_finite(name: str, value: Any, unit: str = "") -> float:
    """A positive, finite number (sizes such as a bucket cap)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise InvalidArgument(f"{name} must be a positive finite number{unit}, got {value!r}")
    return value
