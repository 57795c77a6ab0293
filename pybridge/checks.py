"""Argument checks shared by the core (and so by the C ABI): a bad number is an
InvalidArgument naming it, never an overflow or a NaN deeper down."""

import math

from .errors import InvalidArgument

MAX_SECONDS = 1e7  # about 115 days: longer than any job, far inside what timedelta and torch take


def positive_seconds(name, value):
    """A timeout in seconds: a number in (0, MAX_SECONDS]; NaN and infinity are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_SECONDS:
        raise InvalidArgument(f"{name} must be a number of seconds in (0, {MAX_SECONDS:g}], got {value!r}")
    return float(value)


def positive_finite(name, value, unit=""):
    """A positive, finite number (sizes such as a bucket cap)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise InvalidArgument(f"{name} must be a positive finite number{unit}, got {value!r}")
    return value
