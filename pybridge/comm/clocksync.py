"""Each rank's clock against rank 0's, measured at init when the rank records a trace
(observe/), so the ranks' traces merge on rank 0's time line.

Rank 0 answers each other rank in turn: the rank sends its time t1, rank 0 replies with
its time t2, the rank reads t3 on arrival. With the message taking as long each way, the
offset (this clock minus rank 0's) is (t1 + t3) / 2 - t2, and it is off by at most half
the round trip; the round with the shortest round trip is kept (NTP's rule).

Part of making the group (group.init calls it, before the group is handed out), so its
messages go straight to the backend, as init's other lifecycle calls do, not through
collectives.py: they are not the program's, and point-to-point messages take no number.
"""

import torch

from ..observe import clock

ROUNDS = 8
TAG = 0x7062_7463  # "pbtc": apart from the tags a program uses at init


def measure(g, rounds=ROUNDS):
    """(offset µs, uncertainty µs) of this rank's clock against rank 0's of group g; every
    member calls it (rank 0 answers the others)."""
    if g.size == 1:
        return 0.0, 0.0
    buf = torch.zeros(1, dtype=torch.float64)
    if g.rank == 0:
        for peer in range(1, g.size):
            for _ in range(rounds):
                g.pg.recv([buf], peer, TAG).wait()
                buf[0] = clock.now_us()
                g.pg.send([buf], peer, TAG).wait()
        return 0.0, 0.0
    best = None
    for _ in range(rounds):
        t1 = clock.now_us()
        buf[0] = t1
        g.pg.send([buf], 0, TAG).wait()
        g.pg.recv([buf], 0, TAG).wait()
        t3 = clock.now_us()
        rtt = t3 - t1
        if best is None or rtt < best[1]:
            best = ((t1 + t3) / 2 - float(buf[0]), rtt)
    return best[0], best[1] / 2
