"""Federated MNIST with workers written in Go: rank 0 runs federated.py's server (Python),
every other rank runs the Go trainer of this folder as a federated worker (`mnist
-federated`, examples/mnist/federated.go), which trains its clients with the Go MLP.

    (cd examples/mnist && go build -o ../../build/mnist .)
    python -m pybridge.launch --nproc-per-node 4 examples/mnist/federated_go.py \\
        --go-worker build/mnist --data data/mnist --rounds 20

Options are federated.py's, plus --go-worker (the built Go trainer). The worker ranks
exec that program with the matching options before joining the group, so the launcher
sees one process per rank. The server computes the label-skewed split (federated.py's
client_indices) and broadcasts which client owns each training record, so the Go workers
hold exactly the clients a Python worker would.
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import federated  # noqa: E402
import mnist_format as fmt  # noqa: E402

import pybridge  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    p.add_argument("--go-worker", required=True, help="the Go trainer built from examples/mnist")
    known, rest = p.parse_known_args(argv)
    opts = federated.parse_args(rest)
    if os.environ.get("RANK", "0") != "0":  # a worker: become the Go program (same pid, same environment)
        exe = os.path.abspath(known.go_worker)
        os.execv(exe, [exe, "-federated", "-data", opts.data, "-batch-size", str(opts.batch_size),
                       "-lr", str(opts.lr), "-local-epochs", str(opts.local_epochs), "-seed", str(opts.seed),
                       "-prox-mu", str(opts.prox_mu)])
    group = pybridge.init(backend="gloo")
    try:
        if group.size < 2:
            raise SystemExit("federated_go.py needs a server and at least one worker: launch 2 or more ranks")
        _, labels = federated.read_split(opts.data, fmt.TRAIN_GLOB)
        owner = torch.empty(len(labels), dtype=torch.int32)
        for client, idx in enumerate(federated.client_indices(labels, opts.clients, opts.seed)):
            owner[torch.from_numpy(np.asarray(idx, np.int64))] = client
        pybridge.broadcast(torch.tensor([len(labels)], dtype=torch.int64), 0)  # workers check their count
        pybridge.broadcast(owner, 0)
        federated.serve(opts, group)
    finally:
        pybridge.finalize()


if __name__ == "__main__":
    main()
