"""CRC-32 (IEEE) helpers: combining partial checksums so large chunks can be verified in parallel.

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

import numpy as np

_POLY = 0xEDB88320  # IEEE polynomial, bit-reversed (bit 31 is x^0), as zlib uses it


def _mulmod(a, b):
    """Product of two polynomials mod P, both in bit-reversed form."""
    p = 0
    for i in range(32):
        if a & (0x80000000 >> i):  # a has the term x^i
            p ^= b
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1  # b *= x
    return p


@functools.lru_cache(maxsize=64)
def _x_pow_8n(n):
    """x^(8n) mod P, by square and multiply (segment lengths repeat, hence the cache)."""
    result, base = 0x80000000, 0x80000000 >> 8  # x^0, x^8
    while n:
        if n & 1:
            result = _mulmod(base, result)
        base = _mulmod(base, base)
        n >>= 1
    return result


def crc32_combine(crc1, crc2, len2):
    """CRC-32 of A + B given crc1 = crc32(A), crc2 = crc32(B) and len2 = len(B)."""
    if len2 <= 0:
        return crc1
    return _mulmod(_x_pow_8n(len2), crc1) ^ crc2


# ---------------------------------------------------------------- fast CRC (optional)
#
# zlib's crc32 runs at ~4 GB/s per core, a fifth of a page-cache read. libdeflate, when the
# system has it, computes the same CRC-32 with carry-less multiply instructions at several
# times that speed. It is only ever optional: without it everything falls back to zlib.
# PYBRIDGE_RECORDIO_CRC=zlib forces the fallback.

_fast = None  # libdeflate_crc32, or False when unavailable
_FAST_MIN = 4096  # below this the ctypes call costs more than it saves


def _load_fast():
    global _fast
    if _fast is None:
        _fast = False
        if os.environ.get("PYBRIDGE_RECORDIO_CRC", "").strip().lower() != "zlib":
            for name in ("libdeflate.so.0", "libdeflate.so", "libdeflate.dylib"):
                try:  # plain dlopen: ctypes.util.find_library would spawn processes
                    fn = ctypes.CDLL(name).libdeflate_crc32
                except (OSError, AttributeError):
                    continue
                fn.restype = ctypes.c_uint32
                fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
                if fn(0, b"123456789", 9) == 0xCBF43926:  # the CRC-32 check value
                    _fast = fn
                    break
    return _fast


def backend():
    """'libdeflate' or 'zlib': which implementation crc32_update uses for large buffers."""
    return "libdeflate" if _load_fast() else "zlib"


def crc32_update(crc, arr):
    """zlib.crc32(arr, crc), faster for large C-contiguous numpy uint8 arrays when possible."""
    fast = _fast if _fast is not None else _load_fast()
    if fast and isinstance(arr, np.ndarray) and arr.nbytes >= _FAST_MIN and arr.flags.c_contiguous:
        return fast(crc, arr.ctypes.data, arr.nbytes)  # ctypes releases the GIL during the call
    return zlib.crc32(arr, crc)
