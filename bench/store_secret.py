"""What the job secret costs on store operations (pybridge/base/secret.py).

    python bench/store_secret.py [--ops N] [--size BYTES]

One TCPStore hosted in this process on loopback, one client connection: set, get, check
and add round trips, plain and through SealedStore (key names hashed, values encrypted and
authenticated), median microseconds per operation over N operations (after a warm-up),
side by side. Also the cost of sealing and opening alone (no store). Values of BYTES bytes
(default 200: a membership entry or a gloo address is about that size).
Writes bench/results/store_secret.json.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import free_port, save, table  # noqa: E402

import torch.distributed as dist  # noqa: E402

from pybridge.base import netif  # noqa: E402
from pybridge.base.sealed_store import SealedStore  # noqa: E402
from pybridge.base.secret import Seal  # noqa: E402

SECRET = b"bench-store-secret-0123456789abcdef"


def per_op(fn, n):
    """Median of 5 batches of n // 5 calls: microseconds per call."""
    fn(0)
    batches = []
    for b in range(5):
        t = time.perf_counter()
        for i in range(n // 5):
            fn(i)
        batches.append((time.perf_counter() - t) / (n // 5) * 1e6)
    return statistics.median(batches)


def ops(store, value, n):
    store.set("k0", value)
    return {"set": per_op(lambda i: store.set(f"k{i % 64}", value), n),
            "get": per_op(lambda i: store.get("k0"), n),
            "check": per_op(lambda i: store.check(["k0"]), n),
            "add": per_op(lambda i: store.add("counter", 1), n)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=5000)
    ap.add_argument("--size", type=int, default=200)
    args = ap.parse_args(argv)
    port = free_port()
    fd = netif.listener("127.0.0.1", port).detach()
    server = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=30), wait_for_workers=False,
                           master_listen_fd=fd)
    client = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=30), wait_for_workers=False)
    value = os.urandom(args.size)
    plain = ops(dist.PrefixStore("plain", client), value, args.ops)
    sealed = ops(SealedStore(client, SECRET, "sealed"), value, args.ops)
    seal = Seal(SECRET)
    box = seal.seal("k", value)
    local = {"seal": per_op(lambda i: seal.seal("k", value), args.ops),
             "open": per_op(lambda i: seal.open("k", box), args.ops)}
    rows = [[op, f"{plain[op]:.1f}", f"{sealed[op]:.1f}", f"{sealed[op] - plain[op]:+.1f}"] for op in plain]
    rows += [[f"{op} alone (no store)", "-", f"{us:.1f}", f"{us:+.1f}"] for op, us in local.items()]
    print(f"store operations on loopback, {args.size}-byte values, median of 5 x {args.ops // 5} (us per op)")
    print(table(["operation", "plain (PrefixStore)", "sealed (SealedStore)", "difference"], rows))
    save("store_secret", {"plain_us": plain, "sealed_us": sealed, "local_us": local, "value_bytes": args.size,
                          "ops": args.ops})
    del client, server


if __name__ == "__main__":
    main()
