"""The libtorch operations of every thread of the process, from torch.profiler, in the rank's
trace: a Go or C++ program's forward and backward run in libtorch on the program's own
threads, which pybridge cannot see; torch's profiler can (its `profile_all_threads`).

Asked for with PYBRIDGE_TRACE_TORCH=1, `pybridge-launch --trace-torch` or
`observe.start(..., torch_ops=True)`. The profiler keeps every operation in memory until the
rank finalizes, so it is for short runs. Its clock is not ours: an annotation recorded while
our clock is read before and after it ties the two (`anchor`), to within the time between
those two reads (a few µs once the profiler is warm).
"""

import json
import os
import tempfile

from . import clock
from .tracks import FIRST_LIBTORCH

_ANCHOR = "pybridge.clock_anchor"


class TorchOps:
    def __init__(self):
        import torch
        from torch._C._profiler import _ExperimentalConfig
        from torch.profiler import ProfilerActivity, profile
        self._torch = torch
        self.profiler = profile(activities=[ProfilerActivity.CPU],
                                experimental_config=_ExperimentalConfig(profile_all_threads=True))
        self.profiler.start()
        self.anchor = self._anchor()
        self.events = None

    def _anchor(self):
        record = self._torch.profiler.record_function
        with record(_ANCHOR + ".warmup"):
            pass
        before = clock.now_us()
        with record(_ANCHOR):
            pass
        return before, clock.now_us()

    def collect(self, pid):
        """Stop the profiler (once) and return its operations as our trace events of rank `pid`."""
        if self.events is not None:
            return self.events
        self.profiler.stop()
        fd, path = tempfile.mkstemp(suffix=".json", prefix="pybridge-torchops-")
        os.close(fd)
        try:
            self.profiler.export_chrome_trace(path)
            with open(path) as f:
                raw = json.load(f).get("traceEvents", [])
        finally:
            os.unlink(path)
        anchor = next((e for e in raw if e.get("name") == _ANCHOR and e.get("ph") == "X"), None)
        if anchor is None:
            self.events = []
            return self.events
        before, after = self.anchor
        shift = (before + after) / 2 - (anchor["ts"] + anchor.get("dur", 0) / 2)
        tracks, out = {}, []
        for e in raw:
            if e.get("ph") != "X" or e.get("cat") not in ("cpu_op", "user_annotation") or \
                    str(e.get("name", "")).startswith(_ANCHOR):
                continue
            tid = tracks.setdefault(e.get("tid"), FIRST_LIBTORCH + len(tracks))
            out.append({"ph": "X", "name": e["name"], "cat": "libtorch", "pid": pid, "tid": tid,
                        "ts": round(e["ts"] + shift, 3), "dur": e.get("dur", 0)})
        for thread, tid in tracks.items():
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": f"libtorch ops (thread {thread})"}})
        self.events = out
        return out
