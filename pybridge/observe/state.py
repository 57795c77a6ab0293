"""Whether this process records: `REC` is the active `recorder.Recorder`, or None.

Every place the library records something reads this one name first (`rec = state.REC`),
so with tracing and metrics off a hot path pays one attribute load and one comparison.
"""

REC = None
