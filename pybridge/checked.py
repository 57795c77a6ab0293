"""Checked mode: verify each collective's fingerprint across the ranks before running it.

A fingerprint is (sequence number, kind, dtype, count, op or root, output count). Before
a collective, the members all-gather their fingerprints (48 bytes each, the same size on
every rank, so a mismatch cannot upset the backend) and, if they differ, every member
raises InvalidArgument naming the ranks and how they differ; the real collective is not
run and the group stays usable. Point-to-point messages exchange fingerprints through
the store, and the receive is posted only once both sides agree.
"""

import hashlib
import threading
import time

import torch
import torch.distributed as dist

from . import dtypes
from .errors import InvalidArgument, PyBridgeError, Timeout, classify

BROADCAST, ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BARRIER, SEND, RECV = range(1, 8)
NAMES = {BROADCAST: "broadcast", ALL_REDUCE: "all_reduce", ALL_GATHER: "all_gather",
         REDUCE_SCATTER: "reduce_scatter", BARRIER: "barrier", SEND: "send", RECV: "recv"}
_OP_NAMES = {0: "sum", 1: "avg", 2: "min", 3: "max", 4: "product"}
_FIELDS = ("sequence number", "operation", "dtype", "count", "op or root", "output count")


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


def _who(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def describe_row(row):
    seq, kind, dt, count, extra, count2 = row
    name = NAMES.get(kind, f"operation {kind}")
    if kind == BARRIER:
        return f"barrier #{seq}"
    dtype = _dtype_name(dt)
    arg = ""
    if kind in (ALL_REDUCE, REDUCE_SCATTER):
        arg = f"({_OP_NAMES.get(extra, extra)}) "
    elif kind == BROADCAST:
        arg = f"(root {extra}) "
    out = f" into {count2}" if count2 >= 0 else ""
    return f"{name} #{seq} {arg}{dtype} x {count}{out}"


def _dtype_name(code):
    dt = dtypes.BY_CODE.get(code)
    return str(dt).replace("torch.", "") if dt is not None else f"dtype {code}"


def verify(g, seq, op):
    """Compare the fingerprint of collective `seq` over g; raise on any difference.

    One allreduce(max) of (h, -h), h a 62-bit hash of the fingerprint, tells every member
    whether all fingerprints are equal (the maximum equals the minimum);
    only then do the members all-gather the full rows to say who differs. Every member
    sees the same answer, so all take the same path."""
    key = op.key
    if key is None:
        key = op.key = signature(op.row(0))
    # an odd multiplier is a bijection mod 2^62: same key, other seq -> other value
    h = key ^ ((seq * 0x1E3779B97F4A7C15) & _MASK)
    buf = g.fingerprint_buffer
    if buf is None:
        buf = g.fingerprint_buffer = torch.empty(2, dtype=torch.int64, device=g.device)
    if buf.is_cuda:
        buf.copy_(torch.tensor([h, -h], dtype=torch.int64))
    else:
        buf.numpy()[:] = (h, -h)  # cheaper than building a tensor
    try:
        g.pg.allreduce([buf], _MAX).wait()
    except Exception as exc:  # noqa: BLE001
        raise classify(exc) from exc
    top, low = buf.tolist()
    if top == -low:
        return
    rows = gather_rows(g, op.row(seq))
    raise InvalidArgument(mismatch(f"{op.name} #{seq} on {g.describe()}", rows))


def _max_options():
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    return opts


_MAX = _max_options()
_MASK = (1 << 62) - 1


def gather_rows(g, row):
    """Every member's `row` (int64s, the same length everywhere), by group rank."""
    n = len(row)
    mine = torch.tensor(row, dtype=torch.int64, device=g.device)
    every = torch.empty(g.size * n, dtype=torch.int64, device=g.device)
    try:
        g.pg._allgather_base(every, mine).wait()
    except Exception as exc:  # noqa: BLE001
        raise classify(exc) from exc
    return [tuple(r) for r in every.view(g.size, n).tolist()]


def signature(items):
    """A 56-bit hash of a list (e.g. of (dtype, count) pairs), the same on every rank."""
    digest = hashlib.sha256(repr(items).encode()).digest()
    return int.from_bytes(digest[:7], "little")


def mismatch(what, rows):
    """'ranks disagree on all_reduce #3: rank 1 passed all_reduce #3 (sum) int32 x 4;
    ranks [0, 2] all_reduce #3 (sum) float32 x 4 (dtype differs)'."""
    by = {}
    for r, row in enumerate(rows):
        by.setdefault(row, []).append(r)
    # the most common fingerprint first (rank 0's on a tie): the others are the odd ones
    order = sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    ref = order[0][0]
    parts = []
    for row, ranks in order[1:]:
        fields = [f for f, a, b in zip(_FIELDS, row, ref) if a != b]
        parts.append(f"{_who(ranks)} passed {describe_row(row)} ({', '.join(fields)} differs)")
    parts.append(f"{_who(order[0][1])} {describe_row(ref)}")
    return f"checked mode: ranks disagree on {what}: " + "; ".join(parts)


def agree_in_store(g, store, key, value, what):
    """Publish `value` (a string) under key/rank and wait for every member's: a one-off
    check through the store, for objects every member opens in the same order."""
    try:
        values = _gather_in_store(g, store, key, value, what)
    except PyBridgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the store failing (its host gone) is a pybridge error
        raise classify(exc) from exc
    if len(set(values)) > 1:
        by = {}
        for r, v in enumerate(values):
            by.setdefault(v, []).append(r)
        parts = "; ".join(f"{_who(rs)}: {v}" for v, rs in by.items())
        raise InvalidArgument(f"{what}: ranks disagree: {parts}")


def _gather_in_store(g, store, key, value, what):
    store.set(f"{key}/{g.rank}", value)
    keys = [f"{key}/{r}" for r in range(g.size)]
    deadline = time.monotonic() + g.timeout
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise Timeout(f"{what}: ranks {missing} did not open it within {g.timeout:g} s")
        time.sleep(0.01)
    return [store.get(k).decode() for k in keys]


# ---- point to point -------------------------------------------------------------------

def p2p(g, store, direction, peer, tag, op, post):
    """Checked isend/irecv: publish this side's fingerprint, and on a helper thread wait
    for the peer's, compare, and post (`post()` returns torch's work) only when they agree,
    after the previous message of the same (direction, peer, tag). Returns a work-like
    object; the caller never blocks here, so exchanges posted in any order still pair."""
    key = (direction, peer, tag)
    n, previous = g.p2p.get(key, (0, None))
    n += 1
    posted = _Deferred(previous)
    g.p2p[key] = (n, posted)
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
