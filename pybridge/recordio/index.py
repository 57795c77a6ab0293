"""Chunk index of a RecordIO file, built by scanning chunk headers, optionally cached in a sidecar.

Scanning reads 20 bytes per chunk and seeks over the payloads, so it costs one small read per
chunk. Checksums are not verified here (that needs the payloads); the reader verifies each
chunk when it first reads it, and `verify` in the CLI reads them all.

The sidecar cache (`<file>.rioidx` by default) is trusted only when the data file's size and
mtime (ns) match what it recorded and its own checksum holds; otherwise it is rebuilt. It is
written only for files that scanned clean, and failures to write it are ignored (it is a cache).
"""

import os
import struct
import zlib
from typing import IO, Any, NamedTuple, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from ..errors import CorruptData
from .format import COMPRESSOR_NAMES, HEADER_SIZE, MAGIC, MAGIC_BYTES, corrupt, io_failure, unpack_header

SIDECAR_SUFFIX = ".rioidx"
_SIDECAR_MAGIC = b"PBRIOIDX"
_SIDECAR_HEAD = struct.Struct("<8sIQqQI")  # magic, version, file size, mtime_ns, chunks, crc
_SIDECAR_VERSION = 2  # 2: chunks whose header says 0 records are refused (1 indexed them)

CHUNK_DTYPE = np.dtype([("offset", "<i8"), ("size", "<i8"), ("records", "<i8"),
                        ("compressor", "<u4"), ("checksum", "<u4"), ("ordinal", "<i8")])


class ChunkInfo(NamedTuple):
    """One chunk of a file, as its header and the index say."""

    ordinal: int  # position among all chunks of the file, corrupt ones included
    offset: int  # byte offset of the chunk header
    compressor: int
    size: int  # compressed payload bytes
    num_records: int
    checksum: int
    first_record: int  # record number of the chunk's first record in the file

    @property
    def compressor_name(self) -> str:
        """"none", "snappy", "gzip" (or "unknown(N)")."""
        return COMPRESSOR_NAMES.get(self.compressor, f"unknown({self.compressor})")


class Index:
    """The good chunks of one file, in file order, as numpy columns."""

    def __init__(self, path: str, file_size: int, mtime_ns: int, table: npt.NDArray[Any],
                 corrupt_errors: Sequence[CorruptData] = ()) -> None:
        self.path = path
        self.file_size = file_size
        self.mtime_ns = mtime_ns
        self.table = table
        self.first = np.zeros(len(table) + 1, np.int64)  # first[i]: first record of chunk i
        np.cumsum(table["records"], out=self.first[1:])
        self.corrupt_errors = list(corrupt_errors)  # CorruptData for chunks skipped at scan time

    @property
    def num_chunks(self) -> int:
        """How many good chunks the file has."""
        return len(self.table)

    @property
    def num_records(self) -> int:
        """How many records its good chunks hold."""
        return int(self.first[-1])

    def chunk(self, i: int) -> ChunkInfo:
        """Good chunk i's ChunkInfo."""
        row = self.table[i]
        return ChunkInfo(int(row["ordinal"]), int(row["offset"]), int(row["compressor"]),
                         int(row["size"]), int(row["records"]), int(row["checksum"]),
                         int(self.first[i]))

    def chunks(self) -> list[ChunkInfo]:
        """Every good chunk's ChunkInfo, in file order."""
        return [self.chunk(i) for i in range(self.num_chunks)]

    def locate(self, record: int) -> int:
        """Position (in this index) of the chunk holding `record`."""
        return int(np.searchsorted(self.first, record, side="right")) - 1


def _pread(f: IO[bytes], size: int, offset: int, path: str, chunk: Optional[int]) -> bytes:
    try:
        return os.pread(f.fileno(), size, offset)
    except OSError as exc:
        raise io_failure(path, chunk, offset, f"read failed: {exc.strerror or exc}") from exc


def _plausible(f: IO[bytes], path: str, offset: int, file_size: int) -> bool:
    """Does a header that looks valid start at `offset`? (used to resynchronize)"""
    raw = _pread(f, HEADER_SIZE, offset, path, None)
    if len(raw) < HEADER_SIZE:
        return False
    h = unpack_header(raw)
    return h.magic == MAGIC and h.compressor in COMPRESSOR_NAMES and \
        offset + HEADER_SIZE + h.size <= file_size


def _resync(f: IO[bytes], path: str, start: int, file_size: int) -> int:
    """Offset of the next plausible chunk header at or after `start`, or file_size."""
    block = 1 << 20
    pos = start
    while pos < file_size:
        data = _pread(f, block + 3, pos, path, None)
        at = data.find(MAGIC_BYTES)
        while at != -1:
            if _plausible(f, path, pos + at, file_size):
                return pos + at
            at = data.find(MAGIC_BYTES, at + 1)
        pos += block
    return file_size


def scan(f: IO[bytes], path: str, skip_corrupt: bool = False, allow_empty: bool = False) -> Index:
    """Index an open file by walking its chunk headers.

    Bad headers raise CorruptData naming the chunk and its byte offset, unless skip_corrupt:
    then the bad chunk is skipped (for a broken header: up to the next plausible header) and
    recorded in Index.corrupt_errors.
    """
    try:
        st = os.fstat(f.fileno())
    except OSError as exc:
        raise io_failure(path, None, None, f"cannot stat: {exc.strerror or exc}") from exc
    size = st.st_size
    if size == 0 and not allow_empty:
        raise corrupt(path, 0, 0, "file is empty: a RecordIO file holds at least one chunk")
    rows: list[tuple[int, int, int, int, int, int]] = []
    errors: list[CorruptData] = []
    offset, ordinal = 0, 0
    while offset < size:
        raw = _pread(f, HEADER_SIZE, offset, path, ordinal)
        problem: str
        skip_to: Optional[int] = None
        if len(raw) < HEADER_SIZE:
            problem = f"truncated chunk: the file ends {len(raw)} bytes into the {HEADER_SIZE}-byte header"
        else:
            h = unpack_header(raw)
            end = offset + HEADER_SIZE + h.size
            if h.magic != MAGIC:
                problem = f"bad magic number 0x{h.magic:08x} (expected 0x{MAGIC:08x})"
            elif h.size > size:
                problem = f"payload size {h.size} in the header is larger than the whole file ({size} bytes)"
            elif end > size:
                problem = (f"truncated chunk: the header promises a {h.size}-byte payload, "
                           f"only {size - offset - HEADER_SIZE} bytes remain")
            elif h.compressor not in COMPRESSOR_NAMES:
                problem = f"unknown compressor {h.compressor} (known: 0 none, 1 snappy, 2 gzip)"
                skip_to = end  # the extent is plausible: skip exactly this chunk
            elif h.num_records == 0:
                # Writers never write empty chunks, and the count is outside the checksum:
                # indexed as empty, the chunk's records would vanish without an error.
                problem = (f"the header says 0 records but the chunk has a {h.size}-byte payload "
                           "(writers never write empty chunks; the record count is not covered by "
                           "the checksum)")
                skip_to = end
            else:
                rows.append((offset, h.size, h.num_records, h.compressor, h.checksum, ordinal))
                offset, ordinal = end, ordinal + 1
                continue
        err = corrupt(path, ordinal, offset, problem)
        if not skip_corrupt:
            raise err
        errors.append(err)
        offset = skip_to if skip_to is not None else _resync(f, path, offset + 1, size)
        ordinal += 1
    table = np.array(rows, dtype=CHUNK_DTYPE) if rows else np.zeros(0, CHUNK_DTYPE)
    return Index(path, size, st.st_mtime_ns, table, errors)


def sidecar_path(path: str, cache: Union[bool, str, "os.PathLike[str]"]) -> str:
    """Where the sidecar index of `path` is: <path>.rioidx for cache=True, else `cache`."""
    return path + SIDECAR_SUFFIX if isinstance(cache, bool) else os.fspath(cache)  # (never called with False)


def load_sidecar(path: str, side: str, st: os.stat_result) -> Optional[Index]:
    """The cached Index if the sidecar matches the data file's size and mtime, else None."""
    try:
        with open(side, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    if len(blob) < _SIDECAR_HEAD.size:
        return None
    magic, version, fsize, mtime, n, crc = _SIDECAR_HEAD.unpack_from(blob)
    body = blob[_SIDECAR_HEAD.size:]
    if magic != _SIDECAR_MAGIC or version != _SIDECAR_VERSION or fsize != st.st_size \
            or mtime != st.st_mtime_ns or len(body) != n * CHUNK_DTYPE.itemsize or zlib.crc32(body) != crc:
        return None
    table = np.frombuffer(body, CHUNK_DTYPE).copy()
    return Index(path, fsize, mtime, table)


def save_sidecar(index: Index, side: str) -> None:
    """Write `index` to the sidecar `side` (atomically; a failure is ignored: it is a cache)."""
    body = index.table.tobytes()
    head = _SIDECAR_HEAD.pack(_SIDECAR_MAGIC, _SIDECAR_VERSION, index.file_size, index.mtime_ns,
                              index.num_chunks, zlib.crc32(body))
    tmp = f"{side}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(head + body)
        os.replace(tmp, side)  # readers never see a half-written sidecar
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def build_index(f: IO[bytes], path: str, skip_corrupt: bool = False, allow_empty: bool = False,
                cache: Union[bool, str, "os.PathLike[str]"] = False) -> Index:
    """Index of an open file, from the sidecar cache when `cache` (True or a sidecar path) and valid."""
    side = sidecar_path(path, cache) if cache else None
    if side:
        try:
            st = os.fstat(f.fileno())
        except OSError as exc:
            raise io_failure(path, None, None, f"cannot stat: {exc.strerror or exc}") from exc
        if st.st_size or allow_empty:
            cached = load_sidecar(path, side, st)
            if cached is not None:
                return cached
    index = scan(f, path, skip_corrupt=skip_corrupt, allow_empty=allow_empty)
    if side and not index.corrupt_errors:
        save_sidecar(index, side)
    return index
