"""The RecordIO loader through the C ABI (cffi ABI mode over libpybridge.so): batches as
pointers, epochs, error codes whose messages name the file, chunk and byte offset, and
disjoint covering shares on real ranks."""

import os

import pytest

from capi_loader import LIB_PATH, init_world, last_error, load
from pybridge import recordio as rio
from ranks import run_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


@pytest.fixture(scope="module")
def abi():
    return load()


def make_dataset(d, sizes=(50, 13, 77)):
    paths, records = [], []
    for f, n in enumerate(sizes):
        recs = [b"%d:%d" % (f, i) for i in range(n)]
        path = os.path.join(str(d), f"shard-{f}.recordio")
        rio.write_file(path, recs, ["none", "snappy", "gzip"][f % 3], 64)
        paths.append(path)
        records += recs
    return paths, records


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("capi-ds"))


class Loader:
    """A thin test-side driver of the pb_loader_* functions."""

    def __init__(self, ffi, lib, files, batch_size, group=None, partition=0, shuffle=0, seed=0,
                 drop_last=0, skip_corrupt=0):
        self.ffi, self.lib = ffi, lib
        self._names = [ffi.new("char[]", os.fsencode(f)) for f in files]
        arr = ffi.new("char *[]", self._names)
        out = ffi.new("pb_loader **")
        self.rc = lib.pb_loader_open(group if group is not None else ffi.NULL, arr, len(files), batch_size,
                                     partition, shuffle, seed, drop_last, skip_corrupt, out)
        self.msg = last_error(ffi, lib) if self.rc else ""
        self.h = out[0] if self.rc == 0 else None
        self._d = ffi.new("uint8_t **")
        self._o = ffi.new("int64_t **")
        self._c = ffi.new("int64_t *")
        self._has = ffi.new("int32_t *")

    def next_raw(self):
        """(rc, has_batch, count, data pointer, offsets pointer)."""
        rc = self.lib.pb_loader_next(self.h, self._d, self._o, self._c, self._has)
        return rc, self._has[0], self._c[0], self._d[0], self._o[0]

    def next(self):
        """The next batch as a list of bytes; None at the end of the pass."""
        rc, has, n, data, offs = self.next_raw()
        if rc:
            raise RuntimeError(rc, last_error(self.ffi, self.lib))
        if not has:
            assert n == 0
            return None
        o = [offs[i] for i in range(n + 1)]
        assert o[0] == 0 and all(a <= b for a, b in zip(o, o[1:]))
        raw = bytes(self.ffi.buffer(data, o[-1])) if o[-1] else b""
        return [raw[o[i]:o[i + 1]] for i in range(n)]

    def run_pass(self):
        batches = []
        while (b := self.next()) is not None:
            batches.append(b)
        return batches

    def info(self, fn):
        out = self.ffi.new("int64_t *")
        rc = getattr(self.lib, fn)(self.h, out)
        return rc, out[0]

    def close(self):
        return self.lib.pb_loader_close(self.h)


def test_single_process_reads_everything_in_order(abi, dataset):
    ffi, lib = abi
    paths, records = dataset
    ld = Loader(ffi, lib, paths, 16)
    assert ld.rc == 0, ld.msg
    assert ld.info("pb_loader_num_records") == (0, len(records))
    assert ld.info("pb_loader_num_batches") == (0, -(-len(records) // 16))
    batches = ld.run_pass()
    assert [len(b) for b in batches[:-1]] == [16] * (len(batches) - 1)
    assert [r for b in batches for r in b] == records
    # The next pass starts after the end; shuffled epochs are permutations, repeatable.
    assert [r for b in ld.run_pass() for r in b] == records
    assert ld.close() == 0 and ld.close() == 0  # the second close is a no-op
    rc, *_ = ld.next_raw()
    assert rc == lib.PB_ERR_CLOSED
    assert lib.pb_loader_set_epoch(ld.h, 1) == lib.PB_ERR_CLOSED


def test_shuffle_and_epochs(abi, dataset):
    ffi, lib = abi
    paths, records = dataset
    ld = Loader(ffi, lib, paths, 10, shuffle=1, seed=4)
    assert ld.rc == 0, ld.msg
    passes = []
    for epoch in (0, 1, 0):
        assert lib.pb_loader_set_epoch(ld.h, epoch) == 0
        passes.append([r for b in ld.run_pass() for r in b])
    assert passes[0] == passes[2] != passes[1]
    assert passes[0] != records and sorted(passes[0]) == sorted(records) == sorted(passes[1])
    assert lib.pb_loader_set_epoch(ld.h, -1) == lib.PB_ERR_INVALID_ARGUMENT
    assert ld.close() == 0


def test_prefetch_setting(abi, dataset):
    ffi, lib = abi
    paths, records = dataset
    ld = Loader(ffi, lib, paths, 16)
    assert ld.rc == 0, ld.msg
    for batches in (0, 3):  # 0: read on the calling thread
        assert lib.pb_loader_set_prefetch(ld.h, batches) == 0
        assert [r for b in ld.run_pass() for r in b] == records
    assert lib.pb_loader_set_prefetch(ld.h, -1) == lib.PB_ERR_INVALID_ARGUMENT
    assert "prefetch must be a non-negative integer, got -1" in last_error(ffi, lib)
    assert ld.close() == 0
    assert lib.pb_loader_set_prefetch(ld.h, 1) == lib.PB_ERR_CLOSED


def test_batch_pointers_stay_valid_until_the_next_call(abi, tmp_path):
    ffi, lib = abi
    path = str(tmp_path / "big.recordio")
    recs = [bytes([i % 251]) * 3000 for i in range(64)]
    rio.write_file(path, recs, "snappy", 20000)  # several chunks: batches view pooled buffers
    ld = Loader(ffi, lib, [path], 5)
    assert ld.rc == 0, ld.msg
    seen = []
    while True:
        rc, has, n, data, offs = ld.next_raw()
        assert rc == 0
        if not has:
            break
        # Read the memory only after the prefetch thread had time to prepare later batches.
        import time
        time.sleep(0.002)
        seen += [bytes(ffi.buffer(data + offs[i], offs[i + 1] - offs[i])) for i in range(n)]
    assert seen == recs
    assert ld.close() == 0


def test_bad_arguments(abi, dataset):
    ffi, lib = abi
    paths, _ = dataset
    E = lib.PB_ERR_INVALID_ARGUMENT
    assert Loader(ffi, lib, paths, 0).rc == E
    bad = Loader(ffi, lib, paths, 4, partition=5)
    assert bad.rc == E and "partition" in bad.msg
    assert Loader(ffi, lib, paths, 4, shuffle=2).rc == E
    out = ffi.new("pb_loader **")
    assert lib.pb_loader_open(ffi.NULL, ffi.NULL, 1, 4, 0, 0, 0, 0, 0, out) == E
    path0 = ffi.new("char[]", os.fsencode(paths[0]))  # referenced: char *[] does not keep it alive
    arr = ffi.new("char *[]", [path0])
    assert lib.pb_loader_open(ffi.NULL, arr, 0, 4, 0, 0, 0, 0, 0, out) == E
    assert lib.pb_loader_open(ffi.NULL, arr, 1, 4, 0, 0, 0, 0, 0, ffi.NULL) == E
    ld = Loader(ffi, lib, paths, 4)
    assert lib.pb_loader_next(ld.h, ffi.NULL, ld._o, ld._c, ld._has) == E
    assert lib.pb_loader_num_batches(ld.h, ffi.NULL) == E
    assert lib.pb_loader_next(ffi.cast("pb_loader *", 0x1234), ld._d, ld._o, ld._c, ld._has) == E
    assert lib.pb_loader_close(ffi.NULL) == E
    assert ld.close() == 0


def test_missing_and_corrupt_files(abi, tmp_path):
    ffi, lib = abi
    good = [b"rec%02d" % i for i in range(12)]
    path = str(tmp_path / "data.recordio")
    rio.write_file(path, good, "none", 20)  # 4 records (20 bytes) per chunk
    with rio.Reader(path) as r:
        chunks = r.chunks
    off1, off2 = chunks[1].offset, chunks[2].offset
    data = open(path, "rb").read()

    missing = str(tmp_path / "missing.recordio")
    ld = Loader(ffi, lib, [path, missing], 4)
    assert ld.rc == lib.PB_ERR_IO and missing in ld.msg and ld.msg.startswith("pb_loader_open: ")

    empty = tmp_path / "empty.recordio"
    empty.write_bytes(b"")
    ld = Loader(ffi, lib, [str(empty)], 4)
    assert ld.rc == lib.PB_ERR_CORRUPT and str(empty) in ld.msg

    # Wrong magic: found when the chunk headers are scanned, at open.
    bad = bytearray(data)
    bad[off2] ^= 0xFF
    magic = tmp_path / "magic.recordio"
    magic.write_bytes(bad)
    ld = Loader(ffi, lib, [str(magic)], 4)
    assert ld.rc == lib.PB_ERR_CORRUPT
    assert f"{magic}: chunk 2, byte offset {off2}" in ld.msg and "magic" in ld.msg

    # A header that says 0 records (the count is not covered by the checksum): refused at
    # open, never read as an empty chunk that drops its records with PB_OK.
    bad = bytearray(data)
    bad[off1 + 16:off1 + 20] = b"\0\0\0\0"
    zero = tmp_path / "zero.recordio"
    zero.write_bytes(bad)
    ld = Loader(ffi, lib, [str(zero)], 4)
    assert ld.rc == lib.PB_ERR_CORRUPT, ld.msg
    assert f"{zero}: chunk 1, byte offset {off1}" in ld.msg and "0 records" in ld.msg

    # Checksum mismatch: found when the chunk is read; no record of it is returned.
    bad = bytearray(data)
    bad[off1 + 20 + 6] ^= 0xFF
    crc = tmp_path / "crc.recordio"
    crc.write_bytes(bad)
    ld = Loader(ffi, lib, [str(crc)], 4)
    assert ld.rc == 0, ld.msg
    assert ld.next() == good[:4]
    rc, *_ = ld.next_raw()
    msg = last_error(ffi, lib)
    assert rc == lib.PB_ERR_CORRUPT, msg
    assert f"{crc}: chunk 1, byte offset {off1}" in msg and "checksum" in msg
    assert ld.close() == 0

    # Truncated file: the last chunk's payload runs past the end.
    trunc = tmp_path / "trunc.recordio"
    trunc.write_bytes(data[:-3])
    ld = Loader(ffi, lib, [str(trunc)], 4)
    assert ld.rc == lib.PB_ERR_CORRUPT and f"{trunc}: chunk 2, byte offset {off2}" in ld.msg

    # skip_corrupt: the other chunks' records, the bad chunk counted.
    ld = Loader(ffi, lib, [str(crc)], 4, skip_corrupt=1)
    assert ld.rc == 0, ld.msg
    got = ld.run_pass()
    assert all(len(b) >= 1 for b in got)
    assert [r for b in got for r in b] == good[:4] + good[8:]
    assert ld.info("pb_loader_corrupt_chunks") == (0, 1)
    assert ld.close() == 0


def abi_ranks(rank, world, paths, partition, batch):
    ffi, lib = load()
    g = init_world(ffi, lib)
    ld = Loader(ffi, lib, paths, batch, group=g, partition=partition, shuffle=1, seed=7,
                drop_last=int(partition == 0))
    assert ld.rc == 0, ld.msg
    assert lib.pb_loader_set_epoch(ld.h, 3) == 0
    batches = ld.run_pass()
    nb = ld.info("pb_loader_num_batches")[1]
    assert ld.close() == 0
    # A second loader over the same files, batch size and epoch reads its own full share.
    again = Loader(ffi, lib, paths, batch, group=g, partition=partition, shuffle=1, seed=7,
                   drop_last=int(partition == 0))
    assert again.rc == 0, again.msg
    assert lib.pb_loader_set_epoch(again.h, 3) == 0
    second = [r for b in again.run_pass() for r in b]
    assert again.close() == 0
    assert lib.pb_barrier(g) == 0
    assert lib.pb_finalize(g) == 0
    return nb, [r for b in batches for r in b], [len(b) for b in batches], second


@pytest.mark.parametrize("partition", [0, 1], ids=["static", "dynamic"])
def test_ranks_get_disjoint_covering_shares(tmp_path, partition):
    paths, records = make_dataset(tmp_path, (40, 24, 32))  # 96 records
    world, batch = 3, 8
    results = run_ranks(abi_ranks, world, paths, partition, batch, timeout=90)
    shares = [r[1] for r in results]
    union = [rec for s in shares for rec in s]
    assert len(set(union)) == len(union), "shares overlap"
    assert sorted(union) == sorted(records), "shares do not cover the dataset"
    assert sorted(rec for r in results for rec in r[3]) == sorted(records), "the second loader"
    if partition == 0:  # equal batch counts, as announced
        assert [r[0] for r in results] == [4] * world
        assert [r[2] for r in results] == [[batch] * 4] * world
    else:
        assert [r[0] for r in results] == [-1] * world
