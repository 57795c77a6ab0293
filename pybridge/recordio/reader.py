"""RecordIO reader: random access to any record range, reading only the chunks it needs.

A chunk is the unit of I/O, checksum and compression, so reading one record reads its whole
chunk; decoded chunks are kept in a small LRU cache so that consecutive ranges (batches) in
one chunk decode it once.

Speed (see bench/recordio.py): by default the file is memory-mapped, so a chunk is checksummed
and decompressed straight from the page cache, and the only copy an uncompressed record sees is
the one into its batch (which then owns its memory). That copy lands in a batch-sized buffer
that stays in cache; reading whole chunks into memory first cannot (a 32 MiB chunk does not fit).
The CRC of a large chunk runs on several threads (it releases the GIL).

Without the map (mmap=False, PYBRIDGE_RECORDIO_MMAP=0, or a file that cannot be mapped),
payloads are pread in cache-sized pieces and checksummed while the piece is still in cache.
Uncompressed chunks of equal-sized large records are then read with preadv straight into one
contiguous record buffer (the length prefixes go to a side array), so batches are views of it;
such a buffer is reused only once no batch views it. Buffers are placed at the file data's
offset within a page, which keeps the kernel's copy at full speed (see _BufferPool).

A mapped file that shrinks while it is read would raise SIGBUS on access past its new end, so
each chunk's extent is checked against the file's current size just before it is touched: a
file truncated since it was indexed gives CorruptData, like the read path. (A truncation racing
with that one chunk's read is not caught; use mmap=False for files that other processes rewrite.)

Not thread-safe: use one Reader per thread (the Loader does).
"""

import mmap as _mmap
import os
import stat
import sys
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from types import TracebackType
from typing import IO, Any, Callable, Iterable, Iterator, NamedTuple, Optional, Sequence, TypeVar, Union

import numpy as np
import numpy.typing as npt

from ..errors import Closed, CorruptData, InvalidArgument
from ..base.checks import integer
from .batch import Batch
from .checksum import crc32_combine, crc32_update
from .format import (HEADER_SIZE, NONE, FormatError, corrupt, decoded_limit, decompress, gather_into, io_failure,
                     parse_records)
from .format import Records
from .index import ChunkInfo, build_index

_PAGE = 4096
_PIECE = 512 << 10  # read unit: a piece is checksummed while still hot in L2 (1 MiB per core here)
_PARALLEL_MIN = 8 << 20  # chunks at least this big are read by several threads
_SCATTER_MIN = 8 << 10  # equal-sized records at least this big are read straight into place
_GROUP_BYTES = 512 << 10  # scatter reads: records per preadv call, by bytes (see _PIECE)
_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()
_Bytes = npt.NDArray[np.uint8]
_Range = tuple[int, int]
_T = TypeVar("_T")


def _io_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, _workers() - 1), thread_name_prefix="pybridge-recordio")
        return _pool


def _workers() -> int:
    """Threads per large read, the caller included: PYBRIDGE_RECORDIO_THREADS, else min(4, CPUs)."""
    raw = os.environ.get("PYBRIDGE_RECORDIO_THREADS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return max(1, min(4, os.cpu_count() or 1))


def _run_split(work: Callable[[_Range], _T], ranges: Sequence[_Range]) -> list[_T]:
    """[work(r) for r in ranges], the first on the calling thread and the rest on the I/O pool:
    the caller would only wait otherwise, and one thread fewer competes for the cores."""
    futures = [_io_pool().submit(work, r) for r in ranges[1:]]
    try:
        first = work(ranges[0])
    finally:
        wait(futures)  # never return (and recycle the buffer) while a piece is still being read
    return [first] + [f.result() for f in futures]


def _split(n: int, parts: int) -> list[_Range]:
    """`parts` contiguous (lo, hi) ranges covering range(n)."""
    step = -(-n // parts)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _read_exact(fd: int, view: memoryview, offset: int) -> int:
    """pread into `view` until full; returns the bytes read (fewer only at end of file)."""
    done, n = 0, len(view)
    while done < n:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done


def _read_piecewise(fd: int, arr: _Bytes, offset: int, verify: bool) -> tuple[int, int]:
    """Fill uint8 array `arr` from the file in cache-sized pieces, checksumming each while hot."""
    mv, n, done, crc = memoryview(arr), len(arr), 0, 0
    while done < n:
        want = min(_PIECE, n - done)
        got = _read_exact(fd, mv[done:done + want], offset + done)
        if verify:
            crc = crc32_update(crc, arr[done:done + got])
        done += got
        if got < want:
            break
    return done, crc


def _read_verified(fd: int, arr: _Bytes, offset: int, verify: bool) -> tuple[int, int]:
    """(bytes read, CRC-32 of them or 0): large reads are split over the I/O threads."""
    n = len(arr)
    if n < _PARALLEL_MIN:
        return _read_piecewise(fd, arr, offset, verify)
    ranges = _split(n, _workers())
    results = _run_split(lambda r: _read_piecewise(fd, arr[r[0]:r[1]], offset + r[0], verify), ranges)
    got = 0
    for (lo, hi), (g, _) in zip(ranges, results):
        if g < hi - lo:  # a short piece: the file ends early
            return got + g, 0
        got += g
    return got, _combine(ranges, [c for _, c in results])


def _combine(ranges: Sequence[_Range], crcs: Sequence[int]) -> int:
    """CRC-32 of consecutive byte ranges joined, from the CRC of each."""
    crc = 0
    for (lo, hi), c in zip(ranges, crcs):
        crc = crc32_combine(crc, c, hi - lo) if lo else c
    return crc


def _checksum(arr: _Bytes) -> int:
    """CRC-32 of a uint8 array in memory; a large one is split over the I/O threads."""
    if len(arr) < _PARALLEL_MIN:
        return crc32_update(0, arr)
    ranges = _split(len(arr), _workers())
    return _combine(ranges, _run_split(lambda r: crc32_update(0, arr[r[0]:r[1]]), ranges))


def _mmap_default() -> bool:
    """Map files unless PYBRIDGE_RECORDIO_MMAP is 0/false/no/off."""
    return os.environ.get("PYBRIDGE_RECORDIO_MMAP", "").strip().lower() not in ("0", "false", "no", "off")


def _read_uniform(fd: int, out: _Bytes, prefixes: npt.NDArray[Any], offset: int, length: int, lo: int, hi: int,
                  verify: bool) -> tuple[bool, int]:
    """Read records lo..hi-1 of a chunk whose records are all `length` bytes: the data lands
    contiguous in `out` and the length prefixes in `prefixes`, so no copy is needed to strip
    them. The CRC is chained over prefix, record, prefix, ... in file order."""
    stride = 4 + length
    group = max(1, min(512, _GROUP_BYTES // stride))  # preadv takes at most 1024 buffers
    pre, rec = memoryview(prefixes).cast("B"), memoryview(out)
    crc, pos = 0, offset + lo * stride
    for g in range(lo, hi, group):
        ge = min(hi, g + group)
        iov: list[memoryview] = []
        for i in range(g, ge):
            iov.append(pre[4 * i:4 * i + 4])
            iov.append(rec[i * length:(i + 1) * length])
        want = (ge - g) * stride
        got = os.preadv(fd, iov, pos)
        if got != want:
            return False, 0  # short read: let the general path report it
        if verify:
            for i in range(g, ge):  # memoryview slices: a third of the cost of numpy ones
                crc = crc32_update(crc32_update(crc, pre[4 * i:4 * i + 4]), rec[i * length:(i + 1) * length])
        pos += want
    return True, crc


# A pooled buffer is reusable when nothing but the pool refers to it: each live batch view of
# it holds a reference. Measured once, so that the test does not depend on the interpreter.
def _refs(obj: object) -> int:
    return sys.getrefcount(obj)


_probe = [np.empty(1, np.uint8)]
_UNSHARED = _refs(_probe[0])
del _probe


class _BufferPool:
    """Chunk-sized uint8 buffers shared by all readers of the process.

    A fresh 32 MiB buffer costs page faults on first touch that take about as long as reading
    the chunk, so buffers are kept and reused (best fit), a few at most.

    take() places the data at a chosen offset within a page: the kernel copies a file's pages
    into user memory with `rep movsb`, which on AMD Zen runs 2-6x slower when the destination
    is 1-31 bytes ahead of the source modulo 4096 (4K aliasing, measured: 3 GB/s instead of
    18). A destination at the source's page offset is never in that window.
    """

    def __init__(self, keep: int = 4) -> None:
        self._lock = threading.Lock()
        self._bufs: list[_Bytes] = []
        self._keep = keep

    def take(self, size: int, file_offset: int = 0) -> tuple[_Bytes, _Bytes]:
        """(owner, view): a pooled array, and a `size`-byte view of it whose address equals
        `file_offset` modulo 4096. Give back the owner; each live view keeps it from reuse."""
        def fit(buf: _Bytes) -> Optional[int]:
            skip: int = (file_offset - buf.ctypes.data) % _PAGE
            return skip if skip + size <= len(buf) else None
        with self._lock:
            best: Optional[int] = None
            for i in range(len(self._bufs)):
                if fit(self._bufs[i]) is not None and _refs(self._bufs[i]) <= _UNSHARED \
                        and (best is None or len(self._bufs[i]) < len(self._bufs[best])):
                    best = i
            buf = self._bufs.pop(best) if best is not None else None
        if buf is None:
            n = size + _PAGE
            if n > _PIECE:  # round up so that chunks of similar sizes share buffers
                n = -(-n // _PIECE) * _PIECE
            buf = np.empty(n, np.uint8)
        skip = fit(buf) or 0  # (it fits: found so, or made to)
        return buf, buf[skip:skip + size]

    def give(self, buf: Optional[_Bytes]) -> None:
        if buf is None:
            return
        with self._lock:
            self._bufs.append(buf)
            del self._bufs[:-self._keep]


_buffers = _BufferPool()  # chunk payloads (read path) and decompressed chunks
# Batch data. Pooled rather than allocated per batch: glibc serves a large allocation with a
# fresh mmap (until its threshold adapts), and faulting in a fresh 1.6 MiB costs more than the
# copy itself. A reused buffer is also still in cache.
_batch_buffers = _BufferPool(keep=8)
_POOLED_BATCH_MIN = 256 << 10


class _Decoded:
    """A decoded chunk: either payload + Records (prefixes interleaved), or `flat` records of
    one `length` laid out back to back (scatter-read), which batches can view without a copy."""

    __slots__ = ("payload", "records", "buffer", "length")

    def __init__(self, payload: _Bytes, records: Optional[Records], buffer: Optional[_Bytes],
                 length: Optional[int] = None) -> None:
        self.payload, self.records, self.buffer, self.length = payload, records, buffer, length

    def lengths(self, a: int, b: int) -> npt.NDArray[np.int64]:
        if self.length is None:
            assert self.records is not None  # (one of the two layouts)
            return self.records.lengths[a:b]
        return np.full(b - a, self.length, np.int64)

    def view(self, a: int, b: int) -> Optional[_Bytes]:
        """Records [a, b) without a copy when they lie back to back, else None."""
        if self.length is None:
            return None
        return self.payload[a * self.length:b * self.length]

    def address(self, a: int) -> int:
        """Memory address of record a (to place its copy at the same page offset)."""
        start = a * self.length if self.length is not None else int(self._records.starts[a])
        address: int = self.payload.ctypes.data + start
        return address

    @property
    def _records(self) -> Records:
        assert self.records is not None  # a payload with its Records (length is None)
        return self.records

    def copy_into(self, out: _Bytes, a: int, b: int) -> None:
        if self.length is None:
            gather_into(out, self.payload, self._records, a, b)
        else:
            np.copyto(out, self.payload[a * self.length:b * self.length])


class Span(NamedTuple):
    """Records [a, b) of a decoded chunk: what Reader.spans() returns, join() assembles."""
    chunk: _Decoded
    a: int
    b: int


def join(spans: Iterable[Span]) -> Batch:
    """One Batch of the records of `spans`, in order: viewed in place when a single span's
    records lie back to back, else copied once into one buffer."""
    spans = [s for s in spans if s.b > s.a]
    if not spans:
        return Batch.from_pieces([])
    lengths = [s.chunk.lengths(s.a, s.b) for s in spans]
    if len(spans) == 1:
        data = spans[0].chunk.view(spans[0].a, spans[0].b)
        if data is not None:
            return Batch.from_pieces([(data, lengths[0])])
    sizes = [int(n.sum()) for n in lengths]
    total = sum(sizes)
    if total >= _POOLED_BATCH_MIN:
        owner, data = _batch_buffers.take(total, spans[0].chunk.address(spans[0].a))
        _batch_buffers.give(owner)  # the batch's view keeps it from reuse until dropped
    else:
        data = np.empty(total, np.uint8)
    pos = 0
    for s, size in zip(spans, sizes):
        s.chunk.copy_into(data[pos:pos + size], s.a, s.b)
        pos += size
    return Batch.from_pieces([(data, lengths[0] if len(lengths) == 1 else np.concatenate(lengths))])


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str) -> IO[bytes]:
    """Open a regular file for reading (unbuffered). Anything else is refused, naming what it
    is: opening a FIFO would block until a writer comes, and a device never ends. O_NONBLOCK
    makes the open itself return at once; it changes nothing for a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise io_failure(path, None, None, f"cannot open: {exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "a special file")
            raise io_failure(path, None, None, f"cannot read: not a regular file but {kind}")
        return open(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


class Reader:
    """Read a RecordIO file.

    skip_corrupt: skip corrupt chunks instead of raising, and count them (corrupt_chunks,
        skipped_records); a range that covers a skipped chunk then returns fewer records.
        Without it, every corruption raises CorruptData naming the file, the chunk and its
        byte offset; a wrong record is never returned.
    verify_checksums: check each chunk's CRC-32 before decoding it (default on).
    index_cache: False, True (sidecar `<path>.rioidx`) or a sidecar path.
    allow_empty: accept an empty (zero-byte) file as zero records instead of raising.
    cache_chunks: decoded chunks kept for reuse by later reads.
    mmap: read through a memory map of the file (default: on unless PYBRIDGE_RECORDIO_MMAP=0;
        files that cannot be mapped are read with pread). See the module docstring.
    max_decoded_bytes: the most one compressed chunk may decompress to (default
        PYBRIDGE_RECORDIO_MAX_DECODED, else 256 MiB); a chunk that would decode to more is
        CorruptData (skipped under skip_corrupt), refused before that memory is allocated.

    Example::

        >>> from pybridge import recordio
        >>> n = recordio.write_file("data.recordio", [b"%d" % i for i in range(10)])
        >>> with recordio.Reader("data.recordio") as r:
        ...     batch = r.read(3, 4)               # records 3..6: one buffer and its offsets
        ...     print(r.num_records, batch.tolist())
        10 [b'3', b'4', b'5', b'6']
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], *, skip_corrupt: bool = False,
                 verify_checksums: bool = True, index_cache: Union[bool, str, "os.PathLike[str]"] = False,
                 allow_empty: bool = False, cache_chunks: int = 2, mmap: Optional[bool] = None,
                 max_decoded_bytes: Optional[int] = None) -> None:
        self.path = os.fspath(path)
        self.max_decoded_bytes = decoded_limit(max_decoded_bytes)
        self.use_mmap = _mmap_default() if mmap is None else bool(mmap)
        self.skip_corrupt = bool(skip_corrupt)
        self.verify_checksums = bool(verify_checksums)
        if int(cache_chunks) < 1:
            raise InvalidArgument(f"cache_chunks must be at least 1, got {cache_chunks!r}")
        self._cache_max = int(cache_chunks)
        self._f: Optional[IO[bytes]] = None
        self._map: Optional[_mmap.mmap] = None
        self._mapped: Optional[_Bytes] = None
        f = self._open()
        try:
            self.index = build_index(f, self.path, self.skip_corrupt, allow_empty, index_cache)
        except BaseException:
            f.close()
            raise
        self.corrupt_errors = list(self.index.corrupt_errors)  # every chunk skipped so far
        self._bad: set[int] = set()  # index positions found corrupt on read
        self._last: Optional[int] = None  # index position decoded last (to spot sequential reading)
        # (index position, future of its CRC-32) being checksummed in advance
        self._ahead: Optional[tuple[int, Future[int]]] = None
        self.skipped_records = 0
        self._cache: OrderedDict[int, _Decoded] = OrderedDict()  # index position -> _Decoded
        self.closed = False

    # ------------------------------------------------------------ file handle

    def _open(self) -> IO[bytes]:
        f = self._f = open_regular(self.path)
        if self.use_mmap:
            try:
                size = os.fstat(f.fileno()).st_size
                if size:  # an empty file cannot be mapped (and holds nothing to read)
                    self._map = _mmap.mmap(f.fileno(), size, prot=_mmap.PROT_READ)
                    self._mapped = np.frombuffer(self._map, np.uint8)
            except (OSError, ValueError):
                self._map = self._mapped = None  # e.g. a filesystem without mmap: pread instead
        return f

    def _file(self) -> IO[bytes]:
        """The open file (reopened after release())."""
        return self._f if self._f is not None else self._open()

    def release(self) -> None:
        """Close the file descriptor and drop cached chunks; the next read reopens (for many shards)."""
        self._take_ahead(None)
        while self._cache:
            _buffers.give(self._cache.popitem()[1].buffer)
        self._mapped = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a view of it is still alive (e.g. in a traceback): unmapped when that goes
            self._map = None
        if self._f is not None:
            self._f.close()
            self._f = None

    def close(self) -> None:
        """Release the file and its cached chunks for good."""
        self.release()
        self.closed = True

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, kind: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    # ------------------------------------------------------------ metadata

    @property
    def num_records(self) -> int:
        """The records of the file's good chunks."""
        # No __len__ on purpose: list(reader) would preallocate from the headers' record counts,
        # which a corrupt header can make absurd.
        return self.index.num_records

    @property
    def num_chunks(self) -> int:
        """The file's good chunks."""
        return self.index.num_chunks

    @property
    def chunks(self) -> list[ChunkInfo]:
        """Each good chunk's ChunkInfo."""
        return self.index.chunks()

    @property
    def corrupt_chunks(self) -> int:
        """Chunks skipped so far as corrupt (skip_corrupt)."""
        return len(self.corrupt_errors)

    # ------------------------------------------------------------ chunk decoding

    def _evict(self) -> None:
        while len(self._cache) >= self._cache_max:
            _, old = self._cache.popitem(last=False)
            _buffers.give(old.buffer)

    def _fail(self, info: ChunkInfo, msg: str) -> CorruptData:
        return corrupt(self.path, info.ordinal, info.offset, msg)

    def _read(self, info: ChunkInfo, arr: _Bytes) -> int:
        """Read the chunk's payload into `arr`; returns its CRC (0 when not verifying)."""
        try:
            got, crc = _read_verified(self._file().fileno(), arr, info.offset + HEADER_SIZE, self.verify_checksums)
        except OSError as exc:
            raise io_failure(self.path, info.ordinal, info.offset, f"read failed: {exc.strerror or exc}") from exc
        if got != info.size:
            raise self._fail(info, f"truncated chunk: read {got} of {info.size} payload bytes "
                                   "(did the file change since it was indexed?)")
        return crc

    def _check_crc(self, info: ChunkInfo, crc: int) -> None:
        if self.verify_checksums and crc != info.checksum:
            raise self._fail(info, f"checksum mismatch: the header says 0x{info.checksum:08x}, "
                                   f"the payload has 0x{crc:08x}")

    def _try_uniform(self, info: ChunkInfo) -> Optional[_Decoded]:
        """Scatter-read an uncompressed chunk of equal, large records; None if it is not one."""
        n, size, fd = info.num_records, info.size, self._file().fileno()
        start = info.offset + HEADER_SIZE
        if n < 1 or size < 4 or size % n:
            return None
        length = size // n - 4
        if length < _SCATTER_MIN or os.pread(fd, 4, start) != int(length).to_bytes(4, "little"):
            return None
        # Record 0 lands at its source's page offset; later ones drift 4 bytes back per record,
        # out of the slow window for the first 1016 records (see _BufferPool).
        buf, out = _buffers.take(n * length, start + 4)
        prefixes = np.empty(n, "<u4")
        ranges = _split(n, _workers()) if size >= _PARALLEL_MIN else [(0, n)]
        def work(r: _Range) -> tuple[bool, int]:
            return _read_uniform(fd, out, prefixes, start, length, r[0], r[1], self.verify_checksums)
        try:
            results = _run_split(work, ranges)
        except OSError as exc:
            raise io_failure(self.path, info.ordinal, info.offset, f"read failed: {exc.strerror or exc}") from exc
        if not all(ok for ok, _ in results) or (prefixes != length).any():
            _buffers.give(buf)
            return None  # not what it looked like: the general path decodes (or reports) it
        stride = 4 + length
        self._check_crc(info, _combine([(lo * stride, hi * stride) for lo, hi in ranges],
                                       [c for _, c in results]))
        return _Decoded(out, None, buf, length)

    def _decode(self, pos: int) -> _Decoded:
        info = self.index.chunk(pos)
        if self._f is None:
            self._open()
        if self._mapped is None and info.compressor == NONE:
            dec = self._try_uniform(info)
            if dec is not None:
                return dec
        raw: Optional[_Bytes]
        scratch, raw = self._raw(pos, info)
        if info.compressor == NONE:
            payload, buf = raw, scratch
        else:
            try:
                payload, buf = self._decompressed(info, raw)
            finally:
                raw = None  # drop the view so the pool can hand the scratch out again
                _buffers.give(scratch)
        try:
            records = parse_records(payload, info.num_records)
        except FormatError as exc:
            raise self._fail(info, str(exc)) from None
        return _Decoded(payload, records, buf)

    def _raw(self, pos: int, info: ChunkInfo) -> tuple[Optional[_Bytes], _Bytes]:
        """(pooled buffer or None, the chunk's payload bytes as stored, checksum verified)."""
        if self._mapped is None:
            buf, raw = _buffers.take(info.size, info.offset + HEADER_SIZE)
            self._check_crc(info, self._read(info, raw))
            return buf, raw
        mapped = self._mapped_payload(info)
        if mapped is None:
            have = os.fstat(self._file().fileno()).st_size - info.offset - HEADER_SIZE
            raise self._fail(info, f"truncated chunk: {max(0, have)} of {info.size} payload bytes are in "
                                   "the file (did the file change since it was indexed?)")
        if self.verify_checksums:
            crc = self._take_ahead(pos)
            self._check_crc(info, _checksum(mapped) if crc is None else crc)
        return None, mapped

    def _mapped_payload(self, info: ChunkInfo) -> Optional[_Bytes]:
        """View of a chunk's payload in the map, or None when the file no longer holds all of it:
        pages past the end of a file that shrank would raise SIGBUS, so check before touching."""
        start, end = info.offset + HEADER_SIZE, info.offset + HEADER_SIZE + info.size
        if self._mapped is None or end > min(len(self._mapped), os.fstat(self._file().fileno()).st_size):
            return None
        return self._mapped[start:end]

    def _checksum_ahead(self, pos: int) -> None:
        """While records are copied out of chunk pos, checksum chunk pos+1 on the I/O pool when
        reading looks sequential: the two memory-bound passes then run on two cores."""
        sequential = pos == 0 or (self._last is not None and pos == self._last + 1)
        self._last = pos
        nxt = pos + 1
        if not (sequential and self.verify_checksums and self._mapped is not None and self._ahead is None) \
                or nxt >= self.num_chunks or nxt in self._cache or nxt in self._bad:
            return
        raw = self._mapped_payload(self.index.chunk(nxt))
        if raw is not None:  # (a truncated chunk is reported when it is read)
            self._ahead = (nxt, _io_pool().submit(crc32_update, 0, raw))

    def _take_ahead(self, pos: Optional[int]) -> Optional[int]:
        """The CRC-32 computed in advance for chunk pos, else None; waits for any pending one, so
        that nothing reads the map once this returns."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        crc = ahead[1].result()
        return crc if ahead[0] == pos else None

    def _decompressed(self, info: ChunkInfo, raw: _Bytes) -> tuple[_Bytes, Optional[_Bytes]]:
        """(payload, pooled buffer holding it or None) of a compressed chunk's verified bytes."""
        taken: list[_Bytes] = []

        def alloc(n: int) -> _Bytes:
            owner, view = _buffers.take(n)
            taken.append(owner)
            return view
        try:
            payload = decompress(info.compressor, raw, alloc, self.max_decoded_bytes)
        except FormatError as exc:
            raise self._fail(info, str(exc)) from None
        return payload, (taken[0] if taken else None)

    def _chunk(self, pos: int) -> Optional[_Decoded]:
        """Decoded chunk at index position `pos`, or None when it is corrupt and skipped."""
        hit = self._cache.get(pos)
        if hit is not None:
            self._cache.move_to_end(pos)
            return hit
        if pos in self._bad:
            return None
        self._evict()
        try:
            dec = self._decode(pos)
            self._checksum_ahead(pos)
        except CorruptData as exc:
            if not self.skip_corrupt:
                raise
            self._bad.add(pos)
            self.corrupt_errors.append(exc)
            self.skipped_records += int(self.index.table["records"][pos])
            return None
        self._cache[pos] = dec
        return dec

    # ------------------------------------------------------------ reading records

    def _check_range(self, start: int, count: int) -> None:
        if self.closed:
            raise Closed(f"{self.path}: reader is closed")
        for name, v in (("start", start), ("count", count)):
            integer(name, v, low=0)
        if start + count > self.num_records:
            raise InvalidArgument(f"{self.path}: records [{start}, {start + count}) are out of range; "
                                  f"the file holds {self.num_records}")

    def spans(self, start: int, count: int) -> list[Span]:
        """Spans of records [start, start + count), one per chunk touched (see join())."""
        self._check_range(start, count)
        start, left = int(start), int(count)
        first = self.index.first
        out: list[Span] = []
        pos = self.index.locate(start) if left else 0
        while left > 0:
            a = start - int(first[pos])
            b = min(int(first[pos + 1] - first[pos]), a + left)
            dec = self._chunk(pos)
            if dec is not None:
                out.append(Span(dec, a, b))
            start += b - a
            left -= b - a
            pos += 1
        return out

    def read(self, start: int, count: int) -> Batch:
        """Records [start, start + count) as one Batch (contiguous data + offsets)."""
        return join(self.spans(start, count))

    def batches(self, batch_size: int, start: int = 0, count: Optional[int] = None) -> Iterator[Batch]:
        """Sequential scan in batches of `batch_size` records (the last may be shorter)."""
        integer("batch_size", batch_size, low=1)
        end = self.num_records if count is None else start + count
        self._check_range(start, end - start)
        for s in range(start, end, batch_size):
            yield self.read(s, min(batch_size, end - s))

    def __iter__(self) -> Iterator[bytes]:
        """Every record as bytes (convenience; use batches() on hot paths)."""
        for batch in self.batches(4096):
            yield from batch.tolist()

    def __getitem__(self, i: int) -> bytes:
        n = self.num_records
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= i < n:
            raise IndexError(f"record {i!r} is out of range for {n} records")
        batch = self.read(int(i) % n, 1)
        if not len(batch):
            raise IndexError(f"record {i} lies in a corrupt chunk that was skipped")
        return batch.tolist()[0]

    def verify(self) -> list[CorruptData]:
        """Read and check every chunk; returns the CorruptData found (scan-time ones included)."""
        problems = list(self.index.corrupt_errors)
        for pos in range(self.num_chunks):
            self._cache.pop(pos, None)
            try:
                dec = self._decode(pos)
            except CorruptData as exc:
                problems.append(exc)
                continue
            _buffers.give(dec.buffer)
        return problems

    def __repr__(self) -> str:
        return f"<recordio.Reader {self.path!r} chunks={self.num_chunks} records={self.num_records}>"


def read_file(path: Union[str, "os.PathLike[str]"], **kw: Any) -> list[bytes]:
    """All records of a file as a list of bytes (convenience); `kw` are Reader's keywords.

    Example::

        >>> from pybridge import recordio
        >>> n = recordio.write_file("small.recordio", [b"a", b"bc"])
        >>> recordio.read_file("small.recordio")
        [b'a', b'bc']
    """
    with Reader(path, **kw) as r:
        return list(r)
