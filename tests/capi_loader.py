"""Load libpybridge.so through cffi's ABI mode, declared from capi/pybridge.h itself, and the
helpers every cffi test shares: the last error, the world's init, a numpy array as a
pb_tensor, two ranks of a C program."""

import importlib.util
import os
import subprocess

import cffi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB_PATH = os.environ.get("PYBRIDGE_LIB", os.path.join(ROOT, "build", "libpybridge.so"))
# The header's parser on its own, not through the package: importing pybridge here would
# decide which core the library's embedded interpreter finds.
_spec = importlib.util.spec_from_file_location("_pb_capi_gen", os.path.join(ROOT, "pybridge", "cbuild", "gen.py"))
_capi_gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_capi_gen)


_loaded = None


def load():
    """(ffi, lib), opened once per process."""
    global _loaded
    if _loaded is None:
        ffi = cffi.FFI()
        with open(os.path.join(ROOT, "capi", "pybridge.h")) as f:
            ffi.cdef(_capi_gen.public_cdef(f.read()))
        _loaded = ffi, ffi.dlopen(LIB_PATH)
    return _loaded


def last_error(ffi, lib):
    """This thread's pb_last_error() as text."""
    return ffi.string(lib.pb_last_error()).decode()


def init_world(ffi, lib, timeout=30.0, *, device="cpu"):
    """The world group from the launcher's variables (pb_init: gloo, or nccl for device
    "cuda"), asserted to be made; its handle."""
    gp = ffi.new("pb_group **")
    backend = b"nccl" if device == "cuda" else b"gloo"
    assert lib.pb_init(ffi.NULL, backend, -1, -1, -1, timeout, gp) == 0, last_error(ffi, lib)
    return gp[0]


def np_tensor(ffi, lib, arr):
    """A pb_tensor describing numpy array `arr` in place (keep `arr` alive while it is used)."""
    import numpy as np
    codes = {np.float32: lib.PB_FLOAT32, np.float64: lib.PB_FLOAT64, np.int32: lib.PB_INT32,
             np.int64: lib.PB_INT64, np.int8: lib.PB_INT8, np.uint8: lib.PB_UINT8}
    t = ffi.new("pb_tensor *")
    t.data = ffi.cast("void *", arr.ctypes.data)
    t.count = arr.size
    t.dtype = codes[arr.dtype.type]
    t.device = lib.PB_CPU
    return t


def pybridge_flags(pc_dir=os.path.dirname(LIB_PATH)):
    """gcc's flags for a C program linking libpybridge: `pkg-config --cflags --libs pybridge`
    with the pybridge.pc in pc_dir (the library's folder; the tests that run build/'s pass it)."""
    out = subprocess.run(["pkg-config", "--cflags", "--libs", "pybridge"], check=True, text=True,
                         capture_output=True, env={**os.environ, "PKG_CONFIG_PATH": pc_dir})
    return out.stdout.split()


def run_two_ranks(exe, *args, timeout=90, env=None):
    """Run the C program `exe` as ranks 0 and 1 (`exe RANK PORT ARGS...`, a fresh port), with
    a bare environment (no PYBRIDGE_* or launcher variables) plus `env`; [(exit status,
    output)] by rank."""
    return run_c_ranks(exe, 2, *args, timeout=timeout, env=env)


def run_c_ranks(exe, world, *args, timeout=90, env=None):
    """run_two_ranks for `world` ranks: `exe RANK PORT ARGS...` for each."""
    from ranks import free_port
    port = str(free_port())
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **(env or {})}
    procs = [subprocess.Popen([str(exe), str(r), port, *map(str, args)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for r in range(world)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out) for p, out in zip(procs, outs)]
