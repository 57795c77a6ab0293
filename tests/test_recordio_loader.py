"""Loader: batches as one buffer + offsets, prefetch, epochs, scanner-style use, decode_fixed."""

import threading

import numpy as np
import pytest
import torch

from pybridge import recordio as rio
from pybridge.errors import Closed, CorruptData, InvalidArgument, IOFailure
from recordio_spec import chunk


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("ds")
    paths, records = [], []
    for f, n in enumerate([50, 13, 77]):
        recs = [b"%d:%d" % (f, i) for i in range(n)]
        path = str(d / f"shard-{f}.recordio")
        rio.write_file(path, recs, ["none", "snappy", "gzip"][f], 64)
        paths.append(path)
        records += recs
    return paths, records


def flatten(batches):
    return [r for b in batches for r in b.tolist()]


@pytest.mark.parametrize("prefetch", [0, 1, 4])
def test_single_rank_reads_everything_in_order(dataset, prefetch):
    paths, records = dataset
    with rio.Loader(paths, 16, prefetch=prefetch) as loader:
        batches = list(loader)
        assert len(batches) == len(loader) == 9
        assert [len(b) for b in batches] == [16] * 8 + [12]
        assert flatten(batches) == records
        for b in batches:
            assert b.data.dtype == np.uint8 and b.data.flags.c_contiguous and b.data.ndim == 1
            assert b.offsets.dtype == np.int64 and b.offsets[0] == 0 and b.offsets[-1] == len(b.data)


def test_set_epoch_reshuffles_deterministically(dataset):
    paths, records = dataset
    with rio.Loader(paths, 10, shuffle=True, seed=1, task_records=5) as loader:
        e0 = flatten(loader)
        assert flatten(loader) == e0  # same epoch, same order
        loader.set_epoch(1)
        e1 = flatten(loader)
    assert e0 != e1 and sorted(e0) == sorted(e1) == sorted(records)
    with rio.Loader(paths, 10, shuffle=True, seed=1, task_records=5, epoch=1) as other:
        assert flatten(other) == e1  # another process with the same seed and epoch agrees


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_get_equal_batches(dataset, drop_last):
    paths, records = dataset
    world = 3
    per_rank = []
    for rank in range(world):
        with rio.Loader(paths, 8, num_replicas=world, rank=rank, shuffle=True, drop_last=drop_last) as ld:
            batches = list(ld)
            assert len(batches) == ld.num_batches
            per_rank.append(batches)
    assert len({len(b) for b in per_rank}) == 1
    assert len({tuple(len(x) for x in b) for b in per_rank}) == 1  # same batch sizes too
    got = [r for b in per_rank for r in flatten(b)]
    if drop_last:
        assert len(got) == len(set(got)) and all(len(x) == 8 for b in per_rank for x in b)
    else:
        assert set(got) == set(records)


def test_scanner_style(dataset):
    paths, records = dataset
    with rio.Loader(paths, 32) as loader:
        for _ in range(2):  # after None, the next call starts a new pass
            got = []
            while (batch := loader.next_batch()) is not None:
                got.extend(batch.tolist())
            assert got == records
        list(loader)  # a finished for-loop pass does not end the next scanner pass early
        assert loader.next_batch() is not None


def test_close_stops_prefetch_thread(dataset):
    paths, _ = dataset
    before = {t.ident for t in threading.enumerate()}
    loader = rio.Loader(paths, 4, prefetch=2)
    it = iter(loader)
    next(it)
    loader.close()
    loader.close()  # twice is fine
    leftover = [t for t in threading.enumerate()
                if t.ident not in before and t.name == "pybridge-recordio-prefetch"]
    assert leftover == []
    with pytest.raises(Closed):
        loader.next_batch()


def test_set_prefetch_applies_from_the_next_pass(dataset):
    paths, records = dataset

    def prefetch_threads():
        return [t for t in threading.enumerate() if t.name == "pybridge-recordio-prefetch"]
    with rio.Loader(paths, 4, prefetch=2) as loader:
        assert loader.next_batch() is not None and len(prefetch_threads()) == 1
        loader.set_prefetch(0)  # the running pass keeps its thread
        rest = []
        while (b := loader.next_batch()) is not None:
            rest += b.tolist()
        assert rest == records[4:]
        got = []
        while (b := loader.next_batch()) is not None:  # the next pass: read on this thread
            assert prefetch_threads() == []
            got += b.tolist()
        assert got == records
        with pytest.raises(InvalidArgument, match="prefetch"):
            loader.set_prefetch(-1)


def test_errors_surface_in_the_consumer(tmp_path):
    good = chunk([b"a", b"b"])
    bad = bytearray(chunk([b"c", b"d"]))
    bad[-1] ^= 1
    path = tmp_path / "bad.recordio"
    path.write_bytes(good + bytes(bad) + good)
    with rio.Loader([str(path)], 1, prefetch=2) as loader:
        with pytest.raises(CorruptData, match="chunk 1, byte offset 30: checksum mismatch"):
            list(loader)
    with rio.Loader([str(path)], 1, prefetch=2, skip_corrupt=True) as loader:
        batches = list(loader)
        assert len(batches) == len(loader) == 6  # batch count kept; skipped records leave gaps
        assert flatten(batches) == [b"a", b"b", b"a", b"b"]
        assert loader.corrupt_chunks == 1 and loader.skipped_records == 2


def test_dynamic_single_process_and_drop_last(dataset):
    paths, records = dataset
    with rio.Loader(paths, 16, partition="dynamic", task_records=7, shuffle=True) as loader:
        assert loader.num_batches is None
        with pytest.raises(TypeError):
            len(loader)
        assert sorted(flatten(loader)) == sorted(records)
        assert sorted(flatten(loader)) == sorted(records)  # a second pass has its own counter
    with rio.Loader(paths, 16, partition="dynamic", drop_last=True) as loader:
        assert all(len(b) == 16 for b in loader)


def test_glob_and_argument_checks(dataset, tmp_path):
    paths, records = dataset
    pattern = paths[0].replace("shard-0", "shard-*")
    with rio.Reader(paths[0], index_cache=True):
        pass  # leaves a sidecar next to the shard, which the glob must skip
    with rio.Loader(pattern, 100) as loader:
        assert loader.files == sorted(paths) and flatten(loader) == records
    for kw in [dict(batch_size=0), dict(partition="random"), dict(prefetch=-1),
               dict(num_replicas=2, rank=2), dict(partition="dynamic", num_replicas=2, rank=0),
               dict(shuffle=True, seed=-1), dict(seed=-1)]:  # a bad seed fails at open
        with pytest.raises(InvalidArgument):
            rio.Loader(paths, **{"batch_size": 4, **kw})
    with pytest.raises(InvalidArgument, match="no files match"):
        rio.Loader(str(tmp_path / "none-*.recordio"), 4)
    with pytest.raises(IOFailure):
        rio.Loader([str(tmp_path / "missing.recordio")], 4)


def test_decode_fixed_mnist_layout(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 50).astype(np.uint8)
    images = rng.integers(0, 256, (50, 28, 28)).astype(np.uint8)
    path = str(tmp_path / "mnist.recordio")
    rio.write_file(path, [bytes([labels[i]]) + images[i].tobytes() for i in range(50)], "snappy", 4000)
    layout = [("label", "u1", ()), ("image", "u1", (28, 28))]
    got_l, got_i = [], []
    with rio.Loader(path, 16) as loader:
        for batch in loader:
            out = rio.decode_fixed(batch.data, batch.offsets, layout)
            got_l.append(out["label"])
            got_i.append(out["image"])
            t = batch.decode(layout, as_torch=True)
            assert t["image"].dtype == torch.uint8 and t["image"].shape == (len(batch), 28, 28)
    np.testing.assert_array_equal(np.concatenate(got_l), labels)
    np.testing.assert_array_equal(np.concatenate(got_i), images)


def test_decode_fixed_multibyte_and_wrong_sizes():
    vals = np.arange(6, dtype="<f4").reshape(3, 2)
    ids = np.array([7, 8, 9], "<i8")
    recs = [ids[i].tobytes() + vals[i].tobytes() for i in range(3)]
    b = rio.Batch.from_records(recs)
    out = rio.decode_fixed(b.data, b.offsets, [("id", "<i8", ()), ("x", "<f4", (2,))])
    np.testing.assert_array_equal(out["id"], ids)
    np.testing.assert_array_equal(out["x"], vals)
    bad = rio.Batch.from_records(recs[:2] + [recs[2] + b"!"])
    with pytest.raises(CorruptData, match="record 2 is 17 bytes, the layout needs 16"):
        rio.decode_fixed(bad.data, bad.offsets, [("id", "<i8", ()), ("x", "<f4", (2,))])
    with pytest.raises(InvalidArgument):
        rio.decode_fixed(b.data, b.offsets, [])
