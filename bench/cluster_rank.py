"""One rank of bench/cluster.py, started by pybridge-launch in a node of the simulated cluster.

    cluster_rank.py step METHOD STEPS BATCH      model (b): 3 layers of 2048x2048, random data
    cluster_rank.py mlp METHOD DATA SAMPLES      the MNIST MLP on DATA for SAMPLES global samples

Rank 0 prints `RESULT {json}`: the median step time (step), or the final test accuracy
(mlp); local rank 0 of every node adds the bytes its link sent and received during the
measured steps (read from the node's own /sys, which `ip netns exec` shows).
"""

import glob
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import pybridge
from pybridge.algorithms import comm_hooks, local_sgd
from pybridge import recordio as rio
from pybridge.algorithms.gossip import GossipState, average_parameters, gossip_hook

torch.set_num_threads(1)


def link_bytes():
    def read(what):
        with open(f"/sys/class/net/eth0/statistics/{what}_bytes") as f:
            return int(f.read())
    return read("tx"), read("rx")


class LocalSGD:
    """Local steps, parameters averaged every `period` steps by pybridge's
    PeriodicModelAverager (torch's schedule, no warm-up)."""

    def __init__(self, model, period):
        self.module, self.averager = model, local_sgd.PeriodicModelAverager(period)

    def __call__(self, x):
        return self.module(x)

    def parameters(self):
        return self.module.parameters()

    def after_step(self):
        self.averager.average_parameters(self.module.parameters())


def wrap(method, model):
    """The model wrapped for `method`; a method may need after_step() after each step."""
    if method == "torch_ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if method.startswith("localsgd"):
        return LocalSGD(model, int(method[len("localsgd"):]))
    ddp = pybridge.DistributedDataParallel(model, compression="fp16" if method == "fp16" else None)
    # (hierarchical, below, is the reducer's built-in hook: it sums, the reducer averages)
    if method == "powersgd":
        ddp.register_comm_hook(comm_hooks.powersgd_state(None, rank=4, start_iter=2), comm_hooks.powersgd_hook)
    elif method == "gossip":
        ddp.register_comm_hook(GossipState(), gossip_hook)  # nodes: the launcher's 2 ranks
    elif method in ("hierarchical", "hierarchical_fp16"):
        spec = comm_hooks.HierarchicalHook(0, compression="fp16" if method.endswith("fp16") else None)
        ddp.register_comm_hook(*spec.build(pybridge.current()))
    elif method not in ("pybridge", "fp16"):
        raise SystemExit(f"unknown method {method}")
    return ddp


def finish(model):
    """Bring replicas together where a method lets them drift (gossip, local SGD)."""
    inner = getattr(model, "module", model)
    average_parameters(list(inner.parameters()))


def step_bench(g, method, steps, batch):
    torch.manual_seed(0)
    layers = []
    for _ in range(3):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    model = wrap(method, torch.nn.Sequential(*layers[:-1]))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 2048), torch.randn(batch, 2048)
    times, before = [], None
    for k in range(steps + 2):  # 2 warm-up steps: local SGD's step count starts after them
        if k == 2 and hasattr(model, "averager"):
            model.averager.step = 0
        if k == 2:
            pybridge.barrier()
            before = link_bytes()
        t = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if hasattr(model, "after_step"):
            model.after_step()
        if k >= 2:
            times.append(time.perf_counter() - t)
    pybridge.barrier()
    after = link_bytes()
    # The mean, not the median: local SGD's averaging every k-th step is part of its cost.
    return {"step": statistics.fmean(times), "tx": (after[0] - before[0]) / steps,
            "rx": (after[1] - before[1]) / steps}


def mlp_bench(g, method, data, samples):
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = wrap(method, net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    per_rank = 8
    train = sorted(glob.glob(os.path.join(data, "train-*.recordio")))
    done = 0
    t0 = time.perf_counter()
    with rio.Loader(train, per_rank, shuffle=True, seed=3, drop_last=True) as loader:
        epoch = 0
        while done < samples:
            loader.set_epoch(epoch)
            for batch in loader:
                if done >= samples:
                    continue
                recs = np.frombuffer(b"".join(batch), np.uint8).reshape(-1, 785)
                x = torch.from_numpy(recs[:, 1:].astype(np.float32) / 255)
                y = torch.from_numpy(recs[:, 0].astype(np.int64))
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                if hasattr(model, "after_step"):
                    model.after_step()
                done += per_rank * g.size
            epoch += 1
    elapsed = time.perf_counter() - t0
    if method in ("gossip",) or method.startswith("localsgd"):
        finish(model)
    correct = total = 0
    if g.rank == 0:
        test = sorted(glob.glob(os.path.join(data, "test-*.recordio")))
        with rio.Loader(test, 500, num_replicas=1, rank=0) as loader, torch.no_grad():
            for batch in loader:
                recs = np.frombuffer(b"".join(batch), np.uint8).reshape(-1, 785)
                x = torch.from_numpy(recs[:, 1:].astype(np.float32) / 255)
                correct += int((net(x).argmax(1) == torch.from_numpy(recs[:, 0].astype(np.int64))).sum())
                total += len(recs)
    return {"accuracy": correct / max(total, 1), "seconds": elapsed}


def main():
    kind, method = sys.argv[1], sys.argv[2]
    g = pybridge.init(timeout=300)
    if kind == "step":
        out = step_bench(g, method, int(sys.argv[3]), int(sys.argv[4]))
    else:
        out = mlp_bench(g, method, sys.argv[3], int(sys.argv[4]))
    if int(os.environ["LOCAL_RANK"]) == 0 or g.rank == 0:
        out.update(rank=g.rank, node=int(os.environ.get("GROUP_RANK", 0)))
        print("RESULT " + json.dumps(out), flush=True)
    pybridge.finalize()


if __name__ == "__main__":
    main()
