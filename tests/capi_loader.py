"""Load libpybridge.so through cffi's ABI mode, declared from capi/pybridge.h itself."""

import os
import sys

import cffi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB_PATH = os.environ.get("PYBRIDGE_LIB", os.path.join(ROOT, "build", "libpybridge.so"))
sys.path.insert(0, os.path.join(ROOT, "capi"))
import build as capi_build  # noqa: E402


_loaded = None


def load():
    """(ffi, lib), opened once per process."""
    global _loaded
    if _loaded is None:
        ffi = cffi.FFI()
        with open(os.path.join(ROOT, "capi", "pybridge.h")) as f:
            ffi.cdef(capi_build.public_cdef(f.read()))
        _loaded = ffi, ffi.dlopen(LIB_PATH)
    return _loaded
