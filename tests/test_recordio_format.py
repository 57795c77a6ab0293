"""RecordIO byte format: golden files derived by hand from the spec, and round trips."""

import io
import os
import zlib

import numpy as np
import pytest

from pybridge import recordio as rio
from pybridge.errors import Closed, InvalidArgument
from pybridge.recordio import checksum, format as fmt
from recordio_spec import (STREAM_IDENTIFIER, crc32_ieee, crc32c, golden, golden_path, header,
                           raw_payload)

GOLDEN = golden()


def test_hand_written_crcs_match_the_published_check_values():
    # Pins the independent CRCs the golden bytes rest on ("123456789" is the standard check input).
    assert crc32_ieee(b"123456789") == 0xCBF43926
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32_ieee(b"some payload") == zlib.crc32(b"some payload")


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_checked_in_golden_file_matches_the_spec(name):
    with open(golden_path(name), "rb") as f:
        assert f.read() == GOLDEN[name][0], f"{name}.recordio drifted from the spec-derived bytes"


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_reader_reads_golden_file(name):
    _, records, _ = GOLDEN[name]
    assert rio.read_file(golden_path(name)) == records
    with rio.Reader(golden_path(name)) as r:
        assert r.verify() == []


@pytest.mark.parametrize("name", [n for n in sorted(GOLDEN) if GOLDEN[n][2]])
def test_writer_reproduces_golden_bytes(name, tmp_path):
    data, records, how = GOLDEN[name]
    for via_batch in (False, True):
        path = tmp_path / f"{name}-{via_batch}.recordio"
        with rio.Writer(path, **how) as w:
            if via_batch:
                b = rio.Batch.from_records(records)
                w.write_batch(b.data, b.offsets)
            else:
                for r in records:
                    w.write(r)
        assert path.read_bytes() == data


def test_golden_chunk_table():
    with rio.Reader(golden_path("mixed")) as r:
        got = [(c.ordinal, c.offset, c.compressor_name, c.num_records, c.first_record) for c in r.chunks]
    assert got == [(0, 0, "none", 3, 0), (1, 40, "none", 1, 3), (2, 72, "snappy", 2, 4),
                   (3, 125, "gzip", 2, 6)]


def test_gzip_chunk_layout(tmp_path):
    # gzip bytes are not canonical (deflate output varies), so check the fields and the payload.
    records = [b"Go", b"torch", b""]
    path = tmp_path / "g.recordio"
    rio.write_file(path, records, "gzip")
    data = path.read_bytes()
    magic, crc, comp, size, n = np.frombuffer(data[:20], "<u4").tolist()
    body = data[20:]
    assert (magic, comp, size, n) == (0x01020304, 2, len(body), 3)
    assert crc == crc32_ieee(body)
    assert body[:2] == b"\x1f\x8b"
    assert zlib.decompress(body, 31) == raw_payload(records)


def test_snappy_chunks_use_the_framing_format(tmp_path):
    path = tmp_path / "s.recordio"
    records = [os.urandom(50) + bytes(5000) for _ in range(30)]
    rio.write_file(path, records, "snappy")
    data = path.read_bytes()
    body = data[20:]
    assert body.startswith(STREAM_IDENTIFIER)
    assert data[:20] == header(body, 1, 30)
    assert rio.read_file(path) == records


SIZES = {
    "empty_records": lambda rng: [b""] * 5,
    "variable": lambda rng: [rng.bytes(int(n)) for n in rng.integers(0, 300, 200)],
    "uniform_small": lambda rng: [rng.bytes(100) for _ in range(300)],
    "uniform_large": lambda rng: [rng.bytes(9000) for _ in range(40)],  # the scatter-read path
    "mixed_large": lambda rng: [rng.bytes(9000) for _ in range(20)] + [b"x"],
    "single": lambda rng: [b"only"],
}


@pytest.mark.parametrize("compressor", ["none", "snappy", "gzip"])
@pytest.mark.parametrize("shape", sorted(SIZES))
@pytest.mark.parametrize("limit", [1 << 20, 20000, 9000])
def test_round_trip(tmp_path, compressor, shape, limit):
    records = SIZES[shape](np.random.default_rng(len(shape) + limit))
    a, b = tmp_path / "a.recordio", tmp_path / "b.recordio"
    with rio.Writer(a, compressor, limit) as w:
        for r in records:
            w.write(r)
    with rio.Writer(b, compressor, limit) as w:
        batch = rio.Batch.from_records(records)
        w.write_batch(batch.data, batch.offsets)
    assert a.read_bytes() == b.read_bytes()  # same chunking rule either way
    assert rio.read_file(a) == records
    with rio.Reader(a) as r:
        assert r.num_records == len(records)
        for c in r.chunks:  # no chunk goes over the limit, and none is empty
            assert 0 < c.num_records
            assert sum(len(x) for x in records[c.first_record:c.first_record + c.num_records]) <= limit


def test_chunk_closes_at_the_limit_and_never_empty(tmp_path):
    path = tmp_path / "c.recordio"
    with rio.Writer(path, "none", max_chunk_bytes=10) as w:
        for r in [b"12345", b"12345", b"1", b"1234567890", b""]:
            w.write(r)
        w.flush()
        w.flush()  # nothing open: no empty chunk
    with rio.Reader(path) as r:
        assert [c.num_records for c in r.chunks] == [2, 1, 2]


def test_empty_writer_leaves_an_empty_file_and_writer_rejects_use_after_close(tmp_path):
    path = tmp_path / "e.recordio"
    w = rio.Writer(path)
    w.close()
    assert path.read_bytes() == b""
    with pytest.raises(Closed):
        w.write(b"x")
    with rio.Reader(path, allow_empty=True) as r:
        assert r.num_records == 0


def test_writer_to_a_file_object_leaves_it_open():
    buf = io.BytesIO()
    with rio.Writer(buf, "none") as w:
        w.write(b"abc")
    assert not buf.closed
    assert buf.getvalue() == header(raw_payload([b"abc"]), 0, 1) + raw_payload([b"abc"])


@pytest.mark.parametrize("bad", ["lz4", 3, -1, None, True])
def test_unknown_compressor_on_write(tmp_path, bad):
    with pytest.raises(InvalidArgument):
        rio.Writer(tmp_path / "x", bad)


def test_crc32_combine_matches_zlib():
    rng = np.random.default_rng(1)
    for la, lb in [(0, 5), (5, 0), (1, 1), (100, 37), (4096, 1 << 16)]:
        a, b = rng.bytes(la), rng.bytes(lb)
        assert checksum.crc32_combine(zlib.crc32(a), zlib.crc32(b), lb) == zlib.crc32(a + b)


def use_crc(monkeypatch, name):
    """Start the CRC backend chain at `name` ("" for the default order)."""
    monkeypatch.setenv("PYBRIDGE_RECORDIO_CRC", name)
    monkeypatch.setattr(checksum, "_impl", None)


@pytest.mark.parametrize("name", checksum._BACKENDS)
def test_crc_backends_agree(monkeypatch, name):
    use_crc(monkeypatch, name)
    if checksum.backend() != name:
        pytest.skip(f"{name} is not installed")
    big = np.frombuffer(np.random.default_rng(2).bytes(100_003), np.uint8)
    # What the reader passes (numpy arrays, memoryview slices), large and small, and bytes.
    for data in (big, big[5:], memoryview(big)[1:77_777], memoryview(big)[3:7], big[:3], big[:0],
                 bytes(big[:5000]), bytearray(b"abc")):
        assert checksum.crc32_update(7, data) == zlib.crc32(data, 7)


def test_crc_chain_skips_missing_and_wrong_backends(monkeypatch):
    def missing():
        raise ImportError("not installed")
    monkeypatch.setitem(checksum._LOADERS, "isal", missing)
    monkeypatch.setitem(checksum._LOADERS, "zlib-ng", lambda: lambda data, crc=0: 0)  # wrong answers
    monkeypatch.setitem(checksum._LOADERS, "libdeflate", missing)
    use_crc(monkeypatch, "")
    assert checksum.backend() == "zlib"
    assert checksum.crc32_update(7, b"123456789") == zlib.crc32(b"123456789", 7)
    use_crc(monkeypatch, "no-such-backend")  # an unknown name means the default order
    assert checksum.backend() == "zlib"


def test_crc_env_starts_the_chain_at_the_named_backend(monkeypatch):
    use_crc(monkeypatch, "zlib")
    assert checksum.backend() == "zlib"
    use_crc(monkeypatch, "libdeflate")
    assert checksum.backend() in ("libdeflate", "zlib")


def test_reads_match_with_zlib_crc(tmp_path, monkeypatch):
    use_crc(monkeypatch, "zlib")
    path = tmp_path / "z.recordio"
    records = [bytes([i]) * 9000 for i in range(30)]
    rio.write_file(path, records, "none", 50_000)
    assert rio.read_file(path) == records


def test_parse_records_rejects_what_does_not_add_up():
    payload = np.frombuffer(raw_payload([b"ab", b"cde"]), np.uint8)
    recs = fmt.parse_records(payload, 2)
    assert recs.lengths.tolist() == [2, 3] and recs.starts.tolist() == [4, 10]
    for n in (1, 3):
        with pytest.raises(fmt.FormatError):
            fmt.parse_records(payload, n)


def test_the_shared_vectors_are_the_specs_and_pythons_numbers():
    # tests/data/recordio/vectors.json is what the Go tests read too (go/recordio): it must be
    # what the spec derives, and Python's constants must be its limits.
    import json

    import recordio_spec
    with open(recordio_spec.VECTORS_PATH) as f:
        assert json.load(f) == recordio_spec.vectors(), "regenerate with: python tests/recordio_spec.py"
    limits = recordio_spec.LIMITS
    assert (fmt.MAGIC, fmt.HEADER_SIZE, fmt.DEFAULT_MAX_CHUNK_BYTES, fmt.SNAPPY_MAX_BLOCK, fmt.MAX_DECODED_BYTES) == (
        limits["magic"], limits["header_size"], limits["default_max_chunk_bytes"], limits["snappy_max_block"],
        limits["max_decoded_bytes"])


def _snappy_frame_sizes(stream):
    """Uncompressed size of each data frame of a Snappy framing-format stream."""
    sizes, i = [], 0
    while i < len(stream):
        kind, n = stream[i], int.from_bytes(stream[i + 1:i + 4], "little")
        body = stream[i + 4:i + 4 + n]
        if kind == 0x01:  # uncompressed: CRC then the data
            sizes.append(n - 4)
        elif kind == 0x00:  # compressed: CRC then a block whose varint preamble is its size
            size, shift, j = 0, 0, 4
            while True:
                size |= (body[j] & 0x7F) << shift
                shift, j = shift + 7, j + 1
                if not body[j - 1] & 0x80:
                    break
            sizes.append(size)
        i += 4 + n
    return sizes


def test_the_snappy_writer_keeps_frames_within_the_shared_limit(tmp_path):
    path = tmp_path / "big.recordio"
    records = [bytes(range(256)) * 300, os.urandom(70000)]  # 76800 compressible, 70000 not
    rio.write_file(str(path), records, compressor="snappy")
    data = path.read_bytes()
    sizes = _snappy_frame_sizes(data[fmt.HEADER_SIZE:])
    assert sum(sizes) == sum(4 + len(r) for r in records) and len(sizes) > 2
    assert max(sizes) <= fmt.SNAPPY_MAX_BLOCK
