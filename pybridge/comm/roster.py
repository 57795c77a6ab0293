"""Who each rank is: published in the rendezvous store at init, checked for agreement
(world size, checked mode), and used to name ranks in errors ("rank 1 (host a, pid 42)").

Joining through the roster is the rendezvous barrier: a rank waits for every rank's
entry, so a rank that never joins is named, and ranks that disagree on the world size
or on checked mode all fail at once instead of one of them succeeding.
"""

import json
import os
import socket
import time

from ..base import agree
from . import cancel as _cancel
from ..errors import InvalidArgument, Timeout

# Keyed by torchrun's restart count too: a restarted job (possibly with another world
# size) must not read the entries of the previous attempt should the store outlive it.
_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
_KEY = "pybridge/who/" + _ATTEMPT + "/{}"
_VERDICT = "pybridge/who/" + _ATTEMPT + "/{}/verdict"


def me(rank, world_size, checked, watchdog):
    entry = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(),
             "world_size": world_size, "checked": bool(checked), "watchdog": bool(watchdog)}
    # Across nodes the hostname may not tell them apart (containers, namespaces): the
    # launcher's node rank and the address the ranks talk on do.
    node, per_node = os.environ.get("GROUP_RANK", ""), os.environ.get("LOCAL_WORLD_SIZE", "")
    if node.isdigit() and per_node.isdigit() and int(per_node) < world_size:
        entry["node"] = int(node)
        ifname = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
        if ifname:
            from ..base import netif
            entry["address"] = netif.ipv4_of(ifname)
    return entry


def describe(entry):
    """'rank 1 (host a, pid 42)' ('rank 1 (host a 10.0.0.2, node 1, pid 42)' across nodes),
    or 'rank 1' when nothing is known about it."""
    if not isinstance(entry, dict):
        return f"rank {entry}"
    host = entry["host"] + (f" {entry['address']}" if entry.get("address") else "")
    node = f", node {entry['node']}" if "node" in entry else ""
    return f"rank {entry['rank']} (host {host}{node}, pid {entry['pid']})"


def join(store, mine, timeout):
    """Publish this rank's entry and wait for every rank's; return the entries by rank.

    Raises InvalidArgument naming the ranks when entries disagree (every rank that sees
    the disagreement raises), Timeout naming the ranks that never joined."""
    rank, size = mine["rank"], mine["world_size"]
    store.set(_KEY.format(rank), json.dumps(mine))
    have = {rank: mine}
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        # size + 1: a rank that believes the world is larger than ours shows up there
        for r in range(size + 1):
            if r not in have and store.check([_KEY.format(r)]):
                have[r] = json.loads(store.get(_KEY.format(r)))
        try:
            _check(have)
        except InvalidArgument:
            _leave(store, rank, have, "mismatch")
            raise
        if len(have) >= size:
            store.set(_VERDICT.format(rank), "ok")
            return [have[r] for r in range(size)]
        if time.monotonic() > deadline:
            missing = [r for r in range(size) if r not in have]
            joined = ", ".join(describe(have[r]) for r in sorted(have))
            _leave(store, rank, have, "timeout")
            raise Timeout(f"init: ranks {missing} never joined within {timeout:g} s "
                          f"(world size {size}); joined: {joined}")
        _cancel.check("init, while waiting for the other ranks")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _check(have):
    """Entries heard so far that disagree on a setting every rank must share: InvalidArgument
    ('init: ranks disagree on the world size: rank 0 world size 2; rank 1 world size 3')."""
    for field, what in (("world_size", "world size"), ("checked", "checked mode")):
        agree.check(f"init: ranks disagree on the {what}", {r: e[field] for r, e in have.items()},
                    describe=lambda v, what=what: f"{what} {_show(v)}",
                    hint=". Every rank must pass the same world size and options")


def _show(v):
    return ("on" if v else "off") if isinstance(v, bool) else str(v)


def _leave(store, rank, have, verdict):
    store.set(_VERDICT.format(rank), verdict)
    if rank == 0:
        # Rank 0 hosts the store: give the others a moment to read the entries before
        # this process (and the store with it) may go away.
        deadline = time.monotonic() + 3.0
        others = [_VERDICT.format(r) for r in have if r != 0]
        while others and time.monotonic() < deadline and not store.check(others):
            time.sleep(0.01)
