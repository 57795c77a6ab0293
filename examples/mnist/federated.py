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

Modes (--mode): async (per-round asynchronous assignment), sync (FLUTE's waves), fedbuff
(buffered asynchronous: the model steps every --buffer-size results, late results weighted
by --staleness, none waited for; a "round" is then the --per-round clients handed out
between two evaluations) and fedasync (a step at every result). Server strategies:
--server-opt, any name of pybridge.federated.strategies.STRATEGIES (--help lists them), at
--server-lr; central DP with --dp-clip and --dp-noise; FedProx on the workers with --prox-mu. Simulated client speeds: every client
takes --client-seconds more on worker w, times the w-th of --speeds (e.g. 1,1,4), times a
Pareto(1.5) draw per task with --long-tail. --target stops at that test accuracy.
"""

import argparse
import json
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
from pybridge.federated import EVALUATE, CentralDP, FedAvgRounds, Server, Worker, add_proximal_grad  # noqa: E402
from pybridge.federated import modes, strategies  # noqa: E402  (the core's registries: --mode, --server-opt)


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
    p.add_argument("--mode", choices=modes.MODES, default="async",
                   help="server mode (default async)")
    p.add_argument("--buffer-size", type=int, default=None, help="fedbuff: results per model step (default 10)")
    p.add_argument("--staleness", default=None, help="fedbuff/fedasync: constant, polynomial[:a], hinge[:a[:b]]")
    p.add_argument("--max-staleness", type=int, default=None, help="fedbuff/fedasync: oldest update accepted")
    p.add_argument("--server-opt", choices=sorted(strategies.STRATEGIES), default="fedavg",
                   help="server optimizer (fedavg)")
    p.add_argument("--server-lr", type=float, default=None, help="server learning rate (1 for fedavg, 0.01 adaptive)")
    p.add_argument("--prox-mu", type=float, default=0.0, help="FedProx's mu on the workers (default 0: off)")
    p.add_argument("--dp-clip", type=float, default=0.0, help="central DP: clip norm per client (0: off)")
    p.add_argument("--dp-noise", type=float, default=0.0, help="central DP: noise multiplier")
    p.add_argument("--client-seconds", type=float, default=0.0, help="simulated extra seconds per client")
    p.add_argument("--speeds", default=None, help="per-worker time multipliers, e.g. 1,1,4")
    p.add_argument("--long-tail", action="store_true", help="times a Pareto(1.5) draw per task (capped at 20)")
    p.add_argument("--target", type=float, default=None, help="stop once the test accuracy reaches this")
    p.add_argument("--no-client-eval", action="store_true", help="skip the EVALUATE round after each round")
    p.add_argument("--metrics", default=None,
                   help="the server writes one JSON line per round here (plot with plot.py)")
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


def make_rounds(opts, group):
    """The server's FedAvgRounds for the options (mode, strategy, DP, buffer)."""
    buffered = {} if opts.mode not in modes.BUFFERED else {
        "buffer_size": opts.buffer_size, "staleness": opts.staleness, "max_staleness": opts.max_staleness}
    dp = CentralDP(opts.dp_clip, opts.dp_noise, seed=opts.seed) if opts.dp_clip else None
    strategy = strategies.build(opts.server_opt, eta=opts.server_lr)
    return FedAvgRounds(Server(group, mode=opts.mode), strategy=strategy, dp=dp, **buffered)


def serve(opts, group):
    model = build_model(opts.seed)
    params = list(model.parameters())
    images, labels = read_split(opts.data, fmt.TEST_GLOB)
    vector = torch.nn.utils.parameters_to_vector(params).detach().clone()
    print(f"data: {data_kind(opts.data)}, test {len(labels)} | {group.size - 1} workers, {opts.clients} "
          f"clients, {opts.per_round} per round, mode {opts.mode}, server {opts.server_opt}", flush=True)
    if opts.metrics:
        open(opts.metrics, "w").close()
    with make_rounds(opts, group) as rounds:
        t0 = time.perf_counter()  # the workers are ready: their data is loaded
        for r in range(1, opts.rounds + 1):
            start = time.perf_counter()
            draw = np.random.default_rng([opts.seed, r]).choice(opts.clients, opts.per_round, replace=False)
            rounds.train_round(draw.tolist(), vector)
            torch.nn.utils.vector_to_parameters(vector, params)
            with torch.no_grad():
                acc = (model(images).argmax(1) == labels).float().mean().item()
            row = {"round": r, "test_accuracy": acc, "version": rounds.version, "loss": float("nan")}
            if not opts.no_client_eval:
                # The new model on the round's clients' own data (any worker holds every client).
                loss = correct = samples = 0.0
                rounds.start(draw.tolist(), vector, evaluate=True)
                for result in rounds:
                    if result.command == EVALUATE:
                        loss, correct = loss + result.payload[0].item(), correct + result.payload[1].item()
                        samples += result.samples
                rounds.aggregate(out=vector) if rounds.buffered else None  # late training results stepped
                row.update(loss=loss / max(samples, 1), client_accuracy=correct / max(samples, 1))
            row.update(seconds=time.perf_counter() - start, elapsed=time.perf_counter() - t0)
            print(f"round {r}/{opts.rounds}  test-acc {acc:.4f}  client-loss {row['loss']:.4f}  "
                  f"client-acc {row.get('client_accuracy', float('nan')):.4f}  seconds {row['seconds']:.2f}",
                  flush=True)
            if opts.metrics:
                with open(opts.metrics, "a") as f:
                    f.write(json.dumps(row) + "\n")
            if opts.target is not None and acc >= opts.target:
                print(f"target {opts.target} reached after {row['elapsed']:.2f} s", flush=True)
                break
    print(f"final test accuracy: {acc:.4f}", flush=True)


def delay_of(opts, rank):
    """The extra seconds a worker spends per client: --client-seconds x its --speeds entry
    (x a seeded Pareto(1.5) draw per task with --long-tail)."""
    speeds = [float(x) for x in opts.speeds.split(",")] if opts.speeds else [1.0]
    base = opts.client_seconds * speeds[(rank - 1) % len(speeds)]
    rng = np.random.default_rng([opts.seed, rank])
    return lambda: base * (min(rng.pareto(1.5) + 1.0, 20.0) if opts.long_tail else 1.0)


def work(opts, group):
    model = build_model(opts.seed)
    params = list(model.parameters())
    images, labels = read_split(opts.data, fmt.TRAIN_GLOB)
    mine = client_indices(labels, opts.clients, opts.seed)
    delay = delay_of(opts, group.rank)

    def train(weights, client):
        torch.nn.utils.vector_to_parameters(weights, params)
        start = [p.detach().clone() for p in params] if opts.prox_mu else None
        opt = torch.optim.SGD(params, lr=opts.lr)
        gen = torch.Generator().manual_seed(opts.seed * 100003 + client)
        idx = torch.from_numpy(mine[client])
        for _ in range(opts.local_epochs):
            for batch in idx[torch.randperm(len(idx), generator=gen)].split(opts.batch_size):
                opt.zero_grad()
                F.cross_entropy(model(images[batch]), labels[batch]).backward()
                if start is not None:  # FedProx: + mu/2 ||w - w_round||^2
                    add_proximal_grad(params, start, opts.prox_mu)
                opt.step()
        if opts.client_seconds:
            time.sleep(delay())
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
