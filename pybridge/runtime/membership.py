"""Who is in an elastic job: numbered worlds ("generations") agreed on in rounds over a store
that outlives every worker (etcd, or the TCPStore of pybridge-launch --elastic on node 0:
elastic_store.py, docs/elastic.md).

Every process has an id (the launcher's PYBRIDGE_ELASTIC_ID, else host:pid) and beats a
heartbeat counter in the store. A round forms generation n: each process that wants to be
in it registers as a candidate; any candidate that finds the round complete writes the
member list once (compare_set, so exactly one list wins) and every candidate reads it.

  round 1       complete when `initial` candidates registered (the launcher's WORLD_SIZE);
  round n > 1   complete when every member of generation n-1 registered again or is lost.
                Candidates that were not members (joiners) are added after the survivors.

The survivors keep their order, so the lowest surviving rank becomes rank 0 (the rank a
rolled-back state is sent from). A member is lost when its launcher marked it dead (it saw
the process exit), when it ran on this machine and its pid is gone, or when its heartbeat
did not move for `lost_after` seconds (a stopped or cut-off process). A member declared lost
that comes back finds itself left out of the list and registers for the next round, as a
joiner would.

Keys, under pybridge/elastic/: gen (the newest generation, 0 before the first), hb/<id> (a
beat count), dead/<id> (json: the generation it was marked in and why), done, g<n>/count (a
counter), g<n>/cand/<k> (json), g<n>/members (json, rank order), g<n>/broken (why world n
was given up: a member's heartbeat stood still, seen by its neighbour), launcher/... (the
launchers' numbers, pybridge-launch --elastic).

Each member's watch thread reads the next rank's beat every beat (so each member is watched
by one other) and g<n>/broken: a member lost with its whole node
(no launcher left to mark it dead; a cut link answers nothing, so calls would wait out their
timeout) is marked dead by its watcher after `lost_after`, and every member shuts its
connections of that world at its next beat, so the next world forms in about `lost_after`.

With a job secret (PYBRIDGE_SECRET, base/secret.py) every value is sealed: one that does not
open with the secret is ignored, with a warning naming the key, and only counters are plain
(an outsider can stall a round by bumping one, never decide it). Every entry is checked
before use, secret or not: a malformed one (not json, wrong fields, absurd values such as a
negative wanted rank) is ignored with a warning naming the key, and a dead mark holds for
the generation it was written in (and the next two), so that a mark cannot keep out for
ever a process that is alive and registers again.
"""

import atexit
import functools
import json
import os
import socket
import threading
import time
import warnings

from . import elastic_store as _elastic_store
from ..comm import cancel as _cancel
from ..errors import (Closed, CommError, CorruptData, InvalidArgument, MembershipChanged, PyBridgeError, Timeout,
                      classify)

PREFIX = "pybridge/elastic/"
HEARTBEAT = 0.2  # seconds between two beats
POLL = 0.02  # seconds between two looks at a round
MAX_CANDIDATES = 4096  # entries looked at per round: a counter bumped beyond it is not followed
MARK_GENERATIONS = 2  # a dead mark written in generation g holds for rounds up to g + 2
MAX_WANT = 1 << 20  # a wanted rank at or above it is absurd


def connect(host, port, timeout=60.0):
    """A client of the job's elastic TCPStore, sealed with the job secret when there is one."""
    return _elastic_store.TcpStore(host, port).connect(timeout)


def _ignored(key, why):
    warnings.warn(f"elastic: ignored the store entry {key!r}: {why}", stacklevel=3)


def _read(store, key):
    """The value of `key` (bytes), None when absent; None with a warning naming the key when
    it is not sealed with the job secret."""
    if not store.check([key]):
        return None
    try:
        return store.get(key)
    except CorruptData as exc:
        _ignored(key, str(exc))
        return None


def _json(store, key, check):
    """The json entry at `key` when `check(entry)` accepts it (returns an error text or None);
    None, with a warning naming the key, for anything else."""
    raw = _read(store, key)
    if raw is None:
        return None
    try:
        entry = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        _ignored(key, f"not json ({bytes(raw[:40])!r})")
        return None
    why = check(entry)
    if why is not None:
        _ignored(key, why)
        return None
    return entry


def _int(store, key):
    """A non-negative integer entry, or None (absent, or ignored with a warning)."""
    raw = _read(store, key)
    if raw is None:
        return None
    try:
        value = int(bytes(raw).decode())
    except (ValueError, UnicodeDecodeError):
        value = -1
    if value < 0:
        _ignored(key, f"not a non-negative integer ({bytes(raw[:40])!r})")
        return None
    return value


def _text(v, limit=256):
    return isinstance(v, str) and 0 < len(v) <= limit


def check_member(m):
    """None when `m` is a well-formed candidate or member entry, else what is wrong."""
    if not isinstance(m, dict):
        return f"expected an object, got {type(m).__name__}"
    if not _text(m.get("id")) or not _text(m.get("host")):
        return "id and host must be non-empty strings"
    pid, want, machine = m.get("pid"), m.get("want"), m.get("machine")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 1 << 31:
        return f"pid {pid!r} is not a process id"
    if want is not None and (not isinstance(want, int) or isinstance(want, bool) or not 0 <= want < MAX_WANT):
        return f"wanted rank {want!r} is absurd (None or 0..{MAX_WANT - 1})"
    if machine is not None and not _text(machine):
        return "machine must be a string or null"
    return None


def _check_members(ms):
    if not isinstance(ms, list) or not ms:
        return "expected a non-empty list of members"
    for m in ms:
        why = check_member(m)
        if why is not None:
            return f"member {m!r}: {why}"
    if len({m["id"] for m in ms}) != len(ms):
        return "a member is listed twice"
    return None


def _check_mark(mark):
    if not isinstance(mark, dict) or not isinstance(mark.get("generation"), int) \
            or isinstance(mark.get("generation"), bool) or mark["generation"] < 0 or not _text(mark.get("reason"), 1000):
        return "expected {\"generation\": n >= 0, \"reason\": text}"
    return None


def generation(store):
    """The newest generation formed (0 before the first)."""
    return _int(store, PREFIX + "gen") or 0


class World:
    """One generation: its number, its members (dicts: id, host, pid, ...) in rank order and
    this process's rank in it."""

    def __init__(self, generation, members, me):
        self.generation = generation
        self.members = members
        self.ids = [m["id"] for m in members]
        self.rank = self.ids.index(me)
        self.size = len(members)

    def __repr__(self):
        return f"<elastic world {self.generation}: rank {self.rank} of {self.size}>"


def describe(member):
    return f"{member['id']} (host {member['host']}, pid {member['pid']})"


def _machine():
    """Names this machine's pid namespace: pids of members with the same name can be probed."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def _gone(pid):
    """True when no live process has this pid (a zombie is gone too: it cannot answer)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _store_calls(method):
    """A failed store call becomes a CommError that says where the store lives."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except PyBridgeError:
            raise
        except (RuntimeError, OSError, TimeoutError) as exc:  # torch's store errors
            raise CommError(f"elastic: {self.where.describe()} stopped answering ({classify(exc)}): the job "
                            "cannot go on without it") from exc
    return wrapper


class Membership:
    """This process's side of the rounds, over its own connection to the store (a TCPStore
    client serializes its calls: heartbeats must not wait behind a blocking get)."""

    def __init__(self, where, *, member_id=None, want=None, initial=1, min_size=1, max_size=None,
                 lost_after=10.0, timeout=300.0):
        if min_size < 1 or (max_size is not None and max_size < min_size):
            raise InvalidArgument(f"elastic world sizes: min {min_size} must be >= 1 and <= max {max_size}")
        self.where = where  # elastic_store.TcpStore or EtcdStore
        self.id = member_id or f"{socket.gethostname()}:{os.getpid()}"
        self.me = {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(), "machine": _machine(),
                   "want": want}
        self.initial = initial
        self.min_size = min_size
        self.max_size = max_size
        self.lost_after = float(lost_after)
        self.timeout = float(timeout)
        self.store = self._connect()
        self._beats = {}  # id -> (last value, when it last moved, our beats done then) as seen here
        self._beats_done = 0  # this process's beats the store took: the clock of others' silence
        self._failed = {}  # generation -> the MembershipChanged it ended with here
        self._changing = threading.Lock()  # two threads failing at once agree once
        self.world = None
        self.on_lost = None  # called (world, member, reason) from the watch thread: see _watch_neighbour
        self._watch = None  # ((generation, id) watched, its last count, when it last moved, our beats done then)
        self._finished = False
        self._stopped = threading.Event()
        self._beat_store = self._connect()
        self._beat_count = 1
        self._beat_store.set(self._key(f"hb/{self.id}"), "1")
        self._thread = threading.Thread(target=self._beat, name="pybridge-heartbeat", daemon=True)
        self._thread.start()
        # Watching has a thread and a connection of its own: a write stalled by etcd's leader
        # election (the lost node held the leader) must not hold up seeing the loss.
        self._watch_store = self._connect()
        self._watcher = threading.Thread(target=self._watch_loop, name="pybridge-watch", daemon=True)
        self._watcher.start()
        # Joined before the interpreter finalizes: a daemon thread caught inside a store
        # call then takes the process down ("terminate called without an active exception").
        atexit.register(self.close)

    def _connect(self):
        try:
            return self.where.connect(min(self.timeout, 60))
        except PyBridgeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise Timeout(f"elastic: {self.where.describe()} did not answer: {classify(exc)}") from exc

    @staticmethod
    def _key(name):
        return PREFIX + name

    def _beat(self):
        key = self._key(f"hb/{self.id}")
        while not self._stopped.wait(HEARTBEAT):
            try:
                # a sealed count (set, not add): an outsider can neither beat for a lost
                # member nor replay an older beat as a new one
                self._beat_count += 1
                self._beat_store.set(key, str(self._beat_count))
                self._beats_done += 1
            except Exception:  # noqa: BLE001 - the store is gone: every round will say so
                if self._stopped.wait(1.0):
                    return

    def _watch_loop(self):
        while not self._stopped.wait(HEARTBEAT):
            try:
                self._watch_neighbour()
            except Exception:  # noqa: BLE001 - the store is gone: every round will say so
                if self._stopped.wait(1.0):
                    return

    def _watch_neighbour(self):
        """Rank r watches rank r+1's heartbeat, so every member is watched by one other at the
        cost of one read a beat. A node lost whole leaves no launcher to mark its workers dead,
        and a collective with one of them would wait out its timeout (a cut link answers
        nothing): once the count stood still for lost_after, the watcher marks it dead and
        on_lost ends the world's calls at once (the elastic session shuts its connections)."""
        world = self.world
        if world is None or world.size < 2 or world.generation in self._failed or self._finished:
            return
        broken = self._key(f"g{world.generation}/broken")
        why = _read(self._watch_store, broken)
        if why is not None:  # another member's watcher found its neighbour lost: leave the world too
            if self.on_lost is not None:
                self.on_lost(world, None, bytes(why).decode(errors="replace"))
            return
        m = world.members[(world.rank + 1) % world.size]
        hb = _int(self._watch_store, self._key(f"hb/{m['id']}")) or 0
        now, watched = time.monotonic(), (world.generation, m["id"])
        if self._watch is None or self._watch[0] != watched or hb > self._watch[1]:
            self._watch = (watched, hb, now, self._beats_done)
            return
        stood = now - self._watch[2]
        if not self._silent_long_enough(stood, self._watch[3]):
            return
        reason = f"no heartbeat for {stood:.1f} s, seen by its neighbour {self.id} (lost with its node, stopped or cut off)"
        self._watch = (watched, float("inf"), now, self._beats_done)  # marked once
        if self.on_lost is not None:  # first what needs no store (a write may wait for a new etcd leader)
            self.on_lost(world, m, reason)
        mark_dead(self._watch_store, m["id"], reason)
        # One key the other members' watchers read: their calls waiting on other peers end too.
        self._watch_store.set(broken, f"{describe(m)} lost: {reason}")

    def close(self):
        self._stopped.set()
        for t in (self._thread, self._watcher):
            t.join(HEARTBEAT + 2.0)  # not for ever: the store may be gone

    def finish(self):
        """The training finished (elastic.run returned): a process that comes later has
        nothing to join, and the launcher starts no replacement. A store that cannot take the
        mark (etcd without a quorum) is named in a warning, not an error: the training is
        done and nothing of it depends on the mark."""
        self._finished = True  # no more watching: the members leave as they please now
        try:
            self._finish()
        except PyBridgeError as exc:
            warnings.warn(f"elastic: the training finished, but the job could not be marked finished: {exc}",
                          stacklevel=2)

    @_store_calls
    def _finish(self):
        self.store.set(self._key("done"), str(self.world.generation if self.world else 0))

    def _check_not_done(self):
        if _int(self.store, self._key("done")) is not None:  # sealed, where the job has a secret
            raise Closed("elastic: the job has already finished; there is no world to join")

    # ---- rounds ------------------------------------------------------------------------

    @_store_calls
    def first_world(self):
        """Join the job: the first generation, or (a joiner) the next one the members form."""
        return self._form(generation(self.store) + 1)

    @_store_calls
    def next_world(self, old):
        """Register for the generation after `old` and wait for it to form."""
        return self._form(old.generation + 1, old)

    @_store_calls
    def joiners_waiting(self, world):
        """Processes registered for the generation after `world` that are not in it (read by
        its rank 0 at a commit): well-formed candidate entries, not the counter, so that an
        outsider's `add` on the counter admits nobody."""
        return len([c for c in self._candidates(world.generation + 1) if c["id"] not in world.ids])

    def _form(self, n, old=None):
        deadline = time.monotonic() + self.timeout
        while True:
            self._check_not_done()
            k = int(self.store.add(self._key(f"g{n}/count"), 1))
            self.store.set(self._key(f"g{n}/cand/{k}"), json.dumps(self.me))
            members = self._wait_round(n, deadline, old)
            if self.id in [m["id"] for m in members]:
                self.world = World(n, members, self.id)
                return self.world
            # Left out: declared lost while it was away, or more candidates than max_size.
            n += 1
            old = None  # this process is a joiner now

    def _wait_round(self, n, deadline, old):
        key = self._key(f"g{n}/members")
        prev = old.members if old is not None else self._members_of(n - 1)
        while True:
            if self.store.check([key]):
                members = self._members_of(n)
                if members is not None:
                    return members
                self.store.delete_key(key)  # a forged or malformed list (named in a warning): form it anew
            cands = self._candidates(n)
            members, waiting = self._decide(n, prev, cands)
            if members is not None:
                listed = json.dumps(members)
                try:
                    won = self.store.compare_set(key, "", listed) == listed.encode()
                except CorruptData as exc:  # the key holds a forged value
                    _ignored(key, str(exc))
                    self.store.delete_key(key)
                    continue
                if won:
                    self.store.set(self._key("gen"), str(n))  # only grows: the winner of round n writes it
                continue
            self._check_not_done()
            if time.monotonic() > deadline:
                raise Timeout(f"elastic: world {n} did not form within {self.timeout:g} s: {waiting}")
            _cancel.check(f"elastic: forming world {n}")
            time.sleep(POLL)

    def _members_of(self, n):
        if n < 1:
            return None
        return _json(self.store, self._key(f"g{n}/members"), _check_members)

    def _candidates(self, n):
        """The well-formed candidate entries of round n, first registration of each id."""
        count = int(self.store.add(self._key(f"g{n}/count"), 0))
        if count > MAX_CANDIDATES:
            _ignored(self._key(f"g{n}/count"), f"{count} candidates; only the first {MAX_CANDIDATES} are read")
            count = MAX_CANDIDATES
        seen, out = set(), []
        for k in range(1, count + 1):  # a count is added before its entry is set: absent ones are skipped
            c = _json(self.store, self._key(f"g{n}/cand/{k}"), check_member)
            if c is not None and c["id"] not in seen:
                seen.add(c["id"])
                out.append(c)
        return out

    def _decide(self, n, prev, cands):
        """(members, None) when round n is complete, else (None, what it waits for)."""
        alive = [c for c in cands if self.lost_reason(c, n) is None]
        if prev is None:  # the first world: the launcher's initial count
            if len(alive) < self.initial:
                return None, f"{len(alive)} of the {self.initial} initial processes registered"
            chosen = sorted(alive, key=lambda c: (c["want"] is None, c["want"] if c["want"] is not None else 0))
        else:
            registered = {c["id"] for c in alive}
            unsettled = [m for m in prev if m["id"] not in registered and self.lost_reason(m, n) is None]
            if unsettled:
                return None, ("waiting for members of world " + str(n - 1) + " that neither came back nor "
                              "are known lost: " + ", ".join(describe(m) for m in unsettled))
            old_ids = [m["id"] for m in prev]
            survivors = sorted((c for c in alive if c["id"] in old_ids), key=lambda c: old_ids.index(c["id"]))
            chosen = survivors + [c for c in alive if c["id"] not in old_ids]
        if self.max_size is not None:
            chosen = chosen[:self.max_size]
        if len(chosen) < self.min_size:
            return None, (f"{len(chosen)} processes, below the minimum world size {self.min_size} "
                          "(the world fell below the minimum; start more workers or lower --min-world)")
        return chosen, None

    def lost_reason(self, member, n=None):
        """Why `member` counts as lost in round `n` (None: any round), or None while it may
        still be alive. A dead mark holds for the generation it was written in and the next
        MARK_GENERATIONS: a process marked dead that registers later is alive."""
        mark = _json(self.store, self._key(f"dead/{member['id']}"), _check_mark)
        if mark is not None and (n is None or n <= mark["generation"] + MARK_GENERATIONS):
            return mark["reason"]
        if member.get("machine") is not None and member["machine"] == self.me["machine"] \
                and member["id"] != self.id and _gone(member["pid"]):
            return "its process is gone"
        hb = _int(self.store, self._key(f"hb/{member['id']}")) or 0
        now = time.monotonic()
        last, since, done = self._beats.get(member["id"], (None, now, self._beats_done))
        if last is None or hb > last:  # only a higher count is a beat: an old one replayed is not
            self._beats[member["id"]] = (hb, now, self._beats_done)
            return None
        if self._silent_long_enough(now - since, done):
            return f"no heartbeat for {now - since:.1f} s (stopped, hung or cut off)"
        return None

    def _silent_long_enough(self, seconds, done_then):
        """A count that stood still for `seconds`, since this process had made `done_then`
        beats, means its owner is lost: lost_after seconds, during which this process's own
        beats went through the store about as often. While the store takes no write (etcd
        electing a leader after its leader's node was lost, a TCPStore host stalled) nobody's
        beat moves: silence then says nothing, and nobody is declared lost for it."""
        return seconds >= self.lost_after and \
            self._beats_done - done_then >= max(1, int(0.8 * self.lost_after / HEARTBEAT))

    # ---- a failure in world n: agree on world n+1 once ----------------------------------

    def changed(self, world, cause=None):
        """The MembershipChanged for leaving `world` (a failure seen in it, or joiners
        admitted at a commit): forms the next world once per generation; later calls for
        the same world return the same error."""
        with self._changing:
            err = self._failed.get(world.generation)
            if err is None:
                err = self._failed[world.generation] = self._change(world, cause)
            return err

    def change_of(self, world):
        """The MembershipChanged `world` ended with here, or None while it lives."""
        return self._failed.get(world.generation)

    def _change(self, world, cause):
        new = self.next_world(world)
        kept = set(new.ids)
        lost = [r for r, m in enumerate(world.members) if m["id"] not in kept]
        joined = len([i for i in new.ids if i not in world.ids])
        names = [describe(world.members[r]) for r in lost]
        parts = []
        if lost:
            parts.append(f"ranks {lost} lost ({'; '.join(names)})")
        if joined:
            parts.append(f"{joined} process(es) joined")
        why = f" after: {cause}" if cause is not None else ""
        err = MembershipChanged(
            f"elastic: the world changed, {', '.join(parts) or 'same members'}; world {world.generation} "
            f"of {world.size} ranks -> world {new.generation} of {new.size} (this process is rank {new.rank})"
            f"{why}. Reset onto the new world and roll back to the last commit",
            lost=lost, lost_names=names, joined=joined, old_size=world.size, new_size=new.size,
            generation=new.generation, world=new)
        return err


def mark_dead(store, member_id, reason):
    """What the launcher writes when it sees a worker exit: rounds then need not wait for the
    worker's heartbeat to go stale. The mark names the newest generation, and holds for
    rounds up to MARK_GENERATIONS after it."""
    store.set(PREFIX + f"dead/{member_id}", json.dumps({"generation": generation(store), "reason": reason}))


def finished(store):
    """True once the job's training finished (Membership.finish; sealed where the job has a
    secret, so an outsider cannot end the job)."""
    return _int(store, PREFIX + "done") is not None


def latest_ids(store):
    """The member ids of the newest world formed (empty before the first)."""
    n = generation(store)
    if n < 1:
        return []
    members = _json(store, PREFIX + f"g{n}/members", _check_members)
    return [m["id"] for m in members] if members else []
