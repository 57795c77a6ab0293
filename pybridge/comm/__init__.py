"""The communication core: groups and subgroups, the collectives (every collective and
point-to-point message pybridge issues), checked mode, the watchdog, the roster, the
rendezvous, agreement checks, CUDA streams, sockets and parameter broadcast.

Importing any module of this package loads `subgroups`, which gives `Group` its `split`
method: a split needs a collective, and the collectives need the group below them.
"""

from . import subgroups  # noqa: F401  (Group.split)
