"""Per-client metrics: a small dict of floats (loss, accuracy, ...) that a worker returns
with a result, and their sample-weighted means over a round. Torch-free, so the arithmetic
is tested exactly.

On the wire the metrics are UTF-8 text, one `name=value` line each (`repr` of the float,
which reads back to the same double): no pickling, and a C or Go peer goes through the core.
"""

import math
import re
from typing import Any, Mapping, Optional

from ..errors import CorruptData, InvalidArgument

MAX_METRICS = 32  # a small dict, not a data channel
MAX_NAME = 64
MAX_BYTES = MAX_METRICS * (MAX_NAME + 32)  # a header announcing more is corrupt
MAX_VALUE = 1e200  # larger magnitudes are refused: times any sample count, a sum stays finite
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*\Z")


def check(metrics: Optional[Mapping[str, Any]]) -> dict[str, float]:
    """`metrics` (a mapping of names to numbers, or None) as a new dict of floats; names are
    identifiers of at most MAX_NAME characters (letters, digits, `_ . : / -`), values
    finite numbers of magnitude at most MAX_VALUE (NaN or Inf would poison a round's means)."""
    if metrics is None:
        return {}
    if not hasattr(metrics, "items"):
        raise InvalidArgument(f"metrics must be a dict of names to numbers, got {type(metrics).__name__}")
    if len(metrics) > MAX_METRICS:
        raise InvalidArgument(f"at most {MAX_METRICS} metrics per result, got {len(metrics)}")
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or len(name) > MAX_NAME or not NAME.match(name):
            raise InvalidArgument(f"metric name {name!r} is not an identifier of at most {MAX_NAME} "
                                  "characters (letters, digits, _ . : / -)")
        if isinstance(value, bool):
            raise InvalidArgument(f"metric {name!r} must be a number, got {value!r}")
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            raise InvalidArgument(f"metric {name!r} must be a number, got {value!r}") from None
        if not abs(out[name]) <= MAX_VALUE:  # NaN fails this too
            raise InvalidArgument(f"metric {name!r} must be a finite number of magnitude at most "
                                  f"{MAX_VALUE:g}, got {out[name]!r}")
    return out


def encode(metrics: Mapping[str, float]) -> bytes:
    """The wire text of checked metrics (bytes; empty for none)."""
    return "\n".join(f"{k}={v!r}" for k, v in metrics.items()).encode("ascii")


def decode(data: Any) -> dict[str, float]:
    """Metrics from their wire text; CorruptData if it is not what encode() writes (or breaks
    check()'s rules: a non-finite value, a bad name)."""
    try:
        pairs = [line.split("=", 1) for line in bytes(data).decode("ascii").split("\n")] if data else []
        return check({k: float(v) for k, v in pairs})
    except (UnicodeDecodeError, ValueError, InvalidArgument) as exc:
        raise CorruptData(f"a result's metrics are not name=value lines: {exc}") from None


class RoundMetrics:
    """Sample-weighted means of the metrics of a round's results: metric m's mean is
    sum(n_i * m_i) / sum(n_i) over the results that reported m (n_i: their samples), or the
    plain mean when those results have no samples. Sums are exact (math.fsum), so the order
    results arrive in does not change the means."""

    def __init__(self) -> None:
        self._seen: dict[str, list[tuple[int, float]]] = {}  # name -> [(samples, value)]

    def add(self, samples: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._seen.setdefault(name, []).append((samples, value))

    def means(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pairs in self._seen.items():
            total = sum(n for n, _ in pairs)
            if total:
                out[name] = math.fsum(n * v for n, v in pairs) / total
            else:
                out[name] = math.fsum(v for _, v in pairs) / len(pairs)
        return out
