"""Bad input: every error names the file, the chunk and its byte offset; nothing wrong is returned."""

import struct

import numpy as np
import pytest

from pybridge import errors
from pybridge import recordio as rio
from pybridge.errors import CorruptData, InvalidArgument, IOFailure
from recordio_spec import chunk, crc32_ieee, header, raw_payload, snappy_stream

A = [b"first", b"second"]
B = [b"third"]
C = [b"fourth", b"fifth", b"sixth"]


@pytest.fixture(autouse=True, params=["mmap", "pread"])
def read_path(request, monkeypatch):
    """Every test here runs over both read paths: the memory map (default) and pread."""
    monkeypatch.setenv("PYBRIDGE_RECORDIO_MMAP", "1" if request.param == "mmap" else "0")
    return request.param


def layout():
    """Three uncompressed chunks and the byte offset of each."""
    chunks = [chunk(A), chunk(B), chunk(C)]
    offsets = np.cumsum([0] + [len(c) for c in chunks[:-1]]).tolist()
    return chunks, offsets


def write(tmp_path, data, name="bad.recordio"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def read_all(path, **kw):
    with rio.Reader(path, **kw) as r:
        return list(r)


def expect_corrupt(path, chunk_no, offset, words, **kw):
    with pytest.raises(CorruptData) as info:
        read_all(path, **kw)
    err = info.value
    msg = str(err)
    assert msg.startswith(f"{path}: chunk {chunk_no}, byte offset {offset}: "), msg
    assert words in msg, msg
    assert (err.path, err.chunk, err.offset) == (path, chunk_no, offset)
    assert err.code == errors.CORRUPT
    return err


def test_truncated_in_the_header(tmp_path):
    chunks, offs = layout()
    path = write(tmp_path, chunks[0] + chunks[1] + chunks[2][:7])
    expect_corrupt(path, 2, offs[2], "truncated chunk")


def test_truncated_in_the_payload(tmp_path):
    chunks, offs = layout()
    path = write(tmp_path, chunks[0] + chunks[1] + chunks[2][:-3])
    expect_corrupt(path, 2, offs[2], "truncated chunk")


def test_wrong_magic(tmp_path):
    chunks, offs = layout()
    bad = bytearray(chunks[1])
    bad[0] ^= 0xFF
    path = write(tmp_path, chunks[0] + bytes(bad) + chunks[2])
    expect_corrupt(path, 1, offs[1], "bad magic")


def test_checksum_mismatch(tmp_path):
    chunks, offs = layout()
    bad = bytearray(chunks[2])
    bad[-1] ^= 0x01  # a payload byte: the header is intact, the CRC no longer matches
    path = write(tmp_path, chunks[0] + chunks[1] + bytes(bad))
    expect_corrupt(path, 2, offs[2], "checksum mismatch")


def test_payload_size_larger_than_the_file(tmp_path):
    chunks, offs = layout()
    body = raw_payload(B)
    lying = struct.pack("<5I", 0x01020304, crc32_ieee(body), 0, 1 << 30, 1) + body
    path = write(tmp_path, chunks[0] + lying + chunks[2])
    expect_corrupt(path, 1, offs[1], "larger than the whole file")


def test_unknown_compressor(tmp_path):
    chunks, offs = layout()
    body = raw_payload(B)
    path = write(tmp_path, chunks[0] + header(body, 7, 1) + body + chunks[2])
    expect_corrupt(path, 1, offs[1], "unknown compressor 7")


def test_record_length_past_the_chunk_end(tmp_path):
    chunks, offs = layout()
    body = struct.pack("<I", 5) + b"third"[:3]  # says 5 bytes, 3 follow; the CRC is valid
    path = write(tmp_path, chunks[0] + header(body, 0, 1) + body + chunks[2])
    expect_corrupt(path, 1, offs[1], "runs past the end")


def test_fewer_records_than_the_header_says(tmp_path):
    body = raw_payload(A)
    path = write(tmp_path, header(body, 0, 3) + body)
    expect_corrupt(path, 0, 0, "record 2")
    body = raw_payload([b"ab"])
    path = write(tmp_path, header(body, 0, 0xFFFFFFFF) + body, "huge.recordio")
    expect_corrupt(path, 0, 0, "holds at most")


def test_header_that_says_zero_records(tmp_path):
    # The record count is outside the checksum: a chunk whose header says 0 records must not
    # be indexed as empty (its records would vanish and later ones shift).
    chunks, offs = layout()
    bad = bytearray(chunks[1])
    bad[16:20] = struct.pack("<I", 0)
    path = write(tmp_path, chunks[0] + bytes(bad) + chunks[2])
    expect_corrupt(path, 1, offs[1], "says 0 records")
    with pytest.raises(CorruptData, match="says 0 records"):
        list(rio.Loader([path], 2))
    with rio.Reader(path, skip_corrupt=True) as r:  # skipping it is explicit, and counted
        assert list(r) == A + C and r.corrupt_chunks == 1


def test_bytes_after_the_last_record(tmp_path):
    body = raw_payload(A) + b"junk"
    path = write(tmp_path, header(body, 0, 2) + body)
    expect_corrupt(path, 0, 0, "follow the last")


@pytest.mark.parametrize("compressor,body", [
    (1, snappy_stream([b"\x01\x05\x00\x00garbage"])),
    (1, b"not a snappy stream"),
    (2, b"\x1f\x8b\x08\x00 not gzip"),
])
def test_payload_that_does_not_decompress(tmp_path, compressor, body):
    chunks, offs = layout()
    path = write(tmp_path, chunks[0] + header(body, compressor, 1) + body)
    expect_corrupt(path, 1, offs[1], "does not decode")


def test_empty_file(tmp_path):
    path = write(tmp_path, b"")
    expect_corrupt(path, 0, 0, "empty")
    assert read_all(path, allow_empty=True) == []


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.recordio")
    with pytest.raises(IOFailure) as info:
        rio.Reader(path)
    assert str(info.value).startswith(f"{path}: cannot open") and info.value.code == errors.IO


def test_record_larger_than_the_chunk_limit(tmp_path):
    path = tmp_path / "big.recordio"
    with rio.Writer(path, "none", max_chunk_bytes=100) as w:
        w.write(b"x" * 100)  # exactly the limit is fine
        with pytest.raises(InvalidArgument, match="larger than the chunk limit of 100 bytes"):
            w.write(b"x" * 101)
        batch = rio.Batch.from_records([b"a", b"y" * 150])
        with pytest.raises(InvalidArgument, match=r"record 1 of 150 bytes"):
            w.write_batch(batch.data, batch.offsets)
        w.write(b"after")  # the writer is still usable
    assert rio.read_file(path) == [b"x" * 100, b"after"]


def test_read_range_out_of_bounds(tmp_path):
    chunks, _ = layout()
    path = write(tmp_path, b"".join(chunks))
    with rio.Reader(path) as r:
        for start, count in [(0, 7), (6, 1), (-1, 1), (0, -1)]:
            with pytest.raises(InvalidArgument):
                r.read(start, count)
        assert r.read(6, 0).tolist() == []


def test_only_the_needed_chunks_are_read(tmp_path):
    # Chunk 0's payload is corrupt; a range in chunks 1-2 never touches it, so it succeeds.
    chunks, _ = layout()
    bad = bytearray(chunks[0])
    bad[-1] ^= 0x01
    path = write(tmp_path, bytes(bad) + chunks[1] + chunks[2])
    with rio.Reader(path) as r:
        assert r.read(2, 3).tolist() == B + C[:2]
        with pytest.raises(CorruptData):
            r.read(1, 1)


def test_checksums_can_be_skipped(tmp_path):
    chunks, _ = layout()
    body = raw_payload(B)
    wrong_crc = header(body, 0, 1, checksum=12345) + body
    path = write(tmp_path, chunks[0] + wrong_crc)
    expect_corrupt(path, 1, len(chunks[0]), "checksum mismatch")
    assert read_all(path, verify_checksums=False) == A + B


def test_skip_corrupt_skips_and_counts(tmp_path):
    chunks, offs = layout()
    bad_crc = bytearray(chunks[1])
    bad_crc[-1] ^= 0x01
    bad_magic = bytearray(chunks[0])
    bad_magic[1] ^= 0xFF
    data = chunks[0] + bytes(bad_crc) + chunks[2] + bytes(bad_magic) + chunks[2]
    path = write(tmp_path, data)
    with rio.Reader(path, skip_corrupt=True) as r:
        # The bad magic is found while indexing and skipped by resynchronizing on the next header.
        assert r.corrupt_chunks == 1 and r.num_records == 2 + 1 + 3 + 3
        assert list(r) == A + C + C  # chunk 1 (bad checksum) found and skipped while reading
        assert r.corrupt_chunks == 2 and r.skipped_records == 1
        assert sorted(e.chunk for e in r.corrupt_errors) == [1, 3]
        assert "checksum mismatch" in str(r.corrupt_errors[1])
        assert r.read(0, 4).tolist() == A + C[:1]  # a batch over a skipped chunk is shorter, never wrong
        assert r.corrupt_chunks == 2  # each corrupt chunk counted once
    with rio.Reader(path, skip_corrupt=True) as r:
        problems = r.verify()
        assert [(p.chunk, p.offset) for p in problems] == [(3, offs[2] + len(chunks[2])), (1, offs[1])]


def test_skip_corrupt_truncated_tail_and_unknown_compressor(tmp_path):
    chunks, _ = layout()
    body = raw_payload(B)
    data = chunks[0] + header(body, 9, 1) + body + chunks[2] + chunks[1][:-2]
    path = write(tmp_path, data)
    with rio.Reader(path, skip_corrupt=True) as r:
        assert list(r) == A + C
        assert r.corrupt_chunks == 2
        assert [e.chunk for e in r.corrupt_errors] == [1, 3]


@pytest.mark.parametrize("compressor", ["none", "snappy", "gzip"])
def test_no_single_byte_corruption_goes_unnoticed(tmp_path, compressor):
    # Flip every byte of a small file in turn: each read either raises CorruptData or returns
    # exactly the original records (never a wrong record).
    path = tmp_path / "ok.recordio"
    records = [b"alpha", b"", b"beta" * 3, b"gamma"]
    rio.write_file(path, records, compressor, max_chunk_bytes=12)
    good = path.read_bytes()
    bad_path = tmp_path / "flipped.recordio"
    for i in range(len(good)):
        data = bytearray(good)
        data[i] ^= 0x5A
        bad_path.write_bytes(bytes(data))
        try:
            got = read_all(str(bad_path))
        except CorruptData:
            continue
        assert got == records, f"byte {i} flipped: wrong records returned silently"


def test_file_truncated_after_it_was_indexed(tmp_path, read_path):
    # A memory-mapped read past the end of a file that shrank would kill the process with
    # SIGBUS: each chunk's extent is checked against the file's size first, on both paths.
    chunks, offs = layout()
    path = write(tmp_path, b"".join(chunks))
    with rio.Reader(path) as r:
        assert r.use_mmap == (read_path == "mmap")
        with open(path, "r+b") as f:
            f.truncate(offs[1] + 25)  # chunk 1 loses the end of its payload, chunk 2 all of it
        assert r.read(0, 2).tolist() == A
        for start, chunk_no in ((2, 1), (3, 2)):
            with pytest.raises(CorruptData) as info:
                r.read(start, 1)
            assert (info.value.chunk, info.value.offset) == (chunk_no, offs[chunk_no])
            assert "truncated chunk" in str(info.value) and "did the file change" in str(info.value)


def test_checksummed_ahead_chunk_still_fails_when_read(tmp_path, read_path):
    # Reading sequentially, the next chunk's CRC is computed in advance (memory map): a bad
    # one must fail exactly when that chunk is read, and only then.
    chunks, offs = layout()
    bad = bytearray(chunks[1])
    bad[-1] ^= 0x01
    path = write(tmp_path, chunks[0] + bytes(bad) + chunks[2])
    with rio.Reader(path) as r:
        assert r.read(0, 2).tolist() == A
        if read_path == "mmap":
            assert r._ahead is not None and r._ahead[0] == 1  # the path under test was taken
        with pytest.raises(CorruptData, match="checksum mismatch") as info:
            r.read(2, 1)
        assert info.value.chunk == 1
        assert r.read(3, 3).tolist() == C
    with rio.Reader(path, skip_corrupt=True) as r:
        assert [x for b in r.batches(2) for x in b.tolist()] == A + C and r.corrupt_chunks == 1
