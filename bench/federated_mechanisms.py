"""The measurement behind the federated server's completion detection on gloo (see
docs/federated.md): one thread receiving from any rank (recv_anysource) against one
listener thread per worker, both on raw torch.distributed, 4 ranks.

    python bench/federated_mechanisms.py [--trips N] [--repeat K]

Each worker sends a header and waits for the server's reply, N times; the server replies
to whoever sent. Time per trip = the server's time / all trips (3 workers at once), each
mechanism launched K times in turns. Then the same with worker 3 exiting abruptly after
5 trips: what the server sees, and when. Prints a table; saves nothing (a probe behind a
design choice, not a tracked benchmark).
"""

import argparse
import datetime
import json
import os
import queue
import re
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, launch, table  # noqa: E402

WORLD = 4
MECHANISMS = ("anysource", "per-worker")
TIMEOUT = 5.0  # the process group's timeout: how long the any-source receive waits


def gist(exc):
    """The words of a gloo error that say what happened."""
    m = re.search(r"Connection \w+ by peer|Timed out waiting \d+ms for recv operation", str(exc))
    return repr(m.group(0)) if m else repr(str(exc)[:60])


def ranks(mechanism, trips, kill, out_path):
    import torch
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT))
    pg = dist.distributed_c10d._get_default_group()
    hdr = torch.zeros(7, dtype=torch.int64)
    if rank != 0:
        for i in range(trips):
            if kill and rank == WORLD - 1 and i == 5:
                os._exit(0)  # abrupt: no shutdown, the connection just closes
            pg.send([hdr], 0, 1).wait()
            pg.recv([hdr], 0, 2).wait()
        time.sleep(1)  # let the server finish before the connections close
        os._exit(0)
    expected, got, outcome = trips * (WORLD - 1), 0, "all trips done"
    t0 = time.perf_counter()
    if mechanism == "anysource":
        while got < expected:
            work = pg.recv_anysource([hdr], 1)
            try:
                work.wait()
            except Exception as exc:  # noqa: BLE001
                outcome = f"{time.perf_counter() - t0:.1f} s, {gist(exc)}, no rank named"
                break
            got += 1
            pg.send([hdr], work._source_rank(), 2).wait()
    else:
        events = queue.Queue()

        def listen(src):
            h = torch.zeros(7, dtype=torch.int64)
            for _ in range(trips):
                try:
                    pg.recv([h], src, 1).wait()
                except Exception as exc:  # noqa: BLE001
                    events.put((src, exc))
                    return
                events.put((src, None))
        for src in range(1, WORLD):
            threading.Thread(target=listen, args=(src,), daemon=True).start()
        done = dict.fromkeys(range(1, WORLD), 0)
        while got < expected:
            src, exc = events.get(timeout=3 * TIMEOUT)
            if exc is not None:  # serve the others to the end
                outcome = f"{time.perf_counter() - t0:.1f} s, {gist(exc)}, in rank {src}'s thread"
                expected -= trips - done[src]
                continue
            got += 1
            done[src] += 1
            pg.send([hdr], src, 2).wait()
    seconds = time.perf_counter() - t0
    with open(out_path, "w") as f:
        json.dump({"trips": got, "us_per_trip": seconds / max(got, 1) * 1e6, "outcome": outcome}, f)
    os._exit(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=300, help="round trips per worker (default 300)")
    parser.add_argument("--repeat", type=int, default=5, help="launches per mechanism for the timing (default 5)")
    parser.add_argument("--ranks", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ranks:
        mechanism, kill, out = args.ranks
        return ranks(mechanism, args.trips, kill == "kill", out)
    tmp = os.path.join(ROOT, "build", "bench-federated-mechanisms.json")
    os.makedirs(os.path.dirname(tmp), exist_ok=True)
    def run(mechanism, kill):
        launch([sys.executable, __file__, "--trips", str(args.trips), "--ranks", mechanism, kill or "-", tmp],
               WORLD, 120)
        with open(tmp) as f:
            return json.load(f)

    speed = {m: [] for m in MECHANISMS}
    for _ in range(args.repeat):  # the mechanisms take turns: machine noise hits both
        for m in MECHANISMS:
            speed[m].append(run(m, "")["us_per_trip"])
    rows = []
    for m in MECHANISMS:
        us = sorted(speed[m])
        rows.append([m, "-", f"{statistics.median(us):.0f} us ({us[0]:.0f}-{us[-1]:.0f})", "all trips done"])
        rows.append([m, "worker 3 exits after 5 trips", "", run(m, "kill")["outcome"]])
    print(f"\n{WORLD} ranks, gloo, {args.trips} header round trips per worker; group timeout {TIMEOUT:g} s")
    print(table(["mechanism", "fault", "time per trip: median (range)", "server sees"], rows))


if __name__ == "__main__":
    main()
