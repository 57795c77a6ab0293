"""Federated MNIST with pybridge.federated: FedAvg over label-skewed clients (the non-IID
split of McMahan et al. 2017), rank 0 the server, every other rank a worker.

    python examples/mnist/prepare.py --out data/mnist              # synthetic digits offline
    python -m pybridge.launch --nproc-per-node 4 examples/mnist/federated.py --data data/mnist

Clients: the training records sorted by label and cut into 2 x --clients shards of equal
size; the shards are shuffled (--seed) and client c gets shards 2c and 2c+1, so most
clients hold two digits. Every worker reads the training set (the server sends only client
ids) and the server the test set. Each round the server draws --per-round clients (--seed
and the round number), sends the model, and the workers train each client on its own data:
--local-epochs passes of SGD in batches of --batch-size from the round's model. The
server averages the results weighted by sample count (FedAvg: server SGD at lr 1.0) and
prints the test accuracy:

    round 1/20  test-acc 0.3012  client-loss 1.2345  client-acc 0.5678  seconds 1.23

client-loss and client-acc: the new model on the round's clients' own data (an EVALUATE
round: any worker can take any client, since every worker holds all the data).
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_format as fmt  # noqa: E402
from train import build_model, data_kind  # noqa: E402

import pybridge  # noqa: E402
from pybridge import recordio  # noqa: E402
from pybridge.federated import FedAvg, Server, Worker  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Federated MNIST MLP (FedAvg, label-skewed clients)")
    p.add_argument("--data", default="data/mnist", help="folder written by prepare.py (default data/mnist)")
    p.add_argument("--rounds", type=int, default=20, help="federated rounds (default 20)")
    p.add_argument("--clients", type=int, default=100, help="clients in all (default 100)")
    p.add_argument("--per-round", type=int, default=10, help="clients trained per round (default 10)")
    p.add_argument("--local-epochs", type=int, default=1, help="passes over a client's data (default 1)")
    p.add_argument("--batch-size", type=int, default=10, help="local batch size (default 10)")
    p.add_argument("--lr", type=float, default=0.05, help="local SGD learning rate (default 0.05)")
    p.add_argument("--seed", type=int, default=1, help="model, split and client draws (default 1)")
    p.add_argument("--mode", choices=("async", "sync"), default="async", help="client assignment (async)")
    opts = p.parse_args(argv)
    if min(opts.rounds, opts.clients, opts.per_round, opts.local_epochs, opts.batch_size) < 1:
        p.error("--rounds, --clients, --per-round, --local-epochs and --batch-size must be positive")
    if opts.per_round > opts.clients:
        p.error(f"--per-round {opts.per_round} is more than --clients {opts.clients}")
    return opts


def read_split(folder, pattern):
    """(images float32 [N, 784] scaled to 0..1, labels int64 [N]) of every record."""
    records = [r for path in recordio.expand_files(os.path.join(folder, pattern)) for r in recordio.read_file(path)]
    raw = np.frombuffer(b"".join(records), np.uint8).reshape(len(records), fmt.RECORD_BYTES)
    images = torch.from_numpy(raw[:, fmt.LABEL_BYTES:].astype(np.float32) / 255.0)
    return images, torch.from_numpy(raw[:, 0].astype(np.int64))


def client_indices(labels, clients, seed):
    """Record indices of each client: 2 shards each of the label-sorted records."""
    order = np.argsort(labels.numpy(), kind="stable")
    shards = np.array_split(order, 2 * clients)
    pick = np.random.default_rng(seed).permutation(2 * clients)
    return [np.concatenate([shards[pick[2 * c]], shards[pick[2 * c + 1]]]) for c in range(clients)]


def serve(opts, group):
    model = build_model(opts.seed)
    images, labels = read_split(opts.data, fmt.TEST_GLOB)
    avg = FedAvg(model.parameters())
    print(f"data: {data_kind(opts.data)}, test {len(labels)} | {group.size - 1} workers, {opts.clients} "
          f"clients, {opts.per_round} per round, mode {opts.mode}", flush=True)
    with Server(group, mode=opts.mode) as server:
        for r in range(1, opts.rounds + 1):
            start = time.perf_counter()
            draw = np.random.default_rng([opts.seed, r]).choice(opts.clients, opts.per_round, replace=False)
            for result in server.run_round(draw.tolist(), avg.vector()):
                avg.add(result)
            avg.step()
            with torch.no_grad():
                acc = (model(images).argmax(1) == labels).float().mean().item()
            # The new model on the round's clients' own data (any worker holds every client).
            loss = correct = samples = 0.0
            for result in server.run_round(draw.tolist(), avg.vector(), evaluate=True):
                loss, correct = loss + result.payload[0].item(), correct + result.payload[1].item()
                samples += result.samples
            print(f"round {r}/{opts.rounds}  test-acc {acc:.4f}  client-loss {loss / samples:.4f}  "
                  f"client-acc {correct / samples:.4f}  seconds {time.perf_counter() - start:.2f}", flush=True)
    print(f"final test accuracy: {acc:.4f}", flush=True)


def work(opts, group):
    model = build_model(opts.seed)
    params = list(model.parameters())
    images, labels = read_split(opts.data, fmt.TRAIN_GLOB)
    mine = client_indices(labels, opts.clients, opts.seed)

    def train(weights, client):
        torch.nn.utils.vector_to_parameters(weights, params)
        opt = torch.optim.SGD(params, lr=opts.lr)
        gen = torch.Generator().manual_seed(opts.seed * 100003 + client)
        idx = torch.from_numpy(mine[client])
        for _ in range(opts.local_epochs):
            for batch in idx[torch.randperm(len(idx), generator=gen)].split(opts.batch_size):
                opt.zero_grad()
                F.cross_entropy(model(images[batch]), labels[batch]).backward()
                opt.step()
        return torch.nn.utils.parameters_to_vector(params).detach(), len(idx)

    def evaluate(weights, client):
        """Summed loss and correct predictions of `weights` on the client's data."""
        torch.nn.utils.vector_to_parameters(weights, params)
        idx = torch.from_numpy(mine[client])
        with torch.no_grad():
            out = model(images[idx])
            loss = F.cross_entropy(out, labels[idx], reduction="sum").item()
            correct = (out.argmax(1) == labels[idx]).sum().item()
        return torch.tensor([loss, correct], dtype=torch.float64), len(idx)

    Worker(group).serve(train, evaluate)


def main(argv=None):
    opts = parse_args(argv)
    group = pybridge.init(backend="gloo")
    if group.size < 2:
        raise SystemExit("federated.py needs a server and at least one worker: launch 2 or more ranks")
    try:
        serve(opts, group) if group.rank == 0 else work(opts, group)
    finally:
        pybridge.finalize()


if __name__ == "__main__":
    main()
