"""A Python rank of a federated group whose other ranks are Go programs (go/federated_test.go).

Usage: python tests/federated_peer.py server|worker   (rank and rendezvous from the environment)

server: two training rounds of clients 0..11 with FedAvg (lr 1.0) from a zero model of 5
        floats, then a round of the failing client 100; prints one line "RESULT {json}" with
        the model, every (round, client, worker, samples) and the failure's worker, client
        and message.
worker: client c trains to model + (c+1) V from c+1 samples, with metrics loss c/8 and acc
        1/(c+1); evaluating c gives [2c, rank] (float32) from 3 samples; client 100 raises,
        101 gives NaN weights, 102 waits for the file "go" in $PB_TEST_DIR.
"""

import os
import sys
import time

import torch

import pybridge
from pybridge.errors import WorkerFailed
from pybridge.federated import FedAvg, Server, Worker

import result_line  # tests/, beside this script

V = 39 * torch.arange(1, 6, dtype=torch.float32)  # see tests/test_capi_federated.py
FAILING, POISONED, STRAGGLER = 100, 101, 102


def server(g):
    param = torch.nn.Parameter(torch.zeros(5))
    avg = FedAvg([param])
    seen, failed = [], None
    with Server(g, timeout=60) as s:
        for _ in range(2):
            for r in s.run_round(range(12), avg.vector()):
                avg.add(r)
                seen.append([r.round, r.client, r.worker, r.samples])
            avg.step()
        try:
            list(s.run_round([FAILING], avg.vector()))
        except WorkerFailed as exc:
            failed = [exc.worker, exc.client, str(exc)]
    sys.stdout.flush()
    result_line.emit("RESULT", {"model": param.detach().tolist(), "seen": seen, "failed": failed})


def worker(g):
    def train(model, client):
        if client == FAILING:
            raise ValueError(f"client {client} has no data")
        if client == POISONED:
            return model * float("nan"), 1
        if client == STRAGGLER:
            go = os.path.join(os.environ["PB_TEST_DIR"], "go")
            for _ in range(3000):  # 60 s at most
                if os.path.exists(go):
                    break
                time.sleep(0.02)
        return model + (client + 1) * V, client + 1, {"loss": client / 8, "acc": 1 / (client + 1)}

    def evaluate(model, client):
        return torch.tensor([2.0 * client, g.rank]), 3

    Worker(g).serve(train, evaluate)


if __name__ == "__main__":
    group = pybridge.init(backend="gloo", timeout=60)
    {"server": server, "worker": worker}[sys.argv[1]](group)
    pybridge.finalize()
