"""The trace clock: microseconds of CLOCK_MONOTONIC (time.perf_counter_ns on Linux).

Every process on one machine reads the same monotonic clock, so ranks of one node agree
without correction; ranks on other machines are aligned to rank 0 by the offset
`sync.measure` estimates at init (docs/observability.md, "Clocks").
"""

import time

_ns = time.perf_counter_ns


def now_us() -> float:
    """Now, in microseconds of the monotonic clock (a float, as Chrome traces take)."""
    return _ns() / 1000.0


def wall_anchor() -> tuple[float, float]:
    """(monotonic µs, Unix-epoch µs) read together: ties a trace to the calendar."""
    return now_us(), time.time_ns() / 1000.0
