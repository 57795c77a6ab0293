"""CRC-32 (IEEE): the fastest implementation installed, and combining partial checksums so
that large chunks can be verified in parallel.

zlib.crc32 releases the GIL but runs on one core; a 32 MiB chunk verified in pieces on
several threads needs crc(A + B) from crc(A), crc(B) and len(B), which zlib does not expose
to Python. The algebra: appending len(B) zero bytes multiplies the CRC register by
x^(8*len(B)) modulo the polynomial, and CRC is linear, so
crc(A + B) = crc(A) * x^(8*len(B)) mod P  xor  crc(B).
"""

import ctypes
import functools
import os
import zlib
from typing import Any, Callable, Optional

import numpy as np

_POLY = 0xEDB88320  # IEEE polynomial, bit-reversed (bit 31 is x^0), as zlib uses it


def _mulmod(a: int, b: int) -> int:
    """Product of two polynomials mod P, both in bit-reversed form."""
    p = 0
    for i in range(32):
        if a & (0x80000000 >> i):  # a has the term x^i
            p ^= b
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1  # b *= x
    return p


@functools.lru_cache(maxsize=64)
def _x_pow_8n(n: int) -> int:
    """x^(8n) mod P, by square and multiply (segment lengths repeat, hence the cache)."""
    result, base = 0x80000000, 0x80000000 >> 8  # x^0, x^8
    while n:
        if n & 1:
            result = _mulmod(base, result)
        base = _mulmod(base, base)
        n >>= 1
    return result


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A + B given crc1 = crc32(A), crc2 = crc32(B) and len2 = len(B)."""
    if len2 <= 0:
        return crc1
    return _mulmod(_x_pow_8n(len2), crc1) ^ crc2


# ---------------------------------------------------------------- fast CRC (optional)
#
# zlib's crc32 runs at ~4 GB/s per core, a fifth of a page-cache read: verifying would cost
# four times the read. Faster implementations of the same CRC-32 are used when installed,
# fastest first (measured on cache-hot data, AVX-512 + VPCLMULQDQ): isal (python-isal) and
# zlib-ng ~55 GB/s, libdeflate (a system library, via ctypes) ~14 GB/s, zlib ~4 GB/s. All
# release the GIL, so pieces can be verified on several threads. zlib is the last resort and
# always there. PYBRIDGE_RECORDIO_CRC=<name> starts the chain at that backend (e.g. "zlib").

_BACKENDS = ("isal", "zlib-ng", "libdeflate", "zlib")
_LIBDEFLATE_MIN = 4096  # below this the ctypes call costs more than it saves
_Crc = Callable[[Any, int], int]  # crc32(data, crc)
_impl: Optional[tuple[str, _Crc]] = None  # (name, crc32(data, crc) -> int), chosen on first use


def _isal() -> _Crc:
    from isal import isal_zlib
    fn: _Crc = isal_zlib.crc32
    return fn


def _zlib_ng() -> _Crc:
    from zlib_ng import zlib_ng
    fn: _Crc = zlib_ng.crc32
    return fn


def _libdeflate() -> _Crc:
    for name in ("libdeflate.so.0", "libdeflate.so", "libdeflate.dylib"):
        try:  # plain dlopen: ctypes.util.find_library would spawn processes
            fn = ctypes.CDLL(name).libdeflate_crc32
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_uint32
        fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]

        def crc32(data: Any, crc: int = 0) -> int:  # ctypes releases the GIL during the call
            if len(data) >= _LIBDEFLATE_MIN:
                arr = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
                if arr.flags.c_contiguous:
                    value: int = fn(crc, arr.ctypes.data, arr.nbytes)
                    return value
            return zlib.crc32(data, crc)
        return crc32
    raise ImportError("libdeflate is not installed")


_LOADERS: dict[str, Callable[[], _Crc]] = {"isal": _isal, "zlib-ng": _zlib_ng, "libdeflate": _libdeflate, "zlib": lambda: zlib.crc32}


def _works(fn: _Crc) -> bool:
    """The CRC-32 check value, computed in two steps (so the running-CRC argument is honoured),
    also from a numpy array (what the reader passes)."""
    try:
        return fn(np.frombuffer(b"56789", np.uint8), fn(b"1234", 0)) == 0xCBF43926
    except Exception:  # noqa: BLE001 - a broken optional backend is skipped, never fatal
        return False


def _choose() -> tuple[str, _Crc]:
    global _impl
    wanted = os.environ.get("PYBRIDGE_RECORDIO_CRC", "").strip().lower()
    chain = _BACKENDS[_BACKENDS.index(wanted):] if wanted in _BACKENDS else _BACKENDS
    for name in chain:
        try:
            fn = _LOADERS[name]()
        except (ImportError, OSError):
            continue
        if _works(fn):
            _impl = (name, fn)
            return _impl
    _impl = ("zlib", zlib.crc32)
    return _impl


def backend() -> str:
    """Name of the implementation crc32_update uses: 'isal', 'zlib-ng', 'libdeflate' or 'zlib'."""
    return (_impl or _choose())[0]


def crc32_update(crc: int, arr: Any) -> int:
    """zlib.crc32(arr, crc) for a C-contiguous buffer (numpy uint8 arrays included), computed
    by the fastest backend available."""
    return (_impl or _choose())[1](arr, crc)
