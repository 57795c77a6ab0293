"""The server's check of a client's update before it can reach an aggregate: NaN or Inf
elements, or (optionally) an L2 norm past a bound. One pass over the update: its norm is
finite exactly when every element is (a NaN or Inf makes it NaN or Inf), so the elements
are counted only for the message of a refused one. And the one check of the bound itself,
whoever sets it (Server(max_norm=), Server.set_max_norm, C, Go)."""

import math
from typing import Any, Optional

import torch

from ..errors import InvalidArgument


def max_norm_setting(max_norm: Any) -> Optional[float]:
    """The bound `max_norm` as the server keeps it: None for no bound (None or 0), else a
    finite number > 0 as a float. Anything else (negative, NaN, Inf, not a number) is an
    InvalidArgument with one message for every caller."""
    if max_norm is None:
        return None
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) \
            or not (max_norm >= 0 and math.isfinite(max_norm)):
        raise InvalidArgument(f"max_norm must be a finite number >= 0 (0 or None: no bound), got {max_norm!r}")
    return float(max_norm) or None


def refusal(update: torch.Tensor, max_norm: Optional[float] = None) -> Optional[str]:
    """Why `update` (a pseudo-gradient) is refused, or None when it is accepted."""
    if update.numel() == 0:
        return None
    # 16-bit updates: a float32 norm, so that a legitimate one does not overflow 65504
    acc = torch.float64 if update.dtype == torch.float64 else torch.float32
    norm = float(torch.linalg.vector_norm(update, dtype=acc))
    if norm != norm or norm == float("inf"):
        bad = int((~torch.isfinite(update)).sum())
        if bad:
            return f"{bad} of {update.numel()} elements are NaN or Inf"
        return f"its L2 norm overflows {acc}"
    if max_norm is not None and norm > max_norm:
        return f"its L2 norm {norm:.6g} exceeds the server's max_norm {max_norm:g}"
    return None
