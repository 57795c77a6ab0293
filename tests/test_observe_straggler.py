"""A straggler injected into one real rank of 4 is named by `pybridge report` with the right
cause: first its data loading slowed (every chunk the loader reads takes 20 ms more, as on
a slow disk), then its CPU throttled (a cgroup v1 cpu quota of 5% of one CPU, the way a
shared node steals time). The ranks train the DDP wrapper on a small MLP from a RecordIO
shard, traced; nothing in the library knows it is being slowed."""

import os
import time

import pytest

from ranks import run_ranks

WORLD = 4
SLOW = 3
STEPS = 24
BATCH = 64
FEATURES = 256


def _shard(path, records):
    """One chunk per batch: each batch the loader hands out is a chunk read from the file."""
    from pybridge import recordio as rio
    with rio.Writer(path, compressor="none", max_chunk_bytes=BATCH * FEATURES * 4) as w:
        for i in range(records):
            w.write(bytes([i % 251]) * (FEATURES * 4))


def _train(rank, world, out, shard, slow, budget):
    import torch

    import pybridge
    from pybridge import observe
    from pybridge import recordio as rio
    from pybridge.recordio import reader
    if rank == SLOW and slow == "data":
        raw = reader.Reader._raw

        def slow_disk(self, *args, **kwargs):
            time.sleep(0.020)
            return raw(self, *args, **kwargs)
        reader.Reader._raw = slow_disk
    torch.manual_seed(0)
    torch.set_num_threads(1)
    observe.start(out)
    pybridge.init(timeout=60)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    ddp = pybridge.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loader = rio.Loader([shard], BATCH, prefetch=0, shuffle=False)
    if rank == SLOW and slow == "cpu":  # throttled for the steps only: start-up at a 5% quota takes seconds
        budget.add(os.getpid())
    for _ in range(STEPS):
        batch = loader.next_batch()
        x = torch.frombuffer(bytearray(batch.data.tobytes()), dtype=torch.float32).view(len(batch), FEATURES)
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    loader.close()
    pybridge.finalize()
    observe.stop()


def _report(tmp_path, slow, budget=None):
    from pybridge.observe import report
    out = str(tmp_path / f"trace-{slow}")
    shard = str(tmp_path / "data.rio")
    if not os.path.exists(shard):
        _shard(shard, WORLD * STEPS * BATCH * 2)
    run_ranks(_train, WORLD, out, shard, slow, budget, timeout=150)
    return report.analyze(out, skip=2)


def test_a_rank_whose_data_loading_is_slowed_is_named_with_data_as_the_cause(tmp_path):
    rep = _report(tmp_path, "data")
    v = rep["verdict"]
    assert v["straggler"] == SLOW and v["cause"] == "data", v["text"]
    by_rank = {r["rank"]: r for r in rep["per_rank"]}
    # a 20 ms sleep per step on the slow rank only (one chunk per batch, one batch per step); under
    # the suite's load every rank's reads slow down too (seen: another rank at 10+ ms), not by 20 ms
    others = max(by_rank[r]["data_ms"] for r in range(WORLD) if r != SLOW)
    assert by_rank[SLOW]["data_ms"] > 15 and by_rank[SLOW]["data_ms"] - others > 8, by_rank
    row = next(r for r in rep["stragglers"]["per_rank"] if r["rank"] == SLOW)
    assert row["last_share"] > 0.5 and row["relative_score_latest"] < 0.8


def test_a_rank_whose_cpu_is_throttled_is_named_with_compute_as_the_cause(tmp_path):
    from pybridge.testing import cpulimit
    ok, why = cpulimit.available()
    if not ok:
        pytest.skip(why)
    # 5% of one CPU (1 ms every 20 ms; 1 ms is the least quota): far below the suite's load
    with cpulimit.CpuBudget(0.05, period_us=20000) as budget:
        rep = _report(tmp_path, "cpu", budget)
    v = rep["verdict"]
    assert v["straggler"] == SLOW and v["cause"] == "compute", v["text"]
    by_rank = {r["rank"]: r for r in rep["per_rank"]}
    others = sorted(by_rank[r]["compute_ms"] for r in range(WORLD) if r != SLOW)
    # under the suite's load the others compute slowly too (seen: 13.5 ms against 27.9 ms)
    assert by_rank[SLOW]["compute_ms"] > 1.5 * others[1], by_rank
