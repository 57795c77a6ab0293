"""Crafted RecordIO files (valid CRCs, hostile sizes): every one is CorruptData naming the file,
the chunk and its offset, is skipped under skip_corrupt, and never makes the reader allocate
what it declares (issue 32, finding 9). The Go reader checks the same shared files
(go/recordio/hostile_test.go)."""

import json
import struct
import tracemalloc
import zlib

import pytest

from pybridge import recordio as rio
from pybridge.errors import CorruptData, InvalidArgument
from pybridge.recordio import format as fmt
from recordio_spec import LIMITS, VECTORS_PATH, chunk, header, hostile, raw_payload, snappy_stream

GOOD = chunk([b"ok"])  # chunk 0 of every file here; the hostile chunk is chunk 1, at this offset
MiB = 1 << 20


def write(tmp_path, data, name="hostile.recordio"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def refused(path, words, **kw):
    """The CorruptData reading `path` gives, after checking it names file, chunk 1 and offset."""
    with rio.Reader(path, **kw) as r, pytest.raises(CorruptData) as info:
        r.read(0, r.num_records)
    err = info.value
    assert (err.path, err.chunk, err.offset) == (path, 1, len(GOOD)), err
    assert f"{path}: chunk 1, byte offset {len(GOOD)}" in str(err) and words in str(err), err
    return err


def skipped(path, lost=1, **kw):
    """Under skip_corrupt the good chunk is read and the hostile one (`lost` records) skipped
    and reported."""
    with rio.Reader(path, skip_corrupt=True, **kw) as r:
        assert list(r) == [b"ok"]
        assert (r.corrupt_chunks, r.skipped_records) == (1, lost)
        assert r.corrupt_errors[0].chunk == 1
    with rio.Loader([path], 4, skip_corrupt=True, prefetch=0, **kw) as loader:
        assert [rec for b in loader for rec in b.tolist()] == [b"ok"] and loader.corrupt_chunks == 1


def gzip_zeros(n, members=1):
    """A gzip stream (`members` members) of one record of zeros, n bytes decoded in all, built
    a mebibyte at a time: ~1000:1, so n = 64 MiB costs a 64 KiB payload and little memory."""
    out, left = [], n
    for m in range(members):
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        part = left // (members - m)
        left -= part
        if m == 0:
            out.append(c.compress(struct.pack("<I", n - 4)))
            part -= 4
        zeros = bytes(MiB)
        while part:
            k = min(part, MiB)
            out.append(c.compress(zeros[:k]))
            part -= k
        out.append(c.flush())
    return b"".join(out)


def test_the_shared_hostile_files_are_corrupt_data_and_skipped(tmp_path):
    # Among them a 44-byte chunk whose Snappy frame declares 32 GiB: a MemoryError before.
    with open(VECTORS_PATH) as f:
        shared = json.load(f)["corrupt"]
    assert shared == {name: data.hex() for name, data in hostile().items()} and len(shared) >= 2
    assert len(hostile()["snappy_frame_declares_32gib"]) - len(GOOD) == 44
    for name, data in shared.items():
        path = write(tmp_path, bytes.fromhex(data), f"{name}.recordio")
        refused(path, "more than the framing format's 65536")
        skipped(path)


def test_an_uncompressed_snappy_frame_over_65536_bytes_is_refused(tmp_path):
    frame = b"\x01" + (4 + 65537).to_bytes(3, "little") + b"\0" * (4 + 65537)  # refused before its CRC
    path = write(tmp_path, GOOD + chunk([b"x"], fmt.SNAPPY, snappy_stream([frame])))
    refused(path, "declares 65537 bytes")
    skipped(path)


@pytest.mark.parametrize("members", [1, 3])
def test_a_gzip_bomb_is_refused_without_allocating_it(tmp_path, monkeypatch, members):
    # One record of 64 MiB of zeros, valid in every other respect, in a 64 KiB chunk: read whole
    # before; now refused after at most the cap (8 MiB here, through the environment, as the
    # loader, C and Go readers take it).
    payload = gzip_zeros(64 * MiB, members)
    assert len(payload) < 128 << 10
    path = write(tmp_path, GOOD + chunk([b"x"], fmt.GZIP, payload))
    monkeypatch.setenv("PYBRIDGE_RECORDIO_MAX_DECODED", str(8 * MiB))
    tracemalloc.start()
    try:
        refused(path, f"gzip payload decodes to more than {8 * MiB} bytes")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 * MiB, f"reading the refused chunk allocated {peak} bytes"
    skipped(path)
    monkeypatch.delenv("PYBRIDGE_RECORDIO_MAX_DECODED")
    assert rio.read_file(path, max_decoded_bytes=64 * MiB)[0] == b"ok"  # a raised cap reads it


@pytest.mark.parametrize("compressor", [fmt.SNAPPY, fmt.GZIP])
def test_a_chunk_decoding_to_exactly_the_cap_reads_and_one_byte_more_does_not(tmp_path, compressor):
    records = [bytes(range(256)) * 300, b"tail"]  # several Snappy frames
    size = len(raw_payload(records))
    payload = bytes(fmt.compress(compressor, raw_payload(records)))
    path = write(tmp_path, GOOD + header(payload, compressor, 2, checksum=zlib.crc32(payload)) + payload)
    assert rio.read_file(path, max_decoded_bytes=size) == [b"ok"] + records
    refused(path, f"decodes to more than {size - 1} bytes", max_decoded_bytes=size - 1)
    skipped(path, 2, max_decoded_bytes=size - 1)


def test_the_default_cap_is_the_shared_limit_and_bad_caps_are_named(tmp_path, monkeypatch):
    path = write(tmp_path, GOOD)
    with rio.Reader(path) as r:
        assert r.max_decoded_bytes == fmt.MAX_DECODED_BYTES == LIMITS["max_decoded_bytes"] == 256 * MiB
    monkeypatch.setenv(fmt.MAX_DECODED_ENV, "12345")
    with rio.Reader(path) as r:
        assert r.max_decoded_bytes == 12345
    with pytest.raises(InvalidArgument, match="max_decoded_bytes"):
        rio.Reader(path, max_decoded_bytes=0)
    monkeypatch.setenv(fmt.MAX_DECODED_ENV, "lots")
    with pytest.raises(InvalidArgument, match=fmt.MAX_DECODED_ENV):
        rio.Reader(path)
