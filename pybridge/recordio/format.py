"""RecordIO byte layout, byte-compatible with the Go library GoTorch used (wangkuiyi/recordio).

A file is a sequence of chunks, with no file header or footer. Each chunk is:

    20-byte header, five little-endian uint32:
        magic 0x01020304, CRC-32 (IEEE) of the compressed payload, compressor
        (0 none, 1 Snappy framing format, 2 gzip), compressed payload size, number of records
    compressed payload; before compression: for each record, uint32 LE length, then the bytes.

This module holds the pure encode/decode functions; I/O lives in writer.py, index.py and
reader.py. Decoders raise FormatError (no file context); callers turn it into CorruptData
naming the file, the chunk and the byte offset.

Decompression is bounded before it allocates: the header has no uncompressed size, so a chunk
may decode to at most `limit` bytes (MAX_DECODED_BYTES, 256 MiB, by default; the reader's
max_decoded_bytes or PYBRIDGE_RECORDIO_MAX_DECODED): a Snappy stream's size is summed from its
frame headers (each frame at most 65536 bytes) before one byte is decoded, and gzip is inflated
with zlib's max_length, so a crafted payload that would expand further is refused after at most
`limit` bytes, never with a MemoryError.
"""

import struct
import zlib
from typing import Any, Callable, NamedTuple, Optional, Union

import cramjam
import numpy as np
import numpy.typing as npt

from ..base.jobenv import env_int
from ..base.checks import integer
from ..errors import CorruptData, InvalidArgument, IOFailure

MAGIC = 0x01020304
MAGIC_BYTES = struct.pack("<I", MAGIC)
HEADER = struct.Struct("<5I")
HEADER_SIZE = HEADER.size  # 20

NONE, SNAPPY, GZIP = 0, 1, 2
COMPRESSORS = {"none": NONE, "snappy": SNAPPY, "gzip": GZIP}
COMPRESSOR_NAMES = {v: k for k, v in COMPRESSORS.items()}

DEFAULT_MAX_CHUNK_BYTES = 32 << 20  # raw record bytes per chunk, as the Go writer
SNAPPY_MAX_BLOCK = 65536  # uncompressed bytes in one frame of the Snappy framing format
# Decoded bytes one compressed chunk may expand to (length prefixes included), unless the reader
# is told otherwise: 8x the default chunk, so any file written with max_chunk_bytes up to 128 MiB
# reads as is. The format has no uncompressed size to check against; this bounds what a crafted
# chunk can make a reader allocate (gzip expands up to ~1000:1, uint32 sizes allow terabytes).
MAX_DECODED_BYTES = 256 << 20
MAX_DECODED_ENV = "PYBRIDGE_RECORDIO_MAX_DECODED"
MAX_U32 = 0xFFFFFFFF
GZIP_LEVEL = 6  # Go's gzip.DefaultCompression is level 6 as well

_U32 = struct.Struct("<I")


class FormatError(ValueError):
    """A decoding failure without file context; see corrupt()."""


class Header(NamedTuple):
    magic: int
    checksum: int
    compressor: int
    size: int  # compressed payload bytes
    num_records: int


_Bytes = npt.NDArray[np.uint8]
_Int64 = npt.NDArray[np.int64]
_Payload = Union[bytes, bytearray, memoryview, _Bytes]


def compressor_id(compressor: Union[str, int]) -> int:
    """Accept 0/1/2 or 'none'/'snappy'/'gzip' (any case).

    Example::

        >>> from pybridge import recordio
        >>> recordio.compressor_id("Snappy"), recordio.compressor_id(2)
        (1, 2)
    """
    if isinstance(compressor, str):
        cid = COMPRESSORS.get(compressor.strip().lower())
        if cid is None:
            raise InvalidArgument(f"unknown compressor {compressor!r}; choose none, snappy or gzip")
        return cid
    if isinstance(compressor, bool) or not isinstance(compressor, (int, np.integer)) \
            or int(compressor) not in COMPRESSOR_NAMES:
        raise InvalidArgument(f"unknown compressor {compressor!r}; choose 0 (none), 1 (snappy) or 2 (gzip)")
    return int(compressor)


def decoded_limit(value: Optional[int] = None) -> int:
    """The decoded-size cap: `value` if given, else PYBRIDGE_RECORDIO_MAX_DECODED, else
    MAX_DECODED_BYTES."""
    name = "max_decoded_bytes"
    if value is None:
        value, name = env_int(MAX_DECODED_ENV), MAX_DECODED_ENV
        if value is None:
            return MAX_DECODED_BYTES
    return integer(name, value, low=1, high=1 << 62, expected="a byte count of at least 1")


def pack_header(checksum: int, compressor: int, size: int, num_records: int) -> bytes:
    """A chunk's 20-byte header."""
    return HEADER.pack(MAGIC, checksum, compressor, size, num_records)


def unpack_header(buf: _Payload) -> Header:
    """The header at the start of `buf` (its magic not checked here)."""
    return Header(*HEADER.unpack_from(buf))


def where(path: object, chunk: Optional[int] = None, offset: Optional[int] = None) -> str:
    """'path: chunk 3, byte offset 1234' (the parts that are known)."""
    ctx = [] if chunk is None else [f"chunk {chunk}"]
    if offset is not None:
        ctx.append(f"byte offset {offset}")
    return f"{path}: {', '.join(ctx)}" if ctx else str(path)


def _with_context(cls: type[Any], path: object, chunk: Optional[int], offset: Optional[int], msg: str) -> Any:
    err = cls(f"{where(path, chunk, offset)}: {msg}")
    err.path, err.chunk, err.offset = str(path), chunk, offset
    return err


def corrupt(path: object, chunk: Optional[int], offset: Optional[int], msg: str) -> CorruptData:
    """CorruptData naming the file, the chunk index and the chunk's byte offset (also as attributes)."""
    err: CorruptData = _with_context(CorruptData, path, chunk, offset, msg)
    return err


def io_failure(path: object, chunk: Optional[int], offset: Optional[int], msg: str) -> IOFailure:
    """IOFailure naming the file, the chunk index and the byte offset (also as attributes)."""
    err: IOFailure = _with_context(IOFailure, path, chunk, offset, msg)
    return err


# ---------------------------------------------------------------- compression

def compress(compressor: int, payload: _Payload) -> Any:  # bytes-like (cramjam's Buffer for snappy)
    """Compress a raw chunk payload. Snappy is the framing (stream) format, as Go's snappy.NewWriter."""
    if compressor == NONE:
        return payload
    if compressor == SNAPPY:
        return cramjam.snappy.compress(bytes(payload))
    if compressor == GZIP:
        c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: gzip wrapper
        return c.compress(payload) + c.flush()
    raise InvalidArgument(f"unknown compressor {compressor!r}")


def _too_big(what: str, limit: int) -> FormatError:
    return FormatError(f"{what} decodes to more than {limit} bytes, the most a chunk may decode to "
                       f"(max_decoded_bytes / {MAX_DECODED_ENV}; default {MAX_DECODED_BYTES})")


def _snappy_framed_size(data: Any, limit: int) -> int:
    """Uncompressed size of a Snappy framing-format stream, read from its frame headers.

    Knowing it lets us decompress into one preallocated buffer instead of a growing one, and
    check it before allocating: a frame declaring more than 65536 bytes (the format's limit), or
    a stream adding up to more than `limit`, is a FormatError. So is a stream whose frames do
    not parse (nothing is decoded unbounded).
    """
    n, pos, total = len(data), 0, 0
    while pos < n:
        if pos + 4 > n:
            raise FormatError(f"snappy payload does not decode: frame header at byte {pos} is truncated")
        kind = data[pos]
        length = data[pos + 1] | data[pos + 2] << 8 | data[pos + 3] << 16
        body = pos + 4
        if body + length > n:
            raise FormatError(f"snappy payload does not decode: the frame at byte {pos} ({length} bytes) runs "
                              f"past the end of the {n}-byte stream")
        size = 0
        if kind == 0x00:  # compressed frame: masked CRC-32C, then a raw block led by a varint size
            p, shift = body + 4, 0
            while True:
                if p >= body + length or shift > 28:
                    raise FormatError(f"snappy payload does not decode: the frame at byte {pos} has no "
                                      "valid block size")
                b = data[p]
                size |= (b & 0x7F) << shift
                p, shift = p + 1, shift + 7
                if not b & 0x80:
                    break
        elif kind == 0x01:  # uncompressed frame: masked CRC-32C, then the bytes
            size = length - 4
        if size > SNAPPY_MAX_BLOCK:
            raise FormatError(f"snappy payload does not decode: the frame at byte {pos} declares {size} "
                              f"bytes, more than the framing format's {SNAPPY_MAX_BLOCK}")
        total += size
        if total > limit:
            raise _too_big(f"snappy stream (the frame at byte {pos} reaches {total} bytes)", limit)
        pos = body + length
    return total


def _gunzip(data: _Payload, limit: int) -> bytes:
    """Inflate a gzip stream (one member or several) into at most `limit` bytes: zlib's
    max_length stops each step at the bytes still allowed, plus one to see that it was more."""
    pieces: list[bytes] = []
    rest, total = bytes(data), 0
    try:
        while True:  # a gzip stream may hold several members
            d = zlib.decompressobj(31)
            piece = d.decompress(rest, limit - total + 1)
            total += len(piece)
            if total > limit:
                raise _too_big("gzip payload", limit)
            pieces.append(piece)
            if not d.eof:  # (input left over means the cap stopped it, handled above)
                raise FormatError("gzip payload does not decode: the stream is truncated")
            rest = d.unused_data
            if not rest:
                break
    except zlib.error as exc:
        raise FormatError(f"gzip payload does not decode: {exc}") from None
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def decompress(compressor: int, data: _Payload, alloc: Optional[Callable[[int], _Bytes]] = None,
               limit: int = MAX_DECODED_BYTES) -> _Bytes:
    """Decompress a chunk payload; returns a uint8 numpy array of at most `limit` bytes
    (FormatError, before allocating more, for a payload that would decode to more).

    alloc(n) -> uint8 array of at least n bytes lets the caller supply a reusable buffer:
    a fresh 32 MiB allocation per chunk costs page faults comparable to the decompression.
    """
    if compressor == NONE:
        return np.frombuffer(data, np.uint8)
    if compressor == SNAPPY:
        size = _snappy_framed_size(memoryview(data), limit)
        try:
            dest = (alloc(size) if alloc else np.empty(size, np.uint8))[:size]
            written: int = cramjam.snappy.decompress_into(data, dest)
        except cramjam.DecompressionError as exc:
            raise FormatError(f"snappy payload does not decode: {exc}") from None
        if written != size:
            raise FormatError(f"snappy stream decoded to {written} bytes, its frames declare {size}")
        return dest
    if compressor == GZIP:
        return np.frombuffer(_gunzip(data, limit), np.uint8)
    raise FormatError(f"unknown compressor {compressor} (known: 0 none, 1 snappy, 2 gzip)")


# ---------------------------------------------------------------- payload

class Records(NamedTuple):
    """Where each record's bytes lie inside a decoded payload."""
    starts: _Int64  # first data byte (after the length prefix)
    lengths: _Int64
    stride: int  # 4 + record size when every record has the same size, else 0


def parse_records(payload: Any, num_records: int) -> Records:
    """Locate the records of a decoded payload, checking every length against the payload end.

    Fast path: the common fixed-size case (e.g. MNIST) is checked and located with numpy,
    without a Python loop per record. Variable sizes walk the length prefixes.
    """
    size, n = len(payload), int(num_records)
    if n == 0:
        if size:
            raise FormatError(f"header says 0 records but the payload holds {size} bytes")
        return Records(np.zeros(0, np.int64), np.zeros(0, np.int64), 0)
    if 4 * n > size:  # checked before allocating anything per record: n comes from the header
        raise FormatError(f"the header says {n} records, but a {size}-byte payload holds at most {size // 4}")
    first = int(_U32.unpack_from(payload, 0)[0])
    stride = first + 4
    if stride * n == size:
        prefixes = np.ndarray((n,), dtype="<u4", buffer=payload, offset=0, strides=(stride,))
        if (prefixes == first).all():
            starts = np.arange(4, size, stride, dtype=np.int64)
            return Records(starts, np.full(n, first, np.int64), stride)
    return _walk(payload, size, n)


def _walk(payload: Any, size: int, n: int) -> Records:
    unpack = _U32.unpack_from
    mv = memoryview(payload)
    starts, lengths = [0] * n, [0] * n
    pos = 0
    for i in range(n):
        if pos + 4 > size:
            raise FormatError(f"record {i}: length prefix at payload byte {pos} runs past the end of "
                              f"the {size}-byte payload (header says {n} records)")
        length = unpack(mv, pos)[0]
        pos += 4
        if pos + length > size:
            raise FormatError(f"record {i}: length {length} at payload byte {pos - 4} runs past the end "
                              f"of the {size}-byte payload")
        starts[i], lengths[i] = pos, length
        pos += length
    if pos != size:
        raise FormatError(f"{size - pos} bytes follow the last of the {n} records in the payload")
    return Records(np.array(starts, np.int64), np.array(lengths, np.int64), 0)


def gather_into(out: _Bytes, payload: _Bytes, recs: Records, a: int, b: int) -> None:
    """Copy records [a, b) of a payload, without their length prefixes, into `out`: a uint8
    array of exactly their total size."""
    if b <= a:
        return
    lengths = recs.lengths[a:b]
    if recs.stride:
        n = len(recs.starts)
        rows = payload[:n * recs.stride].reshape(n, recs.stride)[a:b, 4:]
        np.copyto(out.reshape(rows.shape), rows)
        return
    starts = recs.starts[a:b]
    if len(out) >= 512 * (b - a):
        # Large records: a slice copy each costs less than building a byte mask.
        pos = 0
        for s, n_ in zip(starts.tolist(), lengths.tolist()):
            out[pos:pos + n_] = payload[s:s + n_]
            pos += n_
        return
    lo, hi = int(starts[0]) - 4, int(starts[-1] + lengths[-1])
    keep = np.ones(hi - lo, bool)
    keep[(starts - 4 - lo)[:, None] + np.arange(4)] = False  # drop the length prefixes
    np.compress(keep, payload[lo:hi], out=out)
