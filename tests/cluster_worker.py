"""One rank of the multi-node test (tests/test_cluster.py), started by pybridge-launch in
every node of a simulated cluster (pybridge/testing/cluster.py). Prints one line
`RESULT {json}` with what it saw; the test compares the ranks' lines.

Usage: cluster_worker.py DATA_DIR   (RecordIO shards written by the test, shared by all)
"""

import glob
import os
import sys

import torch

import pybridge
from pybridge.base import netif
from pybridge import recordio as rio
from pybridge.federated import FedAvg, Server, Worker
from pybridge.algorithms.gossip import GossipState

import result_line  # tests/, beside this script


def main(data):
    g = pybridge.init(timeout=60)
    node = int(os.environ["GROUP_RANK"])
    res = {"rank": g.rank, "node": node, "ifname": os.environ.get("GLOO_SOCKET_IFNAME")}

    x = torch.full((1000,), float(g.rank))
    pybridge.all_reduce(x)
    y = torch.full((3,), float(g.rank))
    pybridge.broadcast(y, g.size - 1)
    res["sum"], res["bcast"] = x[0].item(), y[0].item()

    # node_groups() against the real nodes: every member of the intra-node group has
    # this node's address (the one facing node 0).
    intra, cross = pybridge.node_groups()
    me = int(netif.local_address_towards(os.environ["MASTER_ADDR"]).rsplit(".", 1)[1])
    octets = torch.zeros(intra.size, dtype=torch.int64)
    pybridge.all_gather(torch.tensor([me]), octets, group=intra)
    res["intra"], res["cross"] = list(intra.ranks), list(cross.ranks)
    res["intra_octets"], res["octet"] = octets.tolist(), me

    red = pybridge.Reducer([(5, "float32"), (3, "float64")], bucket_cap_mb=1e-5)
    for i in (1, 0):
        red.grad(i).fill_(g.rank)
        red.mark_ready(i)
    red.wait()
    res["reduced"] = [red.grad(0)[0].item(), red.grad(1)[0].item()]
    red.close()

    gossip = GossipState()  # ranks per node: the launcher's
    res["gossip_nodes"] = gossip.num_nodes
    gossip.close()

    files = sorted(glob.glob(os.path.join(data, "*.recordio")))
    for partition in ("static", "dynamic"):
        seen = []
        with rio.Loader(files, 4, partition=partition, shuffle=True, seed=1) as loader:
            for batch in loader:
                seen += [int(r.decode()) for r in batch]
        counts = torch.zeros(g.size, dtype=torch.int64)
        pybridge.all_gather(torch.tensor([len(seen)]), counts)
        everyone = torch.zeros(int(counts.max()) * g.size, dtype=torch.int64)
        mine = torch.full((int(counts.max()),), -1, dtype=torch.int64)
        mine[: len(seen)] = torch.tensor(seen, dtype=torch.int64)
        pybridge.all_gather(mine, everyone)
        res[partition] = sorted(v for v in everyone.tolist() if v >= 0)

    # Federated: rank 0 serves two rounds of 6 clients; the others train.
    if g.rank == 0:
        param = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
        avg = FedAvg([param])
        with Server(g, timeout=60) as server:
            for _ in range(2):
                for r in server.run_round(range(6), avg.vector()):
                    avg.add(r)
                avg.step()
        res["federated"] = param.detach().tolist()
    else:
        Worker(g).serve(lambda model, client: (model + client + 1, client + 1))
    sys.stdout.flush()
    result_line.emit("RESULT", res)
    pybridge.finalize()


if __name__ == "__main__":
    main(sys.argv[1])
