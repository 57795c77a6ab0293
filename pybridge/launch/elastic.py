"""pybridge-launch --elastic: the launcher's own supervision, in which a worker's death does
not end the others (docs/elastic.md).

torchrun's agent stops every worker when one fails and restarts them all; here the launcher
only watches. The job's store is etcd with --rdzv-backend etcd (no launcher is special: any
node may die, and a node that comes back joins by the same command), else a TCPStore that
the launcher of node 0 hosts, so the store outlives every worker, rank 0 included (the job
ends if that launcher dies). When a worker exits, its
launcher marks it dead in the store at once (the survivors' next world need not wait for
its heartbeat to go stale), optionally starts a replacement in its slot (a joiner, admitted
at the survivors' next commit), and stops the job with a clear message when too few workers
are left on a single node to reach --min-world.
"""

import os
import subprocess
import sys
import time

from ..errors import InvalidArgument
from ..runtime import membership
from .exits import PROG, signal_exit


def _how(code):
    return f"exited with code {code}" if code >= 0 else signal_exit(code)


class Supervisor:
    """The workers of this node: one slot per local rank, each run by one process at a time."""

    def __init__(self, command, *, nproc, node_rank, nnodes, where, min_world, max_world, replace,
                 monitor_interval, shutdown_timeout, hosting):
        self.command = command
        self.nproc, self.node_rank, self.nnodes = nproc, node_rank, nnodes
        self.where = where  # runtime/elastic_store.py: TcpStore or EtcdStore
        self.min_world, self.max_world = min_world, max_world
        self.replacements = replace
        self.interval, self.shutdown_timeout = monitor_interval, shutdown_timeout
        # Node 0's launcher hosts the TCPStore; with etcd every launcher is a client
        self.store = where.serve() if hosting else where.connect(60)
        if membership.finished(self.store):
            raise InvalidArgument(f"{where.describe()} holds a job that already finished: give this job "
                                  "another id (--rdzv-id)")
        if node_rank is None:  # etcd, no --node-rank: numbered by arrival (a node that comes later joins)
            self.node_rank = node_rank = int(self.store.add(f"{membership.PREFIX}launcher/nodes", 1)) - 1
        # This launcher's incarnation on its node: a node that comes back (a replacement, by the
        # same command) names its workers apart from the dead ones, which the others may still list.
        n = int(self.store.add(f"{membership.PREFIX}launcher/node{node_rank}", 1))
        self.name = f"node{node_rank}" + (f"r{n - 1}" if n > 1 else "")
        self.procs = {}  # slot -> (id, Popen)
        self.incarnation = {}
        self.finished, self.lost, self.replaced = [], [], []
        self.failed_at_end = False  # a worker failed after others had finished: the job did not end well

    def _start(self, slot):
        k = self.incarnation.get(slot, -1) + 1
        self.incarnation[slot] = k
        wid = f"{self.name}-slot{slot}-{k}"
        env = dict(os.environ)
        env.update(RANK=str(self.node_rank * self.nproc + slot), LOCAL_RANK=str(slot),
                   WORLD_SIZE=str(self.nnodes * self.nproc), LOCAL_WORLD_SIZE=str(self.nproc),
                   GROUP_RANK=str(self.node_rank), PYBRIDGE_ELASTIC="1", PYBRIDGE_ELASTIC_ID=wid,
                   PYBRIDGE_ELASTIC_MIN=str(self.min_world), **self.where.worker_env())
        # Not a restart of the job (the roster keys its entries by that count): each world
        # has keys of its own, and the id says which incarnation of the slot this is.
        env.pop("TORCHELASTIC_RESTART_COUNT", None)
        if self.max_world:
            env["PYBRIDGE_ELASTIC_MAX"] = str(self.max_world)
        if self.nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        self.procs[slot] = (wid, subprocess.Popen(self.command, env=env))
        return wid

    def run(self):
        for slot in range(self.nproc):
            self._start(slot)
        print(f"{PROG}: elastic: {self.nproc} worker(s) on node {self.node_rank}; the job's store is "
              f"{self.where.describe()}; min world {self.min_world}"
              + (f", max {self.max_world}" if self.max_world else "")
              + (f", {self.replacements} replacement(s)" if self.replacements else ""),
              file=sys.stderr, flush=True)
        while self.procs:
            time.sleep(self.interval)
            for slot, (wid, p) in list(self.procs.items()):
                code = p.poll()
                if code is None:
                    continue
                del self.procs[slot]
                how = _how(code)
                self._quietly(membership.mark_dead, self.store, wid,
                              f"{how} (seen by the launcher of node {self.node_rank})")
                if code == 0:
                    self.finished.append(wid)
                    continue
                self.lost.append((wid, how))
                ending = bool(self.finished) or self._quietly(membership.finished, self.store, default=True)
                # Dying after others finished fails the job, unless the worker had already
                # been left out of the world (declared lost while it was stopped, say).
                self.failed_at_end = self.failed_at_end or (ending and self._in_latest_world(wid))
                msg = f"{PROG}: worker {wid} (local rank {slot}) {how}"
                if not ending and self.replacements > 0:
                    self.replacements -= 1
                    new = self._start(slot)
                    self.replaced.append(new)
                    print(f"{msg}; the others go on, and {new} replaces it (it joins at their next commit)",
                          file=sys.stderr, flush=True)
                else:
                    print(f"{msg}; the others go on without it", file=sys.stderr, flush=True)
                if self.nnodes == 1 and not ending and 0 < len(self.procs) < self.min_world:
                    print(f"{PROG}: the world fell below the minimum size: {len(self.procs)} worker(s) left, "
                          f"--min-world {self.min_world}; stopping the job", file=sys.stderr, flush=True)
                    self.stop()
                    return 1
        return self._summary()

    @staticmethod
    def _quietly(fn, *args, default=None):
        """A store call that may find the store gone (node 0's launcher ends the job when its
        workers are done: another node's workers exit after it): `default` then."""
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - torch's store errors
            return default

    def _in_latest_world(self, wid):
        try:
            return wid in membership.latest_ids(self.store)
        except Exception:  # noqa: BLE001 - no world formed yet, or the store is gone
            return True

    def _summary(self):
        lost = "; ".join(f"{w} {how}" for w, how in self.lost)
        print(f"{PROG}: elastic job on node {self.node_rank} ended: {len(self.finished)} worker(s) finished, "
              f"{len(self.lost)} lost" + (f" ({lost})" if lost else "")
              + (f", {len(self.replaced)} replaced" if self.replaced else ""), file=sys.stderr, flush=True)
        # A success when the job finished: workers lost before the end were survived.
        return 0 if self.finished and not self.failed_at_end else 1

    def stop(self):
        procs = [p for _, p in self.procs.values()]
        for p in procs:
            p.terminate()
        deadline = time.monotonic() + self.shutdown_timeout
        for p in procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = {}
