"""RecordIO bytes built by hand from the format spec, independently of pybridge.recordio.

Nothing here imports the package under test: CRCs are computed bit by bit, Snappy frames and
gzip members are assembled field by field, so a change in the library cannot silently move
the expected bytes along with it.

Spec (DESIGN.md, and the Go library wangkuiyi/recordio):
  chunk  = header + payload
  header = five uint32 LE: magic 0x01020304, CRC-32 (IEEE) of payload, compressor
           (0 none, 1 Snappy framing format, 2 gzip), len(payload), number of records
  raw payload = for each record: uint32 LE length, bytes
"""

import json
import os
import struct

MAGIC = 0x01020304
GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "data", "recordio")


def _crc32_reflected(data, poly, crc=0):
    """A reflected CRC-32 with polynomial `poly`, one bit at a time (no table, no zlib)."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def crc32_ieee(data, crc=0):
    """CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320)."""
    return _crc32_reflected(data, 0xEDB88320, crc)


def crc32c(data):
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as the Snappy framing format uses."""
    return _crc32_reflected(data, 0x82F63B78)


def snappy_mask(crc):
    """The framing format stores CRC-32C 'masked': rotate right by 15, add a constant."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def raw_payload(records):
    return b"".join(struct.pack("<I", len(r)) + r for r in records)


def header(payload, compressor, num_records, magic=MAGIC, checksum=None):
    crc = crc32_ieee(payload) if checksum is None else checksum
    return struct.pack("<5I", magic, crc, compressor, len(payload), num_records)


def chunk(records, compressor=0, payload=None):
    """A chunk; `payload` (already compressed) defaults to the raw payload (compressor none)."""
    body = raw_payload(records) if payload is None else payload
    return header(body, compressor, len(records)) + body


# ---- Snappy framing format (https://github.com/google/snappy/blob/main/framing_format.txt)

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"


def _frame(kind, body):
    return bytes([kind]) + len(body).to_bytes(3, "little") + body


def snappy_uncompressed_frame(data):
    """Chunk type 0x01: masked CRC-32C of the data, then the data as is."""
    return _frame(0x01, struct.pack("<I", snappy_mask(crc32c(data))) + data)


def snappy_literal_frame(data):
    """Chunk type 0x00 holding a raw Snappy block made of one literal (no back-references):
    varint(uncompressed length), literal tag ((len - 1) << 2 for len <= 60), the bytes."""
    assert 1 <= len(data) <= 60 and len(data) < 128
    block = bytes([len(data)]) + bytes([(len(data) - 1) << 2]) + data
    return _frame(0x00, struct.pack("<I", snappy_mask(crc32c(data))) + block)


def snappy_stream(frames):
    return STREAM_IDENTIFIER + b"".join(frames)


# ---- gzip (RFC 1952) with one stored deflate block (RFC 1951, BTYPE=00)

def gzip_stored(data):
    assert len(data) < 0xFFFF
    head = b"\x1f\x8b\x08\x00" + b"\x00\x00\x00\x00" + b"\x00\xff"  # id, CM, FLG, MTIME, XFL, OS
    block = b"\x01" + struct.pack("<HH", len(data), len(data) ^ 0xFFFF) + data  # BFINAL=1, stored
    return head + block + struct.pack("<II", crc32_ieee(data), len(data))


# ---- the golden files

def golden():
    """name -> (file bytes, records, how the Python writer reproduces it or None)."""
    out = {}
    # Two uncompressed chunks with an 8-byte chunk limit: "abc" + "defgh" fill 8 bytes, the empty
    # record still fits (8 + 0 is not over the limit), "ijklmnop" would exceed it and opens chunk 1.
    recs = [b"abc", b"defgh", b"", b"ijklmnop"]
    out["none"] = (chunk(recs[:3]) + chunk(recs[3:]), recs, dict(compressor="none", max_chunk_bytes=8))

    recs = [b"Go", b"torch"]
    raw = raw_payload(recs)  # 15 bytes: too short for Snappy to shrink, so stored uncompressed
    snappy = snappy_stream([snappy_uncompressed_frame(raw)])
    out["snappy"] = (chunk(recs, 1, snappy), recs, dict(compressor="snappy"))

    # A compressed (type 0x00) frame, as other Snappy encoders may emit for the same payload.
    snappy_c = snappy_stream([snappy_literal_frame(raw)])
    out["snappy_compressed_frame"] = (chunk(recs, 1, snappy_c), recs, None)

    # Go's snappy.NewWriter is unbuffered: each Write (length prefix, record) is its own frame.
    frames = []
    for r in recs:
        frames += [snappy_uncompressed_frame(struct.pack("<I", len(r))), snappy_uncompressed_frame(r)]
    out["snappy_go_frames"] = (chunk(recs, 1, snappy_stream(frames)), recs, None)

    out["gzip"] = (chunk(recs, 2, gzip_stored(raw)), recs, None)

    # Compressors may differ from chunk to chunk within one file.
    mixed = out["none"][0] + out["snappy"][0] + out["gzip"][0]
    out["mixed"] = (mixed, out["none"][1] + recs + recs, None)
    return out


def golden_path(name):
    return os.path.join(GOLDEN_DIR, f"{name}.recordio")


# The format's numbers every implementation (Python's pybridge.recordio, Go's go/recordio)
# must share; vectors.json carries them with the golden files' records, and both test
# suites check their own constants and readers against that one file.
LIMITS = {
    "magic": MAGIC,
    "header_size": 20,
    "default_max_chunk_bytes": 32 << 20,  # raw record bytes at which a writer closes a chunk
    "snappy_max_block": 65536,  # uncompressed bytes in one Snappy frame (the framing format's limit)
    "max_decoded_bytes": 256 << 20,  # default cap on what one compressed chunk may decode to
}
VECTORS_PATH = os.path.join(GOLDEN_DIR, "vectors.json")


def hostile():
    """name -> bytes of a crafted file with valid CRCs that every reader must refuse as corrupt
    data (naming chunk 1 at its offset) after returning chunk 0's record b"ok", without allocating
    what the file declares."""
    good = chunk([b"ok"])
    # A compressed frame whose block declares 2^35 - 1 bytes (the largest 5-byte varint, ~32 GiB),
    # followed by one byte: 44 bytes as a file of its own.
    frame_32g = _frame(0x00, b"\0\0\0\0" + b"\xff\xff\xff\xff\x7f" + b"\0")
    # One byte over the framing format's 65536 per frame, declared by a compressed frame.
    frame_65537 = _frame(0x00, b"\0\0\0\0" + b"\x81\x80\x04" + b"\0")
    return {
        "snappy_frame_declares_32gib": good + chunk([b"x"], 1, snappy_stream([frame_32g])),
        "snappy_frame_over_block": good + chunk([b"x"], 1, snappy_stream([frame_65537])),
    }


def vectors():
    """What vectors.json holds: the limits, each golden file's records (hex), and the hostile
    files every reader must refuse (hex)."""
    return {"limits": LIMITS,
            "records": {name: [r.hex() for r in recs] for name, (_, recs, _) in sorted(golden().items())},
            "corrupt": {name: data.hex() for name, data in sorted(hostile().items())}}


if __name__ == "__main__":  # regenerate the checked-in files: python tests/recordio_spec.py
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    for name, (data, _, _) in golden().items():
        with open(golden_path(name), "wb") as f:
            f.write(data)
        print(golden_path(name), len(data), "bytes")
    with open(VECTORS_PATH, "w") as f:
        json.dump(vectors(), f, indent=1, sort_keys=True)
        f.write("\n")
    print(VECTORS_PATH)
