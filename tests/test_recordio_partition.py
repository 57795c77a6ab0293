"""Partitioning: static shares with DistributedSampler semantics, dynamic claiming via a store."""

import itertools
import os
import threading
import time
from collections import Counter

import pytest

from pybridge import recordio as rio
from pybridge.errors import InvalidArgument
from pybridge.recordio import partition as part
from ranks import run_ranks

DATASETS = {
    "one_record": [1],
    "one_file": [7],
    "uneven": [10, 3, 25],
    "many": [40, 40, 40, 1],
}


def records_of(pieces):
    return [(t.file, t.first + i) for t in pieces for i in range(t.count)]


def all_records(files, counts):
    return {(f, i) for f, n in zip(files, counts) for i in range(n)}


COMBOS = list(itertools.product(sorted(DATASETS), [None, 1, 4], [1, 2, 3, 4, 7], [1, 3, 8],
                                [False, True], [False, True]))


@pytest.mark.parametrize("dataset,task_records,world,batch,drop_last,shuffle", COMBOS)
def test_static_partition_properties(dataset, task_records, world, batch, drop_last, shuffle):
    counts = DATASETS[dataset]
    files = [f"f{i}" for i in range(len(counts))]
    tasks = part.make_tasks(files, counts, task_records)
    n = sum(counts)
    everything = all_records(files, counts)
    orders = []
    for epoch in (0, 1, 5):
        kw = dict(batch_size=batch, epoch=epoch, seed=11, shuffle=shuffle, drop_last=drop_last)
        shards = [part.static_shard(tasks, world, r, **kw) for r in range(world)]
        assert shards == [part.static_shard(tasks, world, r, **kw) for r in range(world)]  # deterministic
        m = part.per_rank_records(n, world, batch, drop_last)
        nb = part.num_batches(n, world, batch, drop_last)
        per_rank = [records_of(s) for s in shards]
        for recs, pieces in zip(per_rank, shards):
            assert len(recs) == m  # equal share, hence equal batch counts
            assert -(-len(recs) // batch) == nb
            assert all(t.count > 0 and 0 <= t.first and t.first + t.count <= counts[files.index(t.file)]
                       for t in pieces)
        got = Counter(r for recs in per_rank for r in recs)
        if drop_last:
            assert max(got.values(), default=1) == 1  # disjoint
            assert m % batch == 0 and n - world * m < world * (batch + 1)
            if m:
                assert nb == m // batch
        else:
            assert set(got) == everything  # covering
            assert sum(got.values()) == world * -(-n // world)
            assert sum(got.values()) - n < world  # padding only
        orders.append([r for recs in per_rank for r in recs])
    if not shuffle:
        assert orders[0] == orders[1] == orders[2]  # no shuffle: the epoch does not matter


def test_shuffle_changes_with_epoch_and_seed_not_with_rank():
    tasks = part.make_tasks(["a", "b"], [50, 50], 5)
    e0 = part.epoch_order(tasks, 0, 3, True)
    assert sorted(e0) == sorted(tasks)
    assert e0 != tasks
    assert part.epoch_order(tasks, 1, 3, True) != e0
    assert part.epoch_order(tasks, 0, 4, True) != e0
    assert part.epoch_order(tasks, 0, 3, True) == e0


def test_permutation_is_the_documented_algorithm():
    # Fisher-Yates driven by splitmix64, restated here so that other implementations can match.
    mask = (1 << 64) - 1

    def reference(n, seed, epoch):
        state = (seed * 0x9E3779B97F4A7C15 + epoch) & mask
        order = list(range(n))
        for i in range(n - 1, 0, -1):
            state = (state + 0x9E3779B97F4A7C15) & mask
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
            j = (z ^ (z >> 31)) % (i + 1)
            order[i], order[j] = order[j], order[i]
        return order

    for n, seed, epoch in [(0, 0, 0), (1, 5, 5), (10, 0, 0), (37, 12345, 3)]:
        got = part.permutation(n, seed, epoch)
        assert got == reference(n, seed, epoch) and sorted(got) == list(range(n))
    assert part.permutation(10, 0, 0) == [6, 3, 2, 9, 8, 1, 4, 7, 0, 5]  # pinned: must not drift


def test_chunk_aligned_tasks():
    tasks = part.chunk_tasks("f", [0, 10, 25, 26])
    assert tasks == [part.Task("f", 0, 10), part.Task("f", 10, 15), part.Task("f", 25, 1)]
    assert part.chunk_tasks("f", [0, 10, 25], 4) == [
        part.Task("f", s, c) for s, c in [(0, 4), (4, 4), (8, 2), (10, 4), (14, 4), (18, 4), (22, 3)]]


@pytest.mark.parametrize("bad", [dict(num_replicas=0, rank=0), dict(num_replicas=2, rank=2),
                                 dict(num_replicas=2, rank=-1), dict(num_replicas=2, rank=0, batch_size=0)])
def test_static_rejects_bad_arguments(bad):
    with pytest.raises(InvalidArgument):
        part.static_shard(part.make_tasks(["f"], [10]), **bad)


def test_dynamic_claims_each_task_once_with_threads():
    tasks = part.make_tasks(["a", "b", "c"], [30, 7, 50], 4)
    store = part.LocalStore()
    claimed = {}

    def rank(r, delay):
        dyn = part.DynamicPartition(tasks, store, shuffle=True, seed=2)
        claimed[r] = []
        for t in dyn.claims(epoch=3):
            claimed[r].append(t)
            time.sleep(delay)

    threads = [threading.Thread(target=rank, args=(r, 0.02 if r == 0 else 0.0)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(t for ts in claimed.values() for t in ts) == sorted(tasks)
    # The next epoch has its own counter: everything is handed out again.
    again = list(part.DynamicPartition(tasks, store, shuffle=True, seed=2).claims(epoch=4))
    assert sorted(again) == sorted(tasks)


# ---------------------------------------------------------------- real ranks

def _write_dataset(directory, files=4, per_file=60):
    paths = []
    for f in range(files):
        path = os.path.join(directory, f"part-{f}.recordio")
        rio.write_file(path, [b"%d:%d" % (f, i) for i in range(per_file)], "snappy", 100)
        paths.append(path)
    return paths


def _rank_main(rank, world, paths, slow_rank):
    import pybridge
    pybridge.init(timeout=30)
    out = {}
    # Static: rank and world come from the group.
    with rio.Loader(paths, 16, shuffle=True, seed=7) as loader:
        loader.set_epoch(2)
        out["static"] = [b.tolist() for b in loader]
        out["num_batches"] = loader.num_batches
    pybridge.barrier()
    # Dynamic: claims go through the group's store; one rank is slow to consume.
    with rio.Loader(paths, 8, partition="dynamic", task_records=8, prefetch=1) as loader:
        got = []
        for batch in loader:
            got.extend(batch.tolist())
            if rank == slow_rank:
                time.sleep(0.3)
        out["dynamic"] = got
    # The same data, batch size and epoch again: a second loader one after the other, then
    # two open at once (read in turns); each must see every record once, not find the first
    # loader's counters exhausted.
    with rio.Loader(paths, 8, partition="dynamic", task_records=8, prefetch=1) as loader:
        out["again"] = [r for b in loader for r in b.tolist()]
    with rio.Loader(paths, 8, partition="dynamic", task_records=8, prefetch=0) as a, \
            rio.Loader(paths, 8, partition="dynamic", task_records=8, prefetch=0) as b:
        out["pair"] = [[], []]
        for ba, bb in itertools.zip_longest(a, b):
            for k, batch in enumerate((ba, bb)):
                if batch is not None:
                    out["pair"][k].extend(batch.tolist())
    pybridge.barrier()  # the store lives on rank 0: keep it up until everyone is done
    pybridge.finalize()
    return out


def test_static_and_dynamic_on_real_ranks(tmp_path):
    world, slow = 3, 1
    paths = _write_dataset(str(tmp_path))
    everything = sorted(b"%d:%d" % (f, i) for f in range(4) for i in range(60))
    results = run_ranks(_rank_main, world, paths, slow, timeout=90)

    static = [[r for b in res["static"] for r in b] for res in results]
    assert {len(res["static"]) for res in results} == {results[0]["num_batches"]}
    assert sorted(r for s in static for r in s) == everything  # 240 records / 3 ranks: no padding

    dynamic = [res["dynamic"] for res in results]
    assert sorted(r for d in dynamic for r in d) == everything  # every record exactly once
    # The slow rank reads less than the even share a static split would give it, the fast ones
    # make up for it. (Not "less than every fast rank": under load one fast rank can start late.)
    fast = [len(d) for r, d in enumerate(dynamic) if r != slow]
    assert len(dynamic[slow]) < len(everything) // world < max(fast), [len(d) for d in dynamic]
    assert sorted(r for res in results for r in res["again"]) == everything
    for k in range(2):
        assert sorted(r for res in results for r in res["pair"][k]) == everything
