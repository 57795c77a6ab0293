"""A small data-parallel training run with a checkpoint every step, for the resume tests.

Run by the launcher (`python tests/resume_train.py ...`) or called as train(opts) on ranks
started by tests/ranks.py. Each rank appends one JSON line per finished step to
LOG-rank<R>.jsonl: {"attempt", "world", "rank", "epoch", "step", "ids"}, written after the
step's checkpoint, so a line means "these records are in the saved state".
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pybridge  # noqa: E402
from pybridge.runtime import checkpoint  # noqa: E402
from pybridge.recordio import Loader, decode_fixed, write_file  # noqa: E402

FEATURES = 8
LAYOUT = [("id", "<i8", ()), ("x", "<f4", (FEATURES,)), ("y", "<f4", ())]


def write_dataset(directory, records, files=2, chunk_records=16):
    """`records` records (ids 0..records-1) over `files` files; y = x . w_true + noise."""
    rng = np.random.default_rng(0)
    w_true = rng.normal(size=FEATURES).astype(np.float32)
    per_file = -(-records // files)
    paths = []
    for f in range(files):
        ids = range(f * per_file, min((f + 1) * per_file, records))
        recs = []
        for i in ids:
            x = rng.normal(size=FEATURES).astype(np.float32)
            y = np.float32(x @ w_true + 0.1 * rng.normal())
            recs.append(np.int64(i).tobytes() + x.tobytes() + y.tobytes())
        path = os.path.join(directory, f"part{f}.rio")
        write_file(path, recs, "none", chunk_records * len(recs[0]))
        paths.append(path)
    return paths


def sgd_step(model, opt, reducer, params, x, y):
    """One step of the linear model on (x, y), its gradients averaged over the ranks by the
    reducer (None: one process, no averaging)."""
    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
    opt.zero_grad()
    loss.backward()
    if reducer is not None:
        for i, p in enumerate(params):
            reducer.set_grad(i, p.grad)
        reducer.wait()
        for i, p in enumerate(params):
            p.grad.copy_(reducer.grad(i))
    opt.step()


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--data", nargs="+", required=True)
    p.add_argument("--ckpt", required=True, help="checkpoint folder ({rank} is replaced)")
    p.add_argument("--steplog", required=True, help="prefix of the per-rank step logs")
    p.add_argument("--out", default=None, help="rank 0 writes the final parameters here")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--stop-at", type=int, default=0, help="return after this global step")
    p.add_argument("--crash-at", type=int, default=0, help="rank 1 dies in this step on the first attempt")
    p.add_argument("--save-every", type=int, default=1, help="checkpoint every N steps")
    p.add_argument("--writers", choices=("all", "rank0"), default="all")
    return p.parse_args(argv)


def train(opts):
    pybridge.init(timeout=60)
    rank, world = pybridge.rank(), pybridge.size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    params = list(model.parameters())
    reducer = pybridge.Reducer(params)
    loader = Loader(opts.data, opts.batch, shuffle=True, seed=7, prefetch=2)
    folder = opts.ckpt.replace("{rank}", str(rank))
    got = checkpoint.restore(folder, model=model, optimizer=opt, reducer=reducer, loader=loader)
    step = got.step if got else 0
    print(f"rank {rank}: attempt {attempt} world {world} "
          + (f"resumed at step {step} from rank {got.source_rank}" if got else "started fresh"), flush=True)
    log = open(f"{opts.steplog}-rank{rank}.jsonl", "a", buffering=1)
    try:
        for epoch in range(loader.epoch, opts.epochs):
            loader.set_epoch(epoch)  # the saved epoch keeps its position
            for batch in loader:
                step += 1
                rec = decode_fixed(batch.data, batch.offsets, LAYOUT, as_torch=True)
                if step == opts.crash_at and attempt == 0 and rank == 1:
                    os._exit(3)  # dies mid-step: batch read, nothing trained or saved
                sgd_step(model, opt, reducer, params, rec["x"], rec["y"])
                if (opts.writers == "all" or rank == 0) and step % opts.save_every == 0:
                    checkpoint.save(folder, step, model=model, optimizer=opt, reducer=reducer, loader=loader)
                log.write(json.dumps({"attempt": attempt, "world": world, "rank": rank, "epoch": epoch,
                                      "step": step, "ids": rec["id"].tolist(),
                                      "t": time.time()}) + "\n")
                if step == opts.stop_at:
                    return step
        if rank == 0 and opts.out:
            torch.save({"weights": {k: v.clone() for k, v in model.state_dict().items()},
                        "iterations": reducer.iterations, "step": step}, opts.out)
        return step
    finally:
        log.close()
        loader.close()
        pybridge.finalize()


if __name__ == "__main__":
    train(parse(sys.argv[1:]))
