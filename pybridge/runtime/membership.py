"""Who is in an elastic job: numbered worlds ("generations") agreed on in rounds over a store
that outlives every worker (hosted by pybridge-launch --elastic, see docs/elastic.md).

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

Keys, under pybridge/elastic/: gen (the newest generation, 0 before the first), hb/<id>,
dead/<id>, g<n>/count, g<n>/cand/<k> (json), g<n>/members (json, rank order).
"""

import atexit
import datetime
import functools
import json
import os
import socket
import threading
import time

import torch.distributed as dist

from ..errors import Closed, CommError, InvalidArgument, MembershipChanged, PyBridgeError, Timeout, classify

PREFIX = "pybridge/elastic/"
HEARTBEAT = 0.2  # seconds between two beats
POLL = 0.02  # seconds between two looks at a round


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
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
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
        except Exception as exc:  # noqa: BLE001 - torch's store errors
            host, port = self.address
            raise CommError(f"elastic: the store at {host}:{port} (hosted by pybridge-launch --elastic on "
                            f"node 0) stopped answering ({classify(exc)}): the job cannot go on without it") from exc
    return wrapper


class Membership:
    """This process's side of the rounds, over its own connection to the store (a TCPStore
    client serializes its calls: heartbeats must not wait behind a blocking get)."""

    def __init__(self, host, port, *, member_id=None, want=None, initial=1, min_size=1, max_size=None,
                 lost_after=10.0, timeout=300.0):
        if min_size < 1 or (max_size is not None and max_size < min_size):
            raise InvalidArgument(f"elastic world sizes: min {min_size} must be >= 1 and <= max {max_size}")
        self.address = (host, port)
        self.id = member_id or f"{socket.gethostname()}:{os.getpid()}"
        self.me = {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(), "machine": _machine(),
                   "want": want}
        self.initial = initial
        self.min_size = min_size
        self.max_size = max_size
        self.lost_after = float(lost_after)
        self.timeout = float(timeout)
        self.store = self._connect()
        self._beats = {}  # id -> (last value, when it last moved) as seen here
        self._failed = {}  # generation -> the MembershipChanged it ended with here
        self._changing = threading.Lock()  # two threads failing at once agree once
        self.world = None
        self._stopped = threading.Event()
        self._beat_store = self._connect()
        self._beat_store.add(self._key(f"hb/{self.id}"), 1)
        self._thread = threading.Thread(target=self._beat, name="pybridge-heartbeat", daemon=True)
        self._thread.start()
        # Joined before the interpreter finalizes: a daemon thread caught inside a store
        # call then takes the process down ("terminate called without an active exception").
        atexit.register(self.close)

    def _connect(self):
        host, port = self.address
        try:
            return dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=min(self.timeout, 60)),
                                 wait_for_workers=False)
        except Exception as exc:  # noqa: BLE001
            raise Timeout(f"elastic: the rendezvous store at {host}:{port} (hosted by pybridge-launch "
                          f"--elastic on node 0) did not answer: {classify(exc)}") from exc

    @staticmethod
    def _key(name):
        return PREFIX + name

    def _beat(self):
        key = self._key(f"hb/{self.id}")
        while not self._stopped.wait(HEARTBEAT):
            try:
                self._beat_store.add(key, 1)
            except Exception:  # noqa: BLE001 - the store is gone: every round will say so
                if self._stopped.wait(1.0):
                    return

    def close(self):
        self._stopped.set()
        self._thread.join(HEARTBEAT + 2.0)  # not for ever: the store may be gone

    @_store_calls
    def finish(self):
        """The training finished (elastic.run returned): a process that comes later has
        nothing to join, and the launcher starts no replacement."""
        self.store.set(self._key("done"), str(self.world.generation if self.world else 0))

    def _check_not_done(self):
        if self.store.check([self._key("done")]):
            raise Closed("elastic: the job has already finished; there is no world to join")

    # ---- rounds ------------------------------------------------------------------------

    @_store_calls
    def first_world(self):
        """Join the job: the first generation, or (a joiner) the next one the members form."""
        n = int(self.store.add(self._key("gen"), 0)) + 1
        return self._form(n)

    @_store_calls
    def next_world(self, old):
        """Register for the generation after `old` and wait for it to form."""
        return self._form(old.generation + 1, old)

    @_store_calls
    def joiners_waiting(self, world):
        """Candidates registered for the generation after `world` (read by its rank 0 at a commit)."""
        return int(self.store.add(self._key(f"g{world.generation + 1}/count"), 0))

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
                return json.loads(self.store.get(key))
            cands = self._candidates(n)
            members, waiting = self._decide(n, prev, cands)
            if members is not None:
                listed = json.dumps(members)
                if self.store.compare_set(key, "", listed) == listed.encode():
                    self.store.set(self._key("gen"), str(n))  # only grows: the winner of round n writes it
                continue
            self._check_not_done()
            if time.monotonic() > deadline:
                raise Timeout(f"elastic: world {n} did not form within {self.timeout:g} s: {waiting}")
            time.sleep(POLL)

    def _members_of(self, n):
        if n < 1:
            return None
        key = self._key(f"g{n}/members")
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def _candidates(self, n):
        count = int(self.store.add(self._key(f"g{n}/count"), 0))
        keys = [self._key(f"g{n}/cand/{k}") for k in range(1, count + 1)]
        present = [k for k in keys if self.store.check([k])]  # a count is added before its entry is set
        seen, out = set(), []
        for raw in (self.store.multi_get(present) if present else []):
            c = json.loads(raw)
            if c["id"] not in seen:
                seen.add(c["id"])
                out.append(c)
        return out

    def _decide(self, n, prev, cands):
        """(members, None) when round n is complete, else (None, what it waits for)."""
        alive = [c for c in cands if self.lost_reason(c) is None]
        if prev is None:  # the first world: the launcher's initial count
            if len(alive) < self.initial:
                return None, f"{len(alive)} of the {self.initial} initial processes registered"
            chosen = sorted(alive, key=lambda c: (c["want"] is None, c["want"] if c["want"] is not None else 0))
        else:
            registered = {c["id"] for c in alive}
            unsettled = [m for m in prev if m["id"] not in registered and self.lost_reason(m) is None]
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

    def lost_reason(self, member):
        """Why `member` counts as lost, or None while it may still be alive."""
        dead = self._key(f"dead/{member['id']}")
        if self.store.check([dead]):
            return self.store.get(dead).decode()
        if member.get("machine") is not None and member["machine"] == self.me["machine"] \
                and member["id"] != self.id and _gone(member["pid"]):
            return "its process is gone"
        hb = int(self.store.add(self._key(f"hb/{member['id']}"), 0))
        now = time.monotonic()
        last, since = self._beats.get(member["id"], (None, now))
        if hb != last:
            self._beats[member["id"]] = (hb, now)
            return None
        if now - since >= self.lost_after:
            return f"no heartbeat for {now - since:.1f} s (stopped, hung or cut off)"
        return None

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
    worker's heartbeat to go stale."""
    store.set(PREFIX + f"dead/{member_id}", reason)


def finished(store):
    """True once the job's training finished (Membership.finish)."""
    return store.check([PREFIX + "done"])


def latest_ids(store):
    """The member ids of the newest world formed (empty before the first)."""
    n = int(store.add(PREFIX + "gen", 0))
    if n < 1:
        return []
    return [m["id"] for m in json.loads(store.get(PREFIX + f"g{n}/members"))]
