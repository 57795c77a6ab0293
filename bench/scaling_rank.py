"""One rank (one node) of bench/scaling.py, started by pybridge-launch in a node of the
emulated cluster, or directly with WORLD_SIZE=1 for the 1-node baseline.

    scaling_rank.py MODEL METHOD DATA CONFIG_JSON

MODEL: mlp (the MNIST MLP on DATA, a folder of examples/mnist/prepare.py's records) or lm
(a byte-level transformer on DATA, a file of bytes whose last VAL_FRACTION is held out).
METHOD: plain (1 node, no communication), torch_ddp, pybridge_ddp, localsgd, diloco,
streaming. CONFIG_JSON: global_batch, lr, target, max_seconds, eval_every and the
methods' settings (bench/scaling.py's SETTINGS).

Trains until the target (MNIST: test accuracy at least it; LM: validation loss at most
it) or max_seconds of training. The clock runs only while training: at each evaluation
the ranks stop it, rank 0 evaluates, and a broadcast of its verdict restarts it. Every
rank prints `RESULT {json}`: its node link's bytes sent and received during training
(read from the node's own /sys, which `ip netns exec` shows), and rank 0 the curve of
(seconds, global samples, metric) points and whether it reached the target.
"""

import glob
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

VAL_FRACTION = 0.1
CONTEXT = 64


def text_corpus(root, max_bytes):
    """The first max_bytes of the .py files under root, sorted by relative path (the same
    bytes on every machine with the same Python), each file followed by a newline."""
    if not os.path.isdir(root):
        raise ValueError(f"text corpus: {root!r} is not a folder")
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"text corpus: max_bytes must be a positive integer, got {max_bytes!r}")
    out, size = [], 0
    paths = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    for rel in paths:
        if "site-packages" in rel.split(os.sep):  # installed packages differ between machines
            continue
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read() + b"\n"
        out.append(data[:max_bytes - size])
        size += len(out[-1])
        if size >= max_bytes:
            break
    if size < 2 * CONTEXT / VAL_FRACTION:
        raise ValueError(f"text corpus: only {size} bytes of .py files under {root!r}")
    return b"".join(out)


def split_text(data, val_fraction=VAL_FRACTION):
    """(train, validation): the last val_fraction of the bytes is held out."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    cut = int(len(data) * (1 - val_fraction))
    return data[:cut], data[cut:]


class TinyLM(torch.nn.Module):
    """A byte-level causal transformer: 2 pre-norm layers, d_model 64, 4 heads, context 64."""

    def __init__(self, d=64, layers=2, heads=4, context=CONTEXT):
        super().__init__()
        self.embed = torch.nn.Embedding(256, d)
        self.pos = torch.nn.Parameter(torch.zeros(context, d))
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, 256)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, x):
        n = x.shape[1]
        h = self.blocks(self.embed(x) + self.pos[:n], mask=self.mask[:n, :n], is_causal=True)
        return self.head(h)


def build(model):
    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    if model == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    return TinyLM()


class MnistData:
    def __init__(self, folder):
        from pybridge import recordio as rio

        def load(pattern):
            files = sorted(glob.glob(os.path.join(folder, pattern)))
            with rio.Loader(files, 1000, num_replicas=1, rank=0) as loader:
                recs = np.frombuffer(b"".join(r for batch in loader for r in batch), np.uint8).reshape(-1, 785)
            return torch.from_numpy(recs[:, 1:].astype(np.float32) / 255), torch.from_numpy(recs[:, 0].astype(np.int64))
        self.x, self.y = load("train-*.recordio")
        self.test_x, self.test_y = load("test-*.recordio")

    def shard(self, rank, size):
        return self.x[rank::size], self.y[rank::size]

    def loss(self, net, batch):
        x, y = batch
        return F.cross_entropy(net(x), y)

    def evaluate(self, net):
        """Test accuracy (higher is better)."""
        with torch.no_grad():
            return float((net(self.test_x).argmax(1) == self.test_y).float().mean())


class TextData:
    def __init__(self, path):
        with open(path, "rb") as f:
            train, val = split_text(f.read())
        self.train = torch.frombuffer(bytearray(train), dtype=torch.uint8).long()
        v = torch.frombuffer(bytearray(val), dtype=torch.uint8).long()
        n = (len(v) - 1) // CONTEXT
        starts = torch.arange(min(n, 32)) * ((len(v) - 1 - CONTEXT) // max(min(n, 32), 1))
        self.val = torch.stack([v[s:s + CONTEXT + 1] for s in starts.tolist()])  # 32 fixed windows

    def shard(self, rank, size):
        # Rank r's windows start at positions r, r + size, ...: disjoint starts, the same text.
        starts = torch.arange(rank, len(self.train) - CONTEXT - 1, size)
        return (starts,)

    def windows(self, starts):
        return torch.stack([self.train[s:s + CONTEXT + 1] for s in starts.tolist()])

    def loss(self, net, batch):
        w = self.windows(batch[0])
        return F.cross_entropy(net(w[:, :-1]).reshape(-1, 256), w[:, 1:].reshape(-1))

    def evaluate(self, net):
        """Validation loss in nats a byte (lower is better)."""
        with torch.no_grad():
            return float(F.cross_entropy(net(self.val[:, :-1]).reshape(-1, 256), self.val[:, 1:].reshape(-1)))


def batches(shard, per_rank, seed):
    """Endless batches of per_rank items of this rank's shard, reshuffled each epoch."""
    n = len(shard[0])
    if per_rank > n:
        raise SystemExit(f"batch of {per_rank} is larger than this rank's shard of {n}")
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(n, generator=gen)
        for k in range(0, n - per_rank + 1, per_rank):
            idx = order[k:k + per_rank]
            yield tuple(t[idx] for t in shard)


def link_bytes(plain=False):
    """(sent, received) on this node's link; (0, 0) for the 1-node baseline (not in a node)."""
    if plain:
        return 0, 0
    try:
        return tuple(int(open(f"/sys/class/net/eth0/statistics/{w}_bytes").read()) for w in ("tx", "rx"))
    except OSError:
        return 0, 0


class Method:
    """The model as `method` trains it: forward(), after_step() after the inner step, and
    eval_net(): the replica rank 0 evaluates."""

    def __init__(self, method, net, cfg, size):
        import pybridge
        self.net, self.after = net, None
        self.forward = net
        if method == "torch_ddp":
            self.forward = torch.nn.parallel.DistributedDataParallel(net)
        elif method == "pybridge_ddp":
            self.forward = pybridge.DistributedDataParallel(net)
        elif method == "localsgd":
            from pybridge.algorithms import local_sgd
            avg = local_sgd.PeriodicModelAverager(cfg["localsgd_period"])
            self.after = lambda: avg.average_parameters(net.parameters())
        elif method in ("diloco", "streaming"):
            from pybridge.algorithms.diloco import DiLoCo
            stream = method == "streaming"
            self.diloco = DiLoCo(net.parameters(), cfg["diloco_h"], quantization=cfg["quantization"],
                                 error_feedback=cfg["quantization"] != "fp32",
                                 fragments=cfg["streaming_fragments"] if stream else 1,
                                 delay=cfg["streaming_delay"] if stream else 0)
            self.after = self.diloco.step
        elif method != "plain":
            raise SystemExit(f"unknown method {method!r}")
        if method != "plain" and size > 1 and method not in ("torch_ddp", "pybridge_ddp"):
            pybridge.broadcast_parameters(list(net.parameters()))  # DDP wrappers broadcast themselves

    def close(self):
        if hasattr(self, "diloco"):
            self.diloco.close()


def train(model, method, data_path, cfg):
    import pybridge
    g = pybridge.init(timeout=600) if method != "plain" else None
    rank, size = (g.rank, g.size) if g else (0, 1)
    data = MnistData(data_path) if model == "mlp" else TextData(data_path)
    net = build(model)
    m = Method(method, net, cfg, size)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg["lr"])
    per_rank = cfg["global_batch"] // size
    stream = batches(data.shard(rank, size), per_rank, seed=1000 + rank)
    higher = model == "mlp"  # accuracy: higher is better; loss: lower
    flag = torch.zeros(1)
    curve, reached, trained, step = [], None, 0.0, 0
    if g:
        pybridge.barrier()
    before = link_bytes(g is None)
    while True:
        t = time.perf_counter()
        for _ in range(cfg["eval_every"]):
            opt.zero_grad()
            data.loss(m.forward, next(stream)).backward()
            opt.step()
            if m.after:
                m.after()
            step += 1
        trained += time.perf_counter() - t
        if rank == 0:  # the clock is stopped: the evaluation is not training time
            metric = data.evaluate(net)
            curve.append([trained, step * cfg["global_batch"], metric])
            hit = metric >= cfg["target"] if higher else metric <= cfg["target"]
            if hit and reached is None:
                reached = [trained, step * cfg["global_batch"]]
            flag[0] = 1.0 if hit or trained >= cfg["max_seconds"] else 0.0
        if g:
            pybridge.broadcast(flag, 0)
        if flag[0]:
            break
    after = link_bytes(g is None)
    m.close()
    out = {"rank": rank, "sent": after[0] - before[0], "received": after[1] - before[1]}
    if rank == 0:
        out.update(curve=curve, reached=reached is not None, seconds=trained, samples=step * cfg["global_batch"],
                   steps=step)
        if reached:
            out.update(seconds_to_target=reached[0], samples_to_target=reached[1])
    if g:
        pybridge.barrier()
    print("RESULT " + json.dumps(out), flush=True)
    if g:
        pybridge.finalize()


def main():
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)  # one CPU budget a node: more threads only contend for it
    train(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))


if __name__ == "__main__":
    main()
