"""The federated server's listeners: one thread per worker reads that worker's up stream
(uplink.py) and queues what arrives for the server's thread (workers.py's events), after
checking each header against the task the worker holds and the model it was sent, before
any byte of its payload is read or allocated. A worker that breaks the protocol is reported
("retire") and its stream closed, dropping what it sent.

A receive from ANY rank (gloo's recv_anysource) would need one thread in all, but when a
worker dies it only times out, without saying which; a read per worker fails at once with
the connection, so the error names the worker (docs/federated.md has the figures, from
bench/federated_mechanisms.py).
"""

import threading
import time
from typing import Callable, Mapping, Optional

import torch

from ..base import dtypes
from ..errors import CommError, Timeout, classify
from . import metrics as _metrics
from . import uplink
from .workers import Assignment, Workers
from .protocol import EVALUATE, FAILED, MAX_MESSAGE, MIN_EVALUATE_BYTES, NAMES, TERMINATE, TRAIN, UPDATE, Header

THREAD_PREFIX = "pybridge-federated"  # a listener thread is named THREAD_PREFIX-<worker rank>


def check_header(h: Header, task: Optional[Assignment], answered: int, terminating: bool, max_samples: int) -> None:
    """Raise uplink.Misbehaved unless header `h` is one the server expects from a worker:
    the acknowledgement of a terminate it was sent (`terminating`), or the answer to its
    open `task` (an Assignment; `answered`: the seq of the last task it answered): round,
    client, seq; a TRAIN result of the model's exact size and dtype, an EVALUATE payload at
    most the model's bytes or MIN_EVALUATE_BYTES, a FAILED text of at most MAX_MESSAGE
    bytes; with a sample count in [0, max_samples] and metrics of at most metrics.MAX_BYTES."""
    def bad(why: str) -> "uplink.Misbehaved":
        return uplink.Misbehaved(f"its header (command {h.command}, round {h.round}, client {h.client}, seq "
                                 f"{h.seq}, samples {h.samples}, length {h.length}, dtype code {h.dtype}, "
                                 f"metrics {h.metrics}) {why}")
    if h.command not in NAMES or h.command == UPDATE:
        raise bad(f"has an unknown command {h.command}")
    if not 0 <= h.metrics <= _metrics.MAX_BYTES:
        raise bad(f"announces {h.metrics} bytes of metrics (at most {_metrics.MAX_BYTES})")
    if not 0 <= h.samples <= max_samples:
        raise bad(f"claims {h.samples} samples (at most max_samples = {max_samples})")
    if h.command == TERMINATE:
        if not terminating:
            raise bad("acknowledges a terminate it was not sent")
        if h.length or h.metrics:
            raise bad("is a terminate acknowledgement with a payload")
        return
    a = task
    if a is None or a.seq <= answered:
        raise bad("answers no task (it holds none)")
    if (h.round, h.client, h.seq) != (a.round, a.client, a.seq) or h.command not in (a.command, FAILED):
        raise bad(f"does not answer its task ({NAMES[a.command]} client {a.client}, round {a.round}, "
                  f"seq {a.seq})")
    if h.dtype not in dtypes.BY_CODE:
        raise bad(f"has an unknown dtype code {h.dtype}")
    size = dtypes.BY_CODE[h.dtype].itemsize
    if h.command == TRAIN and (h.length, h.dtype) != (a.numel, a.dtype):
        raise bad(f"announces an update of {h.length} elements of dtype code {h.dtype}; the model it was "
                  f"sent has {a.numel} of dtype code {a.dtype}")
    if h.command == EVALUATE:
        limit = max(a.numel * dtypes.BY_CODE[a.dtype].itemsize, MIN_EVALUATE_BYTES)
        if not 0 <= h.length <= limit // size:
            raise bad(f"announces an evaluation of {h.length} elements (at most {limit} bytes)")
    if h.command == FAILED and (h.dtype != dtypes.UINT8 or not 0 <= h.length <= MAX_MESSAGE):
        raise bad(f"announces a failure text of {h.length} elements of dtype code {h.dtype} "
                  f"(at most {MAX_MESSAGE} bytes, dtype code {dtypes.UINT8})")


class Listeners:
    """The listener threads of the workers in `conns` ({worker rank: uplink.Conn}), started
    at once. They put their events on `workers.events` and read `workers.expect` and
    `workers.terminating` (workers.Workers); payloads are moved to `device`. A read waits
    `link_timeout` seconds for a header's first byte and `timeout` for each later byte;
    max_samples() is the server's current bound on a result's sample count."""

    def __init__(self, conns: Mapping[int, "uplink.Conn"], workers: Workers, device: torch.device, link_timeout: float,
                 timeout: float, max_samples: Callable[[], int]) -> None:
        self.conns = conns
        self.workers = workers
        self.device = device
        self.link_timeout = link_timeout
        self.timeout = timeout
        self.max_samples = max_samples
        self.threads = {w: threading.Thread(target=self._listen, args=(w,), daemon=True,
                                            name=f"{THREAD_PREFIX}-{w}") for w in conns}
        for t in self.threads.values():
            t.start()

    def alive(self, w: int) -> bool:
        return self.threads[w].is_alive()

    def join(self, w: int, until: float) -> None:
        """Wait for `w`'s listener to end, until time.monotonic() reaches `until`."""
        self.threads[w].join(max(until - time.monotonic(), 0.0))

    def shutdown(self, w: int) -> None:
        """End `w`'s listener's read at once."""
        self.conns[w].shutdown()

    def _listen(self, w: int) -> None:
        """Read everything worker `w` sends on its up stream, in order, until its terminate
        acknowledgement or its end."""
        conn, events, timeout = self.conns[w], self.workers.events, self.timeout
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the current device is per thread
        answered = 0  # the seq of the last task it answered
        try:
            while True:
                h = Header(*conn.read_header(self.link_timeout, timeout))
                check_header(h, self.workers.expect.get(w), answered, w in self.workers.terminating,
                             self.max_samples())
                what = f"{NAMES[h.command]} message (round {h.round}, client {h.client})"
                payload = conn.read_tensor(h.length, h.dtype, timeout, f"its {what}'s payload") \
                    if h.length else None
                text = conn.read_bytes(h.metrics, timeout, f"its {what}'s metrics")
                end = conn.read_bytes(len(uplink.TRAILER), timeout, f"its {what}'s end mark")
                if end != uplink.TRAILER:
                    raise uplink.Misbehaved(f"its {what} did not end where its header said (more bytes "
                                            f"than announced, or fewer): {end!r} instead of the end mark")
                try:
                    metrics = _metrics.decode(text)
                except Exception as exc:  # noqa: BLE001 - CorruptData: named, the worker retired
                    raise uplink.Misbehaved(f"its {what} has bad metrics: {exc}") from None
                if payload is not None and payload.device != self.device:
                    payload = payload.to(self.device)
                if h.command != TERMINATE:
                    answered = h.seq
                events.put(("message", w, h, payload, metrics, time.monotonic()))
                if h.command == TERMINATE:
                    return
        except uplink.Misbehaved as exc:
            events.put(("retire", w, str(exc)))
        except EOFError:
            events.put(("lost", w, CommError(f"worker rank {w} closed its up link")))
        except Timeout as exc:
            events.put(("lost", w, Timeout(f"worker rank {w} sent nothing: {exc}")))
        except Exception as exc:  # noqa: BLE001 - reported to the server's thread
            events.put(("lost", w, classify(exc)))
        finally:
            conn.close()
