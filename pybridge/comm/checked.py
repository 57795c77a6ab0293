"""Checked mode: verify each collective's fingerprint across the ranks before running it.

A fingerprint is (sequence number, kind, dtype, count, op or root, output count). Before
a collective, the members compare their fingerprints in one allreduce (max) and, if they
differ, all-gather them (48 bytes each, the same size on every rank, so a mismatch cannot
upset the backend): every member raises InvalidArgument naming the ranks and how they
differ; the real collective is not run and the group stays usable. Point-to-point
messages exchange fingerprints through the store, and the receive is posted only once
both sides agree.

This module owns checked mode's per-group State (the fingerprint buffer, the count of
messages per peer) and its logic; it issues no collective itself: collectives.py runs
the allreduce and the all_gather (collectives._verify) and posts the messages.
"""

import threading
import time

import torch

from .. import abi
from ..base import agree
from ..base import dtypes
from ..errors import InvalidArgument, Timeout

BROADCAST, ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BARRIER, SEND, RECV, ALL_TO_ALL = range(1, 9)
NAMES = {BROADCAST: "broadcast", ALL_REDUCE: "all_reduce", ALL_GATHER: "all_gather",
         REDUCE_SCATTER: "reduce_scatter", BARRIER: "barrier", SEND: "send", RECV: "recv",
         ALL_TO_ALL: "all_to_all"}
# Reduce op names by their ABI code (PB_SUM ... in capi/pybridge.h).
OP_NAMES = {getattr(abi, "PB_" + name.upper()): name for name in ("sum", "avg", "min", "max", "product")}
FIELDS = ("sequence number", "operation", "dtype", "count", "op or root", "output count")


class Op:
    """What a collective is, for fingerprints and error messages."""

    __slots__ = ("kind", "dtype", "count", "extra", "count2", "nbytes", "key")

    def __init__(self, kind, t=None, extra=-1, out=None):
        self.kind = kind
        self.dtype = dtypes.CODE_OF.get(t.dtype, 99) if t is not None else -1
        self.count = t.numel() if t is not None else 0
        self.extra = extra
        self.count2 = out.numel() if out is not None else -1
        self.nbytes = self.count * t.element_size() if t is not None else 0
        self.key = None  # checked mode's hash of the fields, made on first use

    @property
    def name(self):
        return NAMES[self.kind]

    def row(self, seq):
        return [seq, self.kind, self.dtype, self.count, self.extra, self.count2]


def describe_row(row):
    seq, kind, dt, count, extra, count2 = row
    name = NAMES.get(kind, f"operation {kind}")
    if kind == BARRIER:
        return f"barrier #{seq}"
    dtype = _dtype_name(dt)
    arg = ""
    if kind in (ALL_REDUCE, REDUCE_SCATTER):
        arg = f"({OP_NAMES.get(extra, extra)}) "
    elif kind == BROADCAST:
        arg = f"(root {extra}) "
    out = f" into {count2}" if count2 >= 0 else ""
    return f"{name} #{seq} {arg}{dtype} x {count}{out}"


def _dtype_name(code):
    dt = dtypes.BY_CODE.get(code)
    return str(dt).replace("torch.", "") if dt is not None else f"dtype {code}"


class State:
    """Checked mode's state for one group: the fingerprint buffer and, per (direction,
    peer, tag), the messages posted so far. Made with the group (Group.checks)."""

    def __init__(self, device):
        self._device = device
        self._buffer = None  # made on first use
        self._p2p = {}  # (direction, peer, tag) -> (count, the last one posted)
        self._lock = threading.Lock()
        self.unit = threading.RLock()  # held while a collective is numbered, verified and posted

    def fingerprint(self, seq, op):
        """A 2-element int64 tensor (h, -h), h a 62-bit hash of collective `seq`'s
        fingerprint: after an allreduce(max), agreed() says whether every member's matched."""
        key = op.key
        if key is None:
            key = op.key = agree.signature(op.row(0))
        # an odd multiplier is a bijection mod 2^62: same key, other seq -> other value
        h = key ^ ((seq * 0x1E3779B97F4A7C15) & _MASK)
        buf = self._buffer
        if buf is None:
            buf = self._buffer = torch.empty(2, dtype=torch.int64, device=self._device)
        if buf.is_cuda:
            buf.copy_(torch.tensor([h, -h], dtype=torch.int64))
        else:
            buf.numpy()[:] = (h, -h)  # cheaper than building a tensor
        return buf

    def _next_message(self, key):
        """(number of this message, the previous message's _Deferred, this one's)."""
        with self._lock:
            n, previous = self._p2p.get(key, (0, None))
            posted = _Deferred(previous)
            self._p2p[key] = (n + 1, posted)
        return n + 1, previous, posted


_MASK = (1 << 62) - 1


def agreed(buf):
    """After the allreduce(max) of every member's fingerprint(): were they all equal?
    (The maximum of h equals the minimum, -max(-h).)"""
    top, low = buf.tolist()
    return top == -low


def mismatch(g, seq, op, rows):
    """The InvalidArgument for fingerprints `rows` (by group rank) that differ:
    'checked mode: ranks disagree on all_reduce #3 on the world group: rank 0 passed
    all_reduce #3 (sum) float32 x 4; rank 1 passed all_reduce #3 (sum) int32 x 4 (dtype differs)'."""
    try:
        agree.check(f"checked mode: ranks disagree on {op.name} #{seq} on {g.describe()}", rows,
                    describe=lambda row: f"passed {describe_row(row)}", fields=FIELDS)
    except InvalidArgument as err:
        return err
    return InvalidArgument(f"checked mode: {op.name} #{seq}: fingerprints differ but the rows agree")


# ---- point to point -------------------------------------------------------------------

def p2p(g, store, direction, peer, tag, op, post):
    """Checked isend/irecv: publish this side's fingerprint, and on a helper thread wait
    for the peer's, compare, and post (`post()` returns torch's work) only when they agree,
    after the previous message of the same (direction, peer, tag). Returns a work-like
    object; the caller never blocks here, so exchanges posted in any order still pair."""
    n, previous, posted = g.checks._next_message((direction, peer, tag))
    src, dst = (g.rank, peer) if direction == SEND else (peer, g.rank)
    base = f"pybridge/chk/{g.uid}/{src}>{dst}/{tag}/{n}/"
    mine, theirs = base + ("s" if direction == SEND else "r"), base + ("r" if direction == SEND else "s")
    store.set(mine, ",".join(map(str, op.row(n))))
    what = f"{NAMES[SEND]} #{n} from rank {src} to rank {dst} (tag {tag}) on {g.describe()}"

    def run():
        # Polled, not store.wait(): a blocking wait holds the store client's connection,
        # and this process's other threads (the peer's matching key among them) need it.
        deadline = time.monotonic() + g.timeout
        pause = 0.0005
        while not store.check([theirs]):
            if time.monotonic() > deadline:
                raise Timeout(f"checked mode: {what}: {g.who(peer)} did not post the matching "
                              f"{'recv' if direction == SEND else 'send'} within {g.timeout:g} s")
            time.sleep(pause)
            pause = min(2 * pause, 0.02)
        other = tuple(int(x) for x in store.get(theirs).decode().split(","))
        store.delete_key(theirs)
        a, b = op.row(n), list(other)
        # the sides differ in kind by design; count and dtype must agree
        if (a[2], a[3]) != (b[2], b[3]):
            send_row, recv_row = (a, b) if direction == SEND else (b, a)
            raise InvalidArgument(
                f"checked mode: {what}: rank {src} sends {_dtype_name(send_row[2])} x {send_row[3]}, "
                f"rank {dst} receives {_dtype_name(recv_row[2])} x {recv_row[3]}")
        if previous is not None:
            previous.posted.wait()
        return post()

    posted.start(run)
    return posted


class _Deferred:
    """torch work posted later by a helper thread: wait() and is_completed() as torch's."""

    def __init__(self, previous):
        self.posted = threading.Event()  # set once this message was posted or given up
        self._previous = previous
        self._work = None
        self._error = None
        self._thread = None

    def start(self, run):
        def body():
            try:
                self._work = run()
            except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
                self._error = exc
            finally:
                self.posted.set()
        self._thread = threading.Thread(target=body, daemon=True, name="pybridge-checked-p2p")
        self._thread.start()

    def wait(self):
        self.posted.wait()
        if self._error is not None:
            raise self._error
        return self._work.wait()

    def is_completed(self):
        return self.posted.is_set() and (self._error is not None or self._work.is_completed())
