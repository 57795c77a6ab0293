"""Preemption: stop every rank at the same step when a scheduler warns, save, and exit with
a status the job script requeues on.

A scheduler warns before it kills: SLURM sends SIGUSR1 (`--signal=USR1@120`) or SIGTERM at
the time limit or on preemption, Kubernetes SIGTERM. The signal reaches the ranks at
slightly different moments, and some ranks may not get it at all (only the launcher, or
only one node), so a rank that saw it must not simply stop: the others would wait for it
in the next collective. Each step the ranks therefore ask together whether any of them saw
it (`any_rank`, one allreduce(max) of one integer), and all stop after the same step, save
the same checkpoint and exit with REQUEUE (75, EX_TEMPFAIL: "try again"), which the job
script or pybridge-launch turns into a requeue:

    watch = pybridge.runtime.preempt.Preemption()        # SIGUSR1 and SIGTERM
    for step in range(start, steps):
        train_one_step()
        if watch.should_stop():                          # every rank, every step
            checkpoint.save(folder, step + 1, model=model, optimizer=opt)
            sys.exit(preempt.REQUEUE)

C and Go programs catch the signal their own way (sigaction; Go's signal.NotifyContext:
Python can install handlers only on the main thread, and Go's runtime owns a Go program's
signals) and ask with pb_any_rank / AnyRank.
"""

import os
import signal
import threading

import torch

from .. import abi
from ..comm import collectives
from ..comm import world as _world
from ..errors import InvalidArgument

REQUEUE = abi.PB_EXIT_REQUEUE  # 75, EX_TEMPFAIL (sysexits.h): the job saved its state and wants to run again
DEFAULT_SIGNALS = ("SIGUSR1", "SIGTERM")
PENDING = "PYBRIDGE_PREEMPTED"  # set by pybridge-launch for workers it starts after a warning


def signal_numbers(names):
    """'SIGUSR1,SIGTERM' (or a list; 'USR1' also works) -> [signal numbers]."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out = []
    for name in names:
        if isinstance(name, int):
            out.append(signal.Signals(name))
            continue
        full = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
        try:
            out.append(signal.Signals[full])
        except KeyError:
            raise InvalidArgument(f"unknown signal {name!r} (e.g. SIGUSR1, SIGTERM)") from None
    if not out:
        raise InvalidArgument("no signal to watch for preemption")
    return out


def any_rank(flag, *, group=None):
    """True on every member if `flag` is true on any of them: a collective (one allreduce
    of one integer, max), called by every member at the same point."""
    g = group or _world.current()
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=g.device)
    collectives.all_reduce(t, collectives.MAX, group=g)
    return bool(t.item())


class Preemption:
    """Watch for the scheduler's warning signals (default SIGUSR1 and SIGTERM; from the
    main thread). `requested` is the first one seen on this rank, or the one pybridge-launch
    received before it started this worker (PYBRIDGE_PREEMPTED); should_stop() asks every
    rank. close() puts the previous handlers back."""

    def __init__(self, signals=DEFAULT_SIGNALS):
        if threading.current_thread() is not threading.main_thread():
            raise InvalidArgument("Preemption() installs signal handlers, which Python allows only on the main "
                                  "thread; from other threads (and C or Go programs) catch the signal yourself "
                                  "and ask any_rank()")
        self.requested = None
        self._previous = {}
        nums = signal_numbers(signals)
        for num in nums:
            self._previous[num] = signal.signal(num, self._seen)
        # A warning pybridge-launch received before it started this worker (launch/exits.py).
        pending = os.environ.get(PENDING, "")
        if pending in {n.name for n in nums}:
            self.requested = pending

    def _seen(self, num, frame):
        if self.requested is None:
            self.requested = signal.Signals(num).name

    def should_stop(self, *, group=None):
        """Did any rank see the signal? A collective: every rank calls it at the same step
        (every step, or every N steps alike on all ranks: `step % N == 0 and should_stop()`)."""
        return any_rank(self.requested is not None, group=group)

    def close(self):
        for num, previous in self._previous.items():
            signal.signal(num, previous)
        self._previous = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
