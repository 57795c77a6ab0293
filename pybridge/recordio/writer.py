"""RecordIO writer: buffers records into a chunk and writes it once it reaches the size limit."""

import os
import struct
import zlib
from types import TracebackType
from typing import IO, Any, Iterable, Optional, Union

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

from ..errors import Closed, InvalidArgument
from ..base.checks import integer
from .format import DEFAULT_MAX_CHUNK_BYTES, MAX_U32, compress, compressor_id, io_failure, pack_header

_U32 = struct.Struct("<I")
MAX_CHUNK_LIMIT = 1 << 31  # keeps payload + length prefixes far from the uint32 size field
_Path = Union[str, "os.PathLike[str]"]


class Writer:
    """Write records to a RecordIO file (a path, truncated, or a binary file object).

    A chunk is closed when the next record would take its raw record bytes past
    max_chunk_bytes (32 MiB by default), the rule the Go writer uses; empty chunks are
    never written. A record larger than max_chunk_bytes is rejected with InvalidArgument.
    compressor: "none", "snappy" (framing format) or "gzip", or 0/1/2; default snappy,
    the Go library's default.
    Leaving a `with` block by an exception closes the file without writing the open chunk:
    the file then holds the chunks written so far, and is valid.

    Example::

        >>> from pybridge import recordio
        >>> with recordio.Writer("train-00000.recordio", compressor="snappy") as w:
        ...     for i in range(100):
        ...         w.write(f"record {i}".encode())
        >>> w.records_written, w.chunks_written
        (100, 1)
    """

    def __init__(self, file: Union[_Path, IO[bytes]], compressor: Union[str, int] = "snappy",
                 max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES) -> None:
        self.compressor = compressor_id(compressor)
        self.max_chunk_bytes = integer("max_chunk_bytes", max_chunk_bytes, low=1, high=MAX_CHUNK_LIMIT,
                                       expected=f"in 1..{MAX_CHUNK_LIMIT}")
        self._f: IO[bytes]
        if isinstance(file, (str, os.PathLike)):
            self.path: str = os.fspath(file)
            try:
                self._f = open(self.path, "wb")
            except OSError as exc:
                raise io_failure(self.path, None, None, f"cannot create: {exc.strerror or exc}") from exc
            self._owns = True
        else:
            if not hasattr(file, "write"):
                raise InvalidArgument("file must be a path or a binary file object with write()")
            self.path = getattr(file, "name", "<stream>")
            self._f, self._owns = file, False
        self._payload = bytearray()  # the open chunk, already in payload layout
        self._raw = 0  # record bytes in the open chunk (what the limit counts)
        self._count = 0  # records in the open chunk
        self._offset = 0  # bytes written so far (next chunk's offset)
        self.records_written = 0
        self.chunks_written = 0
        self.closed = False

    def _check(self) -> None:
        if self.closed:
            raise Closed(f"{self.path}: writer is closed")

    def _too_big(self, n: int, index: Optional[int] = None) -> InvalidArgument:
        which = "record" if index is None else f"record {index}"
        return InvalidArgument(f"{self.path}: {which} of {n} bytes is larger than the chunk limit of "
                               f"{self.max_chunk_bytes} bytes (max_chunk_bytes)")

    def write(self, record: Buffer) -> None:
        """Append one record (any bytes-like object)."""
        self._check()
        try:
            mv = memoryview(record)
            if mv.ndim != 1 or mv.format != "B":
                mv = mv.cast("B")
        except TypeError as exc:
            raise InvalidArgument(f"{self.path}: a record must be a contiguous bytes-like object, "
                                  f"not {type(record).__name__}") from exc
        n = len(mv)
        if n > self.max_chunk_bytes:
            raise self._too_big(n)
        if self._count and self._raw + n > self.max_chunk_bytes:
            self.flush()
        self._payload += _U32.pack(n)
        self._payload += mv
        self._raw += n
        self._count += 1
        self.records_written += 1

    def write_batch(self, data: Union[Buffer, npt.NDArray[Any]], offsets: npt.ArrayLike) -> None:
        """Append records data[offsets[i]:offsets[i+1]], with no Python loop per record."""
        self._check()
        raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
        offs = np.asarray(offsets, np.int64)
        self._write_batch(raw, offs)

    def _write_batch(self, data: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]) -> None:
        if offsets.ndim != 1 or len(offsets) < 1:
            raise InvalidArgument("offsets must be a 1-d array of len(records) + 1")
        lengths = np.diff(offsets)
        if len(lengths) and (lengths.min() < 0 or offsets[0] < 0 or offsets[-1] > len(data)):
            raise InvalidArgument(f"offsets must be non-decreasing and within the {len(data)}-byte buffer")
        big = np.flatnonzero(lengths > self.max_chunk_bytes)
        if len(big):
            raise self._too_big(int(lengths[big[0]]), int(big[0]))
        i, n = 0, len(lengths)
        while i < n:
            room = self.max_chunk_bytes - self._raw
            # Records i..j-1 fit while their bytes stay within the room left in the chunk.
            j = int(np.searchsorted(offsets, offsets[i] + room, side="right")) - 1
            j = min(j, n)
            if j <= i:
                self.flush()
                continue
            self._append(data, offsets, lengths, i, j)
            i = j

    def _append(self, data: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
                i: int, j: int) -> None:
        k, lo, hi = j - i, int(offsets[i]), int(offsets[j])
        lens = lengths[i:j]
        out = np.empty(hi - lo + 4 * k, np.uint8)
        if (lens == lens[0]).all():
            rows = out.reshape(k, 4 + int(lens[0]))
            rows[:, :4] = np.array([lens[0]], "<u4").view(np.uint8)
            rows[:, 4:] = data[lo:hi].reshape(k, int(lens[0]))
        else:
            prefix_at = np.arange(k, dtype=np.int64) * 4 + (offsets[i:j] - lo)
            is_prefix = np.zeros(len(out), bool)
            is_prefix[prefix_at[:, None] + np.arange(4)] = True
            out[is_prefix] = lens.astype("<u4").view(np.uint8)
            out[~is_prefix] = data[lo:hi]
        self._payload += memoryview(out)
        self._raw += hi - lo
        self._count += k
        self.records_written += k

    def flush(self) -> None:
        """Close the open chunk (if it has records) and write it out."""
        self._check()
        if not self._count:
            return
        body = compress(self.compressor, self._payload)
        if len(body) > MAX_U32:
            raise io_failure(self.path, self.chunks_written, self._offset,
                             f"compressed chunk of {len(body)} bytes does not fit the 32-bit size field")
        header = pack_header(zlib.crc32(body), self.compressor, len(body), self._count)
        try:
            self._f.write(header)
            self._f.write(body)
        except OSError as exc:
            raise io_failure(self.path, self.chunks_written, self._offset,
                             f"write failed: {exc.strerror or exc}") from exc
        self._offset += len(header) + len(body)
        self.chunks_written += 1
        self._payload = bytearray()
        self._raw = self._count = 0

    def close(self) -> None:
        """Write the last chunk and close the file (a caller's file object is only flushed)."""
        if self.closed:
            return
        try:
            self.flush()
            if self._owns:
                self._f.close()
            else:
                self._f.flush()
        except OSError as exc:
            raise io_failure(self.path, None, None, f"close failed: {exc.strerror or exc}") from exc
        finally:
            self.closed = True
            if self._owns and not self._f.closed:
                self._f.close()

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if exc_type is None:
            self.close()
        else:  # keep the original error; still release the file
            self.closed = True
            if self._owns:
                self._f.close()

    def __repr__(self) -> str:
        return f"<recordio.Writer {self.path!r} records={self.records_written} chunks={self.chunks_written}>"


def write_file(path: _Path, records: Iterable[Buffer], compressor: Union[str, int] = "snappy",
               max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES) -> int:
    """Write an iterable of records to `path`; returns the number of records.

    Example::

        >>> from pybridge import recordio
        >>> recordio.write_file("tiny.recordio", [b"a", b"bc", b"def"], compressor="none")
        3
    """
    with Writer(path, compressor, max_chunk_bytes) as w:
        for r in records:
            w.write(r)
    return w.records_written
