"""Whether this process records: `REC` is the active `recorder.Recorder`, or None.

Every place the library records something reads this one name first (`rec = state.REC`),
so with tracing and metrics off a hot path pays one attribute load and one comparison.
"""

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .recorder import Recorder

REC: "Optional[Recorder]" = None
