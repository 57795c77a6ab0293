"""How the launcher's workers exited: when, to the millisecond (Linux pidfds), and how to say it.

The launcher needs it to name the rank that failed first: torchrun notices exits only when
it polls (every --monitor-interval) and stamps them with whole seconds, so a rank that was
killed and the ranks that failed a few milliseconds later because of it look simultaneous.
A thread finds new children in /proc and waits on a pidfd for each, which becomes readable
the moment the process dies, before torchrun reaps it. Where pidfds or /proc are missing,
exit_time() answers None and the launcher falls back to torchrun's order.
"""

import glob
import os
import select
import signal
import threading
import time

from ..abi import PB_EXIT_REQUEUE

PROG = "pybridge-launch"  # how the launcher names itself in every message
SCAN_INTERVAL = 0.02  # seconds between looks for new children; exits are seen at once


REQUEUE = PB_EXIT_REQUEUE  # 75: workers that saved on a scheduler's warning (runtime/preempt.py)
# SIGUSR1 kills a process by default: SLURM's warning (--signal=USR1@120) must not kill the
# launcher, which passes it to its workers (they may have received it too: twice is harmless).
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)


def children():
    """This process's child pids (Linux /proc; an empty set elsewhere)."""
    pids = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(path) as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:  # the thread ended meanwhile
            pass
    return pids


# A warning that came before the launcher had started any worker, for the workers it starts:
# Preemption() (runtime/preempt.py) reads it as a warning already received.
PENDING = "PYBRIDGE_PREEMPTED"


def forward_signals(signals=FORWARDED):
    """Pass `signals` on to every child instead of dying of them. Installed first thing in
    main(), before torch is imported: under a real SLURM a requeued job's warning came 3 s
    after it started and killed the launcher (exit 138). A signal that finds no child yet
    is kept in os.environ[PENDING] (its name), which the workers started later inherit."""
    def forward(num, frame):
        pids = children()
        if not pids:
            os.environ.setdefault(PENDING, signal.Signals(num).name)
        for pid in pids:
            try:
                os.kill(pid, num)
            except ProcessLookupError:
                pass
    for num in signals:
        signal.signal(num, forward)


class ExitClock:
    def __init__(self):
        self._times = {}  # pid -> time.monotonic() when it exited
        self._fds = {}  # pid -> pidfd of a child still running
        self._listed = set()  # the children listed by the previous scan
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        if hasattr(os, "pidfd_open") and os.path.isdir(f"/proc/{os.getpid()}/task"):
            self._thread = threading.Thread(target=self._run, name="pybridge-exit-clock", daemon=True)
            self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def exit_time(self, pid):
        """time.monotonic() when child `pid` exited, or None if that was not seen."""
        with self._lock:
            return self._times.get(pid)

    def _watch_new(self, poller, by_fd):
        listed = children()
        for pid in listed - set(self._fds):
            if pid in self._times and pid in self._listed:
                continue  # the zombie whose exit is already recorded
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # reaped meanwhile
                continue
            with self._lock:
                self._times.pop(pid, None)  # a new process that reuses an old pid
            self._fds[pid], by_fd[fd] = fd, pid
            poller.register(fd, select.POLLIN)
        self._listed = listed

    def _run(self):
        poller, by_fd = select.poll(), {}
        while not self._stop.is_set():
            self._watch_new(poller, by_fd)
            ready = poller.poll(SCAN_INTERVAL * 1000)
            now = time.monotonic()  # exits seen in one wake-up are simultaneous for us
            for fd, _ in ready:
                pid = by_fd.pop(fd)
                poller.unregister(fd)
                os.close(self._fds.pop(pid))
                with self._lock:
                    self._times[pid] = now


def signal_exit(code):
    """How a worker killed by a signal (negative exit code) exited, in words."""
    try:
        return f"was killed by signal {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"
