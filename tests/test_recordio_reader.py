"""Reader: index, sidecar index cache, random access to record ranges, batch buffers."""

import os

import numpy as np
import pytest

from pybridge import recordio as rio
from pybridge.errors import CorruptData
from pybridge.recordio import index as rindex


@pytest.fixture(autouse=True, params=["mmap", "pread"])
def read_path(request, monkeypatch):
    """Every test here runs over both read paths: the memory map (default) and pread."""
    monkeypatch.setenv("PYBRIDGE_RECORDIO_MMAP", "1" if request.param == "mmap" else "0")
    return request.param


def make(tmp_path, records, compressor="none", limit=2000, name="data.recordio"):
    path = str(tmp_path / name)
    rio.write_file(path, records, compressor, limit)
    return path


@pytest.fixture(scope="module")
def variable(tmp_path_factory):
    rng = np.random.default_rng(5)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 200, 500)]
    return make(tmp_path_factory.mktemp("r"), records), records


@pytest.mark.parametrize("compressor", ["none", "snappy", "gzip"])
def test_random_ranges(tmp_path, compressor):
    rng = np.random.default_rng(6)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 200, 400)]
    path = make(tmp_path, records, compressor)
    with rio.Reader(path) as r:
        assert r.num_chunks > 10
        bounds = [c.first_record for c in r.chunks]
        starts = set(rng.integers(0, 400, 40).tolist()) | set(bounds) | {b - 1 for b in bounds[1:]}
        for start in sorted(starts):
            for count in (0, 1, 7, 120, 400 - start):
                count = min(count, 400 - start)
                batch = r.read(start, count)
                assert batch.tolist() == records[start:start + count]
                assert batch.offsets[0] == 0 and len(batch.offsets) == count + 1
                assert batch.data.dtype == np.uint8 and batch.offsets.dtype == np.int64
                assert batch.data.flags.c_contiguous
        assert r[-1] == records[-1] and r[123] == records[123]


def test_sequential_batches(variable):
    path, records = variable
    with rio.Reader(path) as r:
        batches = list(r.batches(64))
        assert [len(b) for b in batches] == [64] * 7 + [52]
        assert [x for b in batches for x in b.tolist()] == records
        assert [x for b in r.batches(10, start=495) for x in b] == records[495:]
        assert [b[0].tobytes() for b in r.batches(100, 100, 300)] == [records[i] for i in (100, 200, 300)]


def test_chunk_index(variable):
    path, records = variable
    with rio.Reader(path) as r:
        chunks = r.chunks
        assert sum(c.num_records for c in chunks) == len(records) == r.num_records
        assert chunks[0].offset == 0
        for a, b in zip(chunks, chunks[1:]):
            assert b.offset == a.offset + 20 + a.size
            assert b.first_record == a.first_record + a.num_records
        assert chunks[-1].offset + 20 + chunks[-1].size == os.path.getsize(path)


def test_sidecar_index_cache(tmp_path, monkeypatch):
    records = [b"r%d" % i for i in range(300)]
    path = make(tmp_path, records)
    side = path + rindex.SIDECAR_SUFFIX
    with rio.Reader(path, index_cache=True) as r:
        expected = r.chunks
    assert os.path.exists(side)

    def no_scan(*a, **k):
        raise AssertionError("scanned although the sidecar is valid")

    monkeypatch.setattr(rindex, "scan", no_scan)
    with rio.Reader(path, index_cache=True) as r:
        assert r.chunks == expected and list(r) == records
    monkeypatch.undo()

    # The data file changes (same size, new mtime): the sidecar is stale and rebuilt.
    new_records = [b"R%d" % i for i in range(300)]
    rio.write_file(path, new_records, "none", 2000)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    with rio.Reader(path, index_cache=True) as r:
        assert list(r) == new_records

    # A damaged sidecar is ignored.
    with open(side, "r+b") as f:
        f.seek(40)
        f.write(b"\xff\xff")
    scanned = []
    real_scan = rindex.scan
    monkeypatch.setattr(rindex, "scan", lambda *a, **k: scanned.append(1) or real_scan(*a, **k))
    with rio.Reader(path, index_cache=True) as r:
        assert list(r) == new_records
    assert scanned == [1]


def test_sidecar_custom_path_and_unwritable_location(tmp_path):
    path = make(tmp_path, [b"a", b"b"])
    custom = str(tmp_path / "custom.idx")
    with rio.Reader(path, index_cache=custom) as r:
        assert list(r) == [b"a", b"b"]
    assert os.path.exists(custom)
    with rio.Reader(path, index_cache=str(tmp_path / "missing-dir" / "x.idx")) as r:
        assert list(r) == [b"a", b"b"]  # a cache that cannot be written is no error


@pytest.mark.parametrize("sizes", ["equal", "varied"])
def test_held_batches_stay_valid(tmp_path, monkeypatch, sizes):
    # Batches live in pooled buffers (large equal records read with pread: views of pooled
    # chunk buffers; large batches: pooled batch buffers): a buffer must never be reused while
    # a batch still uses it. The pooling threshold is lowered so these small batches hit it.
    from pybridge.recordio import reader as rd
    monkeypatch.setattr(rd, "_POOLED_BATCH_MIN", 1000)
    extra = [0] * 120 if sizes == "equal" else np.random.default_rng(3).integers(0, 500, 120).tolist()
    records = [bytes([i % 251]) * (9000 + extra[i]) + i.to_bytes(4, "little") for i in range(120)]
    path = make(tmp_path, records, limit=50_000)
    held = []
    with rio.Reader(path, cache_chunks=1) as r:
        for start in range(0, 120, 3):
            held.append((start, r.read(start, 3)))
        for _ in range(2):
            for b in r.batches(7):
                pass
    with rio.Reader(path) as r2:
        list(r2.batches(5))
    for start, batch in held:
        assert batch.tolist() == records[start:start + 3]


@pytest.mark.parametrize("size", [100, 9000])
def test_batches_are_read_only(tmp_path, size):
    # A batch may view the reader's cached chunk: writing to it would change later reads.
    records = [bytes([i]) * size for i in range(20)]
    path = make(tmp_path, records, limit=50_000)
    with rio.Reader(path) as r:
        batch = r.read(0, 4)
        with pytest.raises(ValueError):
            batch.data[0] = 255
        assert r.read(0, 4).tolist() == records[:4]
        mine = np.array(batch.data)  # the documented way to get a writable copy
        mine[0] = 255
        assert r.read(0, 1).tolist() == records[:1]


def test_release_reopens(variable):
    path, records = variable
    with rio.Reader(path) as r:
        assert r.read(0, 3).tolist() == records[:3]
        r.release()
        assert r.read(450, 50).tolist() == records[450:]


def test_batch_helpers():
    b = rio.Batch.from_records([b"ab", b"", b"cde"])
    assert len(b) == 3 and b.nbytes == 5
    assert b.lengths.tolist() == [2, 0, 3]
    assert b[2].tobytes() == b"cde" and b[-3].tobytes() == b"ab"
    with pytest.raises(IndexError):
        b.record(3)
    empty = rio.Batch.from_records([])
    assert len(empty) == 0 and empty.tolist() == [] and empty.offsets.tolist() == [0]


@pytest.mark.parametrize("threads", ["1", "3"])
def test_piecewise_and_parallel_reads(tmp_path, monkeypatch, threads):
    # Big chunks are read in pieces, on several threads, with the CRCs combined: shrink the
    # thresholds so that small test files take those paths too.
    from pybridge.recordio import reader as rd
    monkeypatch.setattr(rd, "_PARALLEL_MIN", 1000)
    monkeypatch.setattr(rd, "_PIECE", 700)
    monkeypatch.setattr(rd, "_SCATTER_MIN", 300)
    monkeypatch.setattr(rd, "_GROUP_BYTES", 1500)
    monkeypatch.setenv("PYBRIDGE_RECORDIO_THREADS", threads)
    rng = np.random.default_rng(9)
    cases = {"uniform": [rng.bytes(400) for _ in range(60)],
             "variable": [rng.bytes(int(n)) for n in rng.integers(0, 500, 60)]}
    for name, records in cases.items():
        for compressor in ("none", "snappy"):
            path = make(tmp_path, records, compressor, limit=10_000, name=f"{name}-{compressor}")
            assert rio.read_file(path) == records
            # A flipped byte deep in a chunk is still caught by the combined checksum.
            data = bytearray(open(path, "rb").read())
            data[20 + 3000] ^= 0x10
            bad = tmp_path / f"bad-{name}-{compressor}"
            bad.write_bytes(bytes(data))
            with pytest.raises(CorruptData, match="chunk 0, byte offset 0: checksum mismatch"):
                rio.read_file(str(bad))


@pytest.mark.parametrize("crc", ["", "zlib"])  # the fastest installed backend, and the fallback
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_piecewise_crc_catches_a_flip_anywhere(tmp_path, monkeypatch, crc, where):
    # Pieces are checksummed as they arrive, on two threads, and the CRCs chained/combined:
    # a flipped byte in the first piece, in a middle one or in the very last byte of the
    # payload must fail the chunk before any of its records is returned.
    from pybridge.recordio import checksum, reader as rd
    monkeypatch.setenv("PYBRIDGE_RECORDIO_CRC", crc)
    monkeypatch.setattr(checksum, "_impl", None)
    monkeypatch.setattr(rd, "_PARALLEL_MIN", 1000)
    monkeypatch.setattr(rd, "_PIECE", 700)
    monkeypatch.setattr(rd, "_SCATTER_MIN", 300)
    monkeypatch.setattr(rd, "_GROUP_BYTES", 1500)
    monkeypatch.setenv("PYBRIDGE_RECORDIO_THREADS", "2")
    rng = np.random.default_rng(11)
    cases = {"uniform": [rng.bytes(400) for _ in range(50)],
             "variable": [rng.bytes(int(n)) for n in rng.integers(0, 700, 50)]}
    for name, records in cases.items():
        path = make(tmp_path, records, limit=1 << 20, name=f"{name}-{where}")  # one chunk
        with rio.Reader(path) as r:
            assert r.num_chunks == 1 and r.read(0, len(records)).tolist() == records
        size = os.path.getsize(path) - 20
        data = bytearray(open(path, "rb").read())
        data[20 + {"first": 0, "middle": size // 2, "last": size - 1}[where]] ^= 0x01
        open(path, "wb").write(bytes(data))
        with rio.Reader(path) as r:
            with pytest.raises(CorruptData, match="checksum mismatch"):
                r.read(len(records) - 1, 1)
        with rio.Reader(path, skip_corrupt=True) as r:
            assert len(r.read(0, len(records))) == 0 and r.corrupt_chunks == 1


def test_pool_places_data_at_the_file_offset_within_a_page():
    from pybridge.recordio.reader import _BufferPool
    pool = _BufferPool()
    for size, file_offset in [(1, 0), (5000, 20), (3 << 20, 4095), (100, 1348), (100, 5 * 4096 + 1348)]:
        owner, view = pool.take(size, file_offset)
        assert len(view) == size and view.ctypes.data % 4096 == file_offset % 4096
        assert view.base is owner or view.base is owner.base
        del view
        pool.give(owner)
    # A returned buffer is reused at another page offset when it is large enough.
    pool = _BufferPool()
    owner, view = pool.take(10_000, 7)
    address = owner.ctypes.data
    del view
    pool.give(owner)
    del owner  # the pool hands out only buffers that nothing else refers to
    again, view = pool.take(9_000, 3000)
    assert again.ctypes.data == address and view.ctypes.data % 4096 == 3000
