"""One rank started by a scheduler with no export lines (tests/test_slurm.py under srun,
tests/test_mpirun.py under mpirun): pybridge.init() finds rank, world size and the
rendezvous from the scheduler's variables, allreduces, trains a few steps of
pybridge.DistributedDataParallel, and prints one line `RESULT {json}` with what it saw.
"""

import os
import socket

import torch

import pybridge
from pybridge.base import jobenv, netif

import result_line  # tests/, beside this script


def main():
    job = jobenv.env()
    g = pybridge.init(timeout=60)
    x = torch.full((1000,), float(g.rank))
    pybridge.all_reduce(x)

    torch.manual_seed(g.rank)  # different starting weights: DDP broadcasts rank 0's
    net = torch.nn.Linear(4, 2)
    model = pybridge.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        gen = torch.Generator().manual_seed(100 * step + g.rank)  # each rank its own batch
        inputs, target = torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), target).backward()
        opt.step()
    intra, cross = pybridge.node_groups()  # ranks per node: the scheduler's
    weights = torch.cat([p.detach().flatten() for p in net.parameters()])
    same = weights.clone()
    pybridge.broadcast(same, 0)  # every replica equal to rank 0's after the steps

    result_line.emit("RESULT", {
        "rank": g.rank, "world": g.size, "local_rank": g.local_rank, "scheduler": job.scheduler,
        "sources": job.sources, "master": [job.master_addr, job.master_port],
        "host": socket.gethostname(), "address": netif.local_address_towards(job.master_addr),
        "node": os.environ.get("SLURM_NODEID"), "intra": list(intra.ranks), "cross": list(cross.ranks),
        "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "sum": x[0].item(), "replicas_equal": bool(torch.equal(weights, same)),
    })
    pybridge.finalize()


if __name__ == "__main__":
    main()
