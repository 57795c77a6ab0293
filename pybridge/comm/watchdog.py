"""Progress of every rank, for errors that name ranks and for the hang watchdog.

Each group has a Progress (`Group.progress`), owned here: it counts the collectives the
group started (numbering them "#seq" in errors) and, while the watchdog runs, keeps the
unfinished ones. collectives' run path updates it through its methods, nothing else
writes it. Nothing is published per call: a background thread per process ("monitor")
answers requests through the rendezvous store, so the hot path only updates a counter and
a dict.

- A rank that needs to know where the others are (a collective failed, or the monitor
  sees one stuck longer than the threshold) bumps a request counter; every monitor
  answers with its groups' progress within a tick; ranks that do not answer are dead,
  stopped, or run without the watchdog (the roster says which).
- Stuck collectives are reported once, to stderr, before the group's timeout:
  "ranks [2] never started all_reduce #1234; ranks [0, 1] started it and are waiting".
"""

import atexit
import json
import os
import sys
import threading
import time
from typing import Any

from .. import observe as _observe
from ..errors import Canceled, CommError, InvalidArgument, Timeout, classify

TICK = 0.25            # seconds between two looks at the store and the groups
ANSWER_WAIT = 1.5      # how long a diagnosis waits for the other ranks' answers
_REQ = "pybridge/wd/req"
_ANS = "pybridge/wd/ans/{}"

_monitor = None  # the running Monitor, or None


class Progress:
    """One group's collectives: how many were started, and (watched) the unfinished ones,
    seq -> (op, start time, torch work or None). Made per group: a subgroup's is watched
    when its parent's is."""

    __slots__ = ("_issued", "_inflight")

    def __init__(self, parent=None):
        self._issued = 0
        self._inflight = {} if parent is not None and parent.watched else None

    @property
    def issued(self):
        """Collectives started so far; the latest one is "#issued"."""
        return self._issued

    @property
    def watched(self):
        return self._inflight is not None

    def begin(self, op):
        """Number a collective that starts now (and track it while watched); returns its seq."""
        self._issued = seq = self._issued + 1
        if self._inflight is not None:
            self._inflight[seq] = (op, time.monotonic(), None)
        return seq

    def running(self, seq, work):
        """Collective `seq` continues asynchronously as torch's `work`."""
        inflight = self._inflight
        if inflight is not None and seq in inflight:
            op, started, _ = inflight[seq]
            inflight[seq] = (op, started, work)

    def end(self, seq):
        if self._inflight is not None:
            self._inflight.pop(seq, None)

    def snapshot(self):
        """(issued, list of in-flight entries by seq) as read by the watchdog's thread."""
        inflight = self._inflight
        return self._issued, ({} if inflight is None else dict(inflight))

    def first_unfinished(self):
        """(seq, (op, start, work)) of the oldest collective still running, or (None, None);
        async work found completed is retired here."""
        inflight = self._inflight
        if inflight is None:
            return None, None
        for seq in sorted(list(inflight)):
            entry = inflight.get(seq)
            if entry is None:
                continue
            work = entry[2]
            if work is not None and _completed(work):
                inflight.pop(seq, None)
                continue
            return seq, entry
        return None, None

    def _watch(self):
        if self._inflight is None:
            self._inflight = {}

    def _unwatch(self):
        self._inflight = None


def threshold(setting, timeout):
    """Seconds a collective may be stuck before it is reported; 0 turns the watchdog off.
    setting: None (PYBRIDGE_WATCHDOG, else min(60, timeout / 2)), False/0 (off) or seconds."""
    source = "watchdog"
    if setting is None:
        raw = os.environ.get("PYBRIDGE_WATCHDOG", "").strip().lower()
        if raw == "":
            return min(60.0, timeout / 2)
        source = f"environment variable PYBRIDGE_WATCHDOG={raw!r}"
        setting = 0 if raw in ("off", "false", "no") else raw
    if setting is False:
        return 0.0
    try:
        value = float(setting)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(setting, bool) or not (0 <= value <= 1e7):
        raise InvalidArgument(f"{source}: expected seconds between 0 (off) and 1e7, got {setting!r}")
    return value


def start(world, seconds, open_store):
    """Watch `world` (and the subgroups made from it) when seconds > 0, talking to the
    other ranks through the store `open_store()` returns."""
    global _monitor
    if seconds <= 0:
        world.progress._unwatch()
        return
    world.progress._watch()
    _monitor = Monitor(world, seconds, open_store())
    _monitor.thread.start()
    # Stopped before the interpreter finalizes: a daemon thread caught inside a store call
    # then could take the process down on its way out.
    atexit.register(stop)


def stop(wait=True):
    """Stop the monitor; wait=False (an elastic world given up) leaves its thread to end on
    its own: it may be blocked on a store call to a lost member."""
    global _monitor
    m, _monitor = _monitor, None
    if m is not None:
        m.stopped.set()
        if wait:
            m.thread.join(2 * TICK + 1)  # not for ever: it may be blocked on a dead store


def explain(g, seq, op, exc):
    """The pybridge error for a failed collective: it names the operation, and for a
    timeout or a broken connection the ranks that died, are late or never joined; for a group
    that was aborted meanwhile (Group.abort), that."""
    if g.aborted is not None:
        return aborted(g, f"{op.name} #{seq} ({op.nbytes} bytes)", exc)
    err = classify(exc)
    if g.elastic is not None and isinstance(err, (Timeout, CommError)):
        return g.elastic.failed(err)  # an elastic world: agree on the next one, name the lost ranks
    diag = ""
    if isinstance(err, (Timeout, CommError)) and _monitor is not None and g.progress.watched:
        diag = _bounded(lambda: _monitor.diagnose(g, seq, op), ANSWER_WAIT + 2)
    err.args = (f"{op.name} #{seq} ({op.nbytes} bytes) on {g.describe()}: {diag}{err}",)
    return err


def explain_latest(g, exc, what):
    """As explain(), for a failure seen later than its collective (a reducer bucket's
    future): names where every member is relative to g's latest collective."""
    if g.aborted is not None:
        return aborted(g, what, exc)
    err = classify(exc)
    if g.elastic is not None and isinstance(err, (Timeout, CommError)):
        return g.elastic.failed(err)
    latest = g.progress.issued
    if isinstance(err, (Timeout, CommError)) and _monitor is not None and g.progress.watched:
        diag = _bounded(lambda: _monitor.diagnose(g, latest, _Latest), ANSWER_WAIT + 2)
        err.args = (f"{what} (the latest collective on {g.describe()} is #{latest}): {diag}{err}",)
    else:
        err.args = (f"{what}: {err}",)
    return err


def aborted(g: Any, what: str, exc: BaseException) -> Canceled:
    """The Canceled of `what`, which failed because g was aborted while it waited (the
    backend's own error, a broken connection, says nothing of why)."""
    err = Canceled(f"{what} on {g.describe()} was canceled: the group was aborted ({g.aborted})")
    err.__cause__ = exc
    return err


class _Latest:
    name = "collective"


def _bounded(fn, seconds):
    """fn() on a helper thread, waited for at most `seconds`: the store it asks may be gone."""
    box = []
    t = threading.Thread(target=lambda: box.append(_quiet(fn)), daemon=True, name="pybridge-diagnose")
    t.start()
    t.join(seconds)
    if not box:
        return ("the store (hosted by rank 0) did not answer, so rank 0 has probably died "
                "or is stopped. ")
    return box[0]


def _quiet(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a diagnosis must not replace the real error
        return f"(could not ask the other ranks: {type(exc).__name__}: {exc}) "


def _groups(world):
    out, todo = [], [world]
    while todo:
        g = todo.pop()
        if not g.closed and g.progress.watched:
            out.append(g)
            todo.extend(g.children)
    return out


def _completed(work):
    try:
        return work.is_completed()
    except Exception:  # noqa: BLE001 - failed work: its waiter reports it
        return True


class Monitor:
    def __init__(self, world, seconds, store):
        self.world = world
        self.seconds = seconds
        self.store = store
        self.answered = 0
        self.reported = set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="pybridge-watchdog")

    def _loop(self):
        while not self.stopped.wait(TICK):
            try:
                self.answer_if_asked()
                self._look_for_stalls()
            except Exception:  # noqa: BLE001 - the store is gone: the collectives will say so
                if self.stopped.wait(1.0):
                    return

    # ---- answering -------------------------------------------------------------------

    def answer_if_asked(self):
        asked = self.store.add(_REQ, 0)
        if asked > self.answered:
            self.answer(asked)

    def answer(self, req):
        groups = {}
        for g in _groups(self.world):
            seq, _ = g.progress.first_unfinished()
            groups[g.uid] = [g.progress.issued, seq]
        self.store.set(_ANS.format(self.world.global_rank), json.dumps({"req": req, "groups": groups}))
        self.answered = max(self.answered, req)
        _quiet(lambda: _observe.hang_dump(f"the watchdog's request #{req}"))  # recording: what each rank saw

    # ---- asking --------------------------------------------------------------------

    def diagnose(self, g, seq, op):
        """Where every member of g is relative to collective `seq`, in words."""
        req = self.store.add(_REQ, 1)
        self.answer(req)
        members = set(g.ranks)
        got = {}
        deadline = time.monotonic() + ANSWER_WAIT
        while True:
            for r in members - set(got):
                key = _ANS.format(r)
                if self.store.check([key]):
                    a = json.loads(self.store.get(key))
                    if a["req"] >= req:
                        got[r] = a["groups"].get(g.uid)
            if len(got) == len(members) or time.monotonic() > deadline:
                break
            self.answer_if_asked()  # another rank may be diagnosing at the same time
            time.sleep(0.02)
        return _words(g, seq, op, got)

    def _look_for_stalls(self):
        now = time.monotonic()
        for g in _groups(self.world):
            seq, entry = g.progress.first_unfinished()
            if seq is None or (g.uid, seq) in self.reported:
                continue
            op, started, _ = entry
            if now - started >= self.seconds:
                self.reported.add((g.uid, seq))
                text = self.diagnose(g, seq, op)
                me = g.who(g.rank)
                print(f"pybridge watchdog on {me}: {op.name} #{seq} ({op.nbytes} bytes) on "
                      f"{g.describe()} has not finished after {now - started:.0f} s "
                      f"(the timeout is {g.timeout:g} s): {text}", file=sys.stderr, flush=True)


def _words(g, seq, op, got):
    never, waiting, done, silent, unwatched = [], [], [], [], []
    for i, r in enumerate(g.ranks):
        entry = g.roster[r] if g.roster else None
        if r not in got or got[r] is None:
            (unwatched if entry and not entry.get("watchdog", True) else silent).append(i)
            continue
        issued, first = got[r]
        if issued < seq:
            never.append((i, issued))
        elif first is not None and first <= seq:
            waiting.append(i)
        else:
            done.append(i)
    name = f"{op.name} #{seq}"
    parts = []
    if silent:
        parts.append(f"{_list(g, silent)} did not answer (died, or stopped)")
    if never:
        last = ", ".join(f"rank {i} at #{n}" for i, n in never)
        parts.append(f"ranks {[i for i, _ in never]} never started {name} (last started: {last})")
    if waiting:
        parts.append(f"ranks {waiting} started {name} but have not finished")
    if done:
        parts.append(f"ranks {done} finished {name}")
    if unwatched:
        parts.append(f"ranks {unwatched} run without the watchdog (progress unknown)")
    return "; ".join(parts) + ". " if parts else ""


def _list(g, ranks):
    return ", ".join(g.who(i) for i in ranks)
