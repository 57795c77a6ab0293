"""Progress of long steps on stderr (RecordIO packing, the MNIST example's data preparation).

tqdm draws the bar when it is installed (`pip install 'pybridge[progress]'`); without it, one
line is rewritten in place. Nothing is shown unless stderr is a terminal, so logs and pipes stay
clean; PYBRIDGE_PROGRESS=1 shows it anyway, PYBRIDGE_PROGRESS=0 never.
"""

import os
import sys
import time


def enabled(stream=None) -> bool:
    forced = os.environ.get("PYBRIDGE_PROGRESS", "")
    if forced in ("0", "1"):
        return forced == "1"
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class _Off:
    def update(self, n=1):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Line(_Off):
    """`desc: 1.2/4.7 MiB (25%)` or `desc: 1234 records`, redrawn at most every `interval` s."""

    def __init__(self, total, desc, unit, stream, interval=0.2):
        self.total, self.desc, self.unit, self.stream, self.interval = total, desc, unit, stream, interval
        self.n, self._drawn = 0, None

    def _amount(self, n):
        return f"{n / 2**20:.1f}" if self.unit == "B" else str(n)

    def _draw(self):
        unit = "MiB" if self.unit == "B" else self.unit
        if self.total:
            text = f"{self._amount(self.n)}/{self._amount(self.total)} {unit} ({100 * self.n // self.total}%)"
        else:
            text = f"{self._amount(self.n)} {unit}"
        self.stream.write(f"\r{self.desc}: {text}")
        self.stream.flush()
        self._drawn = time.monotonic()

    def update(self, n=1):
        self.n += n
        if self._drawn is None or time.monotonic() - self._drawn >= self.interval:
            self._draw()

    def close(self):
        if self.stream is not None:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
            self.stream = None


def progress(total=None, desc="", unit="it", stream=None):
    """A progress display with update(n) and close() (also a context manager); a silent one when
    progress is not wanted (see enabled). unit "B" counts bytes."""
    stream = sys.stderr if stream is None else stream
    if not enabled(stream):
        return _Off()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Line(total, desc, unit, stream)
    return tqdm(total=total, desc=desc, unit=unit if unit == "B" else " " + unit,  # "25 records", not "25records"
                unit_scale=unit == "B", file=stream, mininterval=0.2)
