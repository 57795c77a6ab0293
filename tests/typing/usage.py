"""A training loop written as a user writes one, against pybridge's public API.

`make typecheck` checks this file with mypy --strict (pyproject.toml): every call below must
type-check, and each `assert_type` pins what a user's checker sees (a name that lost its
annotations would be Any, and fail here). tests/test_typing.py also runs `main` on 2 ranks, so
the sample is a working program, not only a typed one.
"""

import os

import numpy as np
import torch
from typing_extensions import assert_type

import pybridge
from pybridge import observe, recordio
from pybridge.algorithms.comm_hooks import HookContext, fp16_compress_hook
from pybridge.algorithms.local_sgd import PeriodicModelAverager
from pybridge.runtime import checkpoint


def write_shards(folder: str, shards: int = 2, records: int = 64) -> list[str]:
    """RecordIO shards of (label byte, 4 float32 features) records."""
    paths = []
    rng = np.random.default_rng(0)
    for s in range(shards):
        path = os.path.join(folder, f"train-{s}.recordio")
        with recordio.Writer(path, compressor="snappy") as w:
            for _ in range(records):
                x = rng.standard_normal(4).astype(np.float32)
                w.write(bytes([int(x.sum() > 0)]) + x.tobytes())
        paths.append(path)
    assert_type(recordio.write_file(os.path.join(folder, "tiny.recordio"), [b"a"]), int)
    return paths


def main(folder: str, epochs: int = 2) -> float:
    """Train a small classifier on this rank's share; return the last loss (every rank)."""
    shards = write_shards(folder)
    if not pybridge.is_initialized():
        pybridge.init()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ddp = pybridge.DistributedDataParallel(model, bucket_cap_mb=1.0)
    assert_type(ddp.reducer, pybridge.Reducer)
    ddp.register_comm_hook(HookContext(ddp.reducer.group), fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    averager = PeriodicModelAverager(period=1_000_000)  # due at step 0 only: one average
    assert_type(averager.average_parameters(model.parameters()), bool)

    loader = recordio.Loader(shards, batch_size=16, shuffle=True)
    assert_type(loader.num_batches, "int | None")
    restored = checkpoint.restore(os.path.join(folder, "ckpt"), model=model, optimizer=opt, loader=loader)
    assert_type(restored, "checkpoint.Restored | None")
    first = 0 if restored is None else restored.step + 1

    loss = torch.zeros(())
    layout = [("label", "u1", ()), ("x", "<f4", (4,))]
    for epoch in range(first, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            assert_type(batch, recordio.Batch)
            fields = batch.decode(layout, as_torch=True)
            with observe.span("step", "compute"):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(ddp(fields["x"]), fields["label"].long())
                loss.backward()
                opt.step()
        path = checkpoint.save(os.path.join(folder, "ckpt"), epoch, model=model, optimizer=opt, loader=loader)
        assert_type(path, str)

    mean = loss.detach().clone().reshape(1)
    assert_type(pybridge.all_reduce(mean, "avg"), None)
    work = pybridge.all_reduce(mean, pybridge.MAX, async_op=True)
    assert_type(work, pybridge.Work)
    work.wait(timeout=30)
    fut = pybridge.all_reduce_future(torch.ones(2))
    assert_type(fut.wait(), list[torch.Tensor])
    buf = np.zeros(2 * pybridge.size(), np.float32)
    pybridge.all_gather(np.full(2, pybridge.rank(), np.float32), buf)
    pybridge.broadcast(bytearray(8), root=0)  # any writable buffer
    pybridge.barrier()
    evens = pybridge.split(pybridge.rank() % 2)
    if evens is not None:
        pybridge.broadcast_parameters(model.parameters(), group=evens)
    loader.close()
    ddp.close()
    return float(mean.item())
