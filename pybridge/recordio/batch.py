"""A batch of records as one contiguous buffer plus offsets, and fixed-size record decoding."""

from typing import Any, Iterable, Iterator, Sequence, Union

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

from ..errors import CorruptData, InvalidArgument

# A fixed-size record's fields: (name, dtype, shape), e.g. ("image", "u1", (28, 28)).
Layout = Sequence[tuple[str, npt.DTypeLike, Union[int, Sequence[int]]]]
_Piece = tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]  # (data, lengths)


class Batch:
    """Record i is data[offsets[i]:offsets[i+1]].

    data: C-contiguous, read-only uint8 array; offsets: C-contiguous int64 array of
    len(batch) + 1, starting at 0. No per-record Python objects are created unless asked for
    (record(), tolist(), iteration), so the C ABI can hand both arrays out as they are, for as
    long as it keeps the Batch alive. data may view a chunk buffer shared with the reader's
    cache: copy it (np.array(batch.data)) to modify it, or to keep a small part for long.
    """

    __slots__ = ("data", "offsets")

    def __init__(self, data: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]) -> None:
        self.data = data
        self.offsets = offsets

    @classmethod
    def from_pieces(cls, pieces: Iterable[_Piece]) -> "Batch":
        """Join (data, lengths) pieces; a single piece is used without copying."""
        kept = [p for p in pieces if len(p[1])]
        if not kept:
            return cls(np.zeros(0, np.uint8), np.zeros(1, np.int64))
        if len(kept) == 1:
            data, lengths = kept[0]
        else:
            data = np.concatenate([p[0] for p in kept])
            lengths = np.concatenate([p[1] for p in kept])
        offsets = np.empty(len(lengths) + 1, np.int64)
        offsets[0] = 0
        np.cumsum(lengths, out=offsets[1:])
        # Read-only: data may view a reader's cached chunk, which later reads serve again.
        data.flags.writeable = False
        return cls(data, offsets)

    @classmethod
    def from_records(cls, records: Iterable[Buffer]) -> "Batch":
        """Build a batch from bytes-like records (convenience, not the hot path)."""
        views = [memoryview(r).cast("B") for r in records]
        lengths = np.array([len(v) for v in views], np.int64)
        data = np.frombuffer(b"".join(views), np.uint8)
        return cls.from_pieces([(data, lengths)]) if len(views) else cls.from_pieces([])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        """The records' bytes in all."""
        return int(self.offsets[-1] - self.offsets[0])

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Each record's length."""
        return np.diff(self.offsets)

    def record(self, i: int) -> memoryview:
        """Record i (negative counts from the end), as a read-only view of the batch's bytes."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record {i} is out of range for a batch of {n}")
        i %= n
        return memoryview(self.data)[int(self.offsets[i]):int(self.offsets[i + 1])]

    __getitem__ = record

    def tolist(self) -> list[bytes]:
        """Every record as bytes (a copy each)."""
        raw = self.data.tobytes()
        base = int(self.offsets[0])
        offs = (self.offsets - base).tolist()
        return [raw[offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.tolist())

    def decode(self, layout: Layout, as_torch: bool = False) -> dict[str, Any]:
        """decode_fixed() over this batch.

        Example::

            >>> from pybridge.recordio import Batch
            >>> b = Batch.from_records([bytes([1, 9, 9]), bytes([2, 8, 8])])
            >>> b.decode([("label", "u1", ()), ("pixels", "u1", (2,))])["label"]
            array([1, 2], dtype=uint8)
        """
        return decode_fixed(self.data, self.offsets, layout, as_torch)

    def __repr__(self) -> str:
        return f"<recordio.Batch records={len(self)} bytes={self.nbytes}>"


def _layout_fields(layout: Layout) -> tuple[list[tuple[str, np.dtype[Any], tuple[int, ...], int, int]], int]:
    fields: list[tuple[str, np.dtype[Any], tuple[int, ...], int, int]] = []
    size = 0
    for item in layout:
        try:
            name, dtype, shape = item
        except (TypeError, ValueError):
            raise InvalidArgument(f"layout entry {item!r} must be (name, dtype, shape)") from None
        dt = np.dtype(dtype)
        dims: Any = shape  # a number (any numpy scalar) or a sequence of them
        scalar = np.isscalar(dims)
        shape = (int(dims),) if scalar else tuple(int(s) for s in dims)
        if any(s < 0 for s in shape):
            raise InvalidArgument(f"layout field {name!r} has a negative dimension {shape}")
        nbytes = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        fields.append((name, dt, shape, size, nbytes))
        size += nbytes
    if not fields:
        raise InvalidArgument("layout has no fields")
    return fields, size


def decode_fixed(data: Union[Buffer, npt.NDArray[Any]], offsets: npt.ArrayLike, layout: Layout,
                 as_torch: bool = False) -> dict[str, Any]:
    """Decode fixed-size records into one array per field.

    layout: sequence of (name, dtype, shape), packed in record order, e.g. MNIST's
    [("label", "u1", ()), ("image", "u1", (28, 28))] for 1 label byte + 784 pixel bytes.
    Multi-byte dtypes follow their numpy spelling ("<f4" is little-endian float32).
    Returns {name: array of shape (n, *shape)}; torch tensors when as_torch is true.
    Every record must be exactly the layout's size: a wrong-sized record raises CorruptData.
    The arrays are fresh copies (writable, independent of the loader's buffers).
    """
    fields, size = _layout_fields(layout)
    buf = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    offs = np.asarray(offsets, np.int64)
    n = len(offs) - 1
    if n < 0:
        raise InvalidArgument("offsets must hold at least one entry")
    lengths = np.diff(offs)
    bad = np.flatnonzero(lengths != size)
    if len(bad):
        i = int(bad[0])
        raise CorruptData(f"record {i} is {int(lengths[i])} bytes, the layout needs {size}")
    start = int(offs[0]) if n else 0
    if n and (start < 0 or start + n * size > len(buf)):
        raise InvalidArgument(f"offsets reach byte {start + n * size}, the buffer holds {len(buf)}")
    rows = buf[start:start + n * size].reshape(n, size)
    out: dict[str, Any] = {}
    for name, dt, shape, off, nbytes in fields:
        col = np.array(rows[:, off:off + nbytes], order="C")  # always a copy: writable, unshared
        arr = col.view(dt).reshape((n,) + shape)
        if as_torch:
            import torch
            out[name] = torch.from_numpy(arr)
        else:
            out[name] = arr
    return out
