"""The communication core: groups and subgroups, the collectives (every collective and
point-to-point message pybridge issues), checked mode, the watchdog, the roster, the
rendezvous, agreement checks, CUDA streams, sockets and parameter broadcast.

Importing any module of this package loads `subgroups`, which gives `Group` its `split`
method: a split needs a collective, and the collectives need the group below them. It
loads `world` too, which answers for the lifecycle names group.py held before
(`pybridge.comm.group.init`, deprecated).
"""

from . import subgroups  # noqa: F401  (Group.split)
from . import world  # noqa: F401  (the old names in group.py)
