"""DLPack: other frameworks' tensors in the collectives, zero-copy.

- pybridge.base.dlpack.describe reads DLManagedTensor / DLManagedTensorVersioned as torch
  produces them, and refuses, naming the field, what the collectives cannot use;
- pb_tensor_from_dlpack(_versioned) through the C ABI, and from a C program compiled
  against torch's dlpack.h, then an allreduce in place on the producer's memory;
- Python collectives take any object with __dlpack__.
"""

import ctypes
import os
import subprocess

import numpy as np
import pytest
import torch
from torch.utils import dlpack as torch_dlpack

from capi_loader import LIB_PATH, ROOT, init_world, last_error, load, pybridge_flags
from ranks import free_port, run_ranks

import pybridge
from pybridge.base import buffers
from pybridge import abi
from pybridge.base import dlpack
from pybridge.errors import InvalidArgument

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_address(t, versioned=False):
    """(address of the DLManagedTensor[Versioned] torch exports for t, the capsule keeping it)."""
    if versioned:
        cap = t.__dlpack__(max_version=(1, 0))
        return _get_pointer(cap, b"dltensor_versioned"), cap
    cap = torch_dlpack.to_dlpack(t)
    return _get_pointer(cap, b"dltensor"), cap


@pytest.mark.parametrize("versioned", [False, True])
@pytest.mark.parametrize("dtype,code", [(torch.float32, abi.PB_FLOAT32), (torch.float64, abi.PB_FLOAT64),
                                        (torch.float16, abi.PB_FLOAT16), (torch.bfloat16, abi.PB_BFLOAT16),
                                        (torch.int8, abi.PB_INT8), (torch.uint8, abi.PB_UINT8),
                                        (torch.int32, abi.PB_INT32), (torch.int64, abi.PB_INT64)])
def test_describe_torch_tensors(dtype, code, versioned):
    t = torch.zeros(3, 4, dtype=dtype)
    address, cap = capsule_address(t, versioned)
    assert dlpack.describe(address, versioned) == (t.data_ptr(), 12, code, abi.PB_CPU)
    # A slice that starts inside the storage: data + byte_offset is where it begins.
    row = t[1]
    address, cap = capsule_address(row, versioned)
    assert dlpack.describe(address, versioned)[:2] == (row.data_ptr(), 4)
    del cap


@pytest.mark.parametrize("make,words", [
    (lambda: torch.zeros(3, 4).t(), "not contiguous"),
    (lambda: torch.zeros(4, 3)[:, 1], "not contiguous"),
    (lambda: torch.zeros(3, dtype=torch.bool), "kDLBool"),
    (lambda: torch.zeros(3, dtype=torch.complex64), "kDLComplex"),
    (lambda: torch.zeros(3, dtype=torch.int16), "kDLInt with 16 bits"),
])
def test_describe_refuses_by_name(make, words):
    address, cap = capsule_address(make())
    with pytest.raises(InvalidArgument, match=words):
        dlpack.describe(address)


def test_dimensions_of_size_one_may_have_any_stride():
    t = torch.zeros(4, 1, 3)
    address, cap = capsule_address(t.as_strided((4, 1, 3), (3, 99, 1)))
    assert dlpack.describe(address)[1] == 12


def _hand_made(device_type=1, device_id=0, code=2, bits=32, lanes=1, version=1, flags=0):
    """A DLManagedTensorVersioned built field by field (what a C producer would hand over)."""
    data = (ctypes.c_float * 6)()
    shape = (ctypes.c_int64 * 2)(2, 3)
    m = dlpack._ManagedVersioned()
    m.version.major, m.version.minor, m.flags = version, 0, flags
    t = m.dl_tensor
    t.data = ctypes.addressof(data)
    t.device.device_type, t.device.device_id = device_type, device_id
    t.ndim, t.shape, t.strides, t.byte_offset = 2, shape, None, 0
    t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, lanes
    return m, (data, shape)


def test_hand_made_versioned_tensor_and_its_refusals():
    m, keep = _hand_made()
    assert dlpack.describe(ctypes.addressof(m), True) == (ctypes.addressof(keep[0]), 6, abi.PB_FLOAT32, abi.PB_CPU)
    m, keep = _hand_made(device_type=3)  # pinned host memory
    assert dlpack.describe(ctypes.addressof(m), True)[3] == abi.PB_CPU
    m, keep = _hand_made(device_type=2, device_id=1)
    assert dlpack.describe(ctypes.addressof(m), True)[3] == 1
    for kwargs, words in [({"flags": 1}, "read-only"), ({"version": 2}, "version 2.0"),
                          ({"device_type": 10}, "kDLROCM"), ({"device_type": 13}, "kDLCUDAManaged"),
                          ({"lanes": 4}, "4 lanes"), ({"device_type": 2, "device_id": -1}, "negative device_id")]:
        m, keep = _hand_made(**kwargs)
        with pytest.raises(InvalidArgument, match=words):
            dlpack.describe(ctypes.addressof(m), True)
    with pytest.raises(InvalidArgument, match="NULL"):
        dlpack.describe(0)


# ---- through the C ABI ---------------------------------------------------------------------

pytestmark_capi = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


def abi_dlpack_all_reduce(rank, world):
    ffi, lib = load()
    g = init_world(ffi, lib, 20.0)
    results = {}
    for versioned in (False, True):
        t = torch.arange(6, dtype=torch.float64).reshape(2, 3) * (rank + 1)
        address, cap = capsule_address(t, versioned)
        desc = ffi.new("pb_tensor *")
        convert = lib.pb_tensor_from_dlpack_versioned if versioned else lib.pb_tensor_from_dlpack
        src = ffi.cast("struct DLManagedTensorVersioned *" if versioned else "struct DLManagedTensor *", address)
        assert convert(src, desc) == 0, last_error(ffi, lib)
        assert int(ffi.cast("uintptr_t", desc.data)) == t.data_ptr() and desc.count == 6
        assert desc.dtype == lib.PB_FLOAT64 and desc.device == lib.PB_CPU
        assert lib.pb_all_reduce(g, desc, lib.PB_SUM) == 0, last_error(ffi, lib)
        results[versioned] = t.flatten().tolist()  # the producer's tensor holds the sum: no copy
    bad = torch.zeros(3, 4).t()
    address, cap = capsule_address(bad)
    desc = ffi.new("pb_tensor *")
    rc = lib.pb_tensor_from_dlpack(ffi.cast("struct DLManagedTensor *", address), desc)
    message = last_error(ffi, lib)
    assert lib.pb_tensor_from_dlpack(ffi.NULL, desc) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_finalize(g) == 0
    return results, rc, message


@pytestmark_capi
def test_c_abi_converts_and_reduces_in_place_on_two_ranks():
    out = run_ranks(abi_dlpack_all_reduce, 2)
    want = [float(v * 3) for v in range(6)]
    for results, rc, message in out:
        assert results == {False: want, True: want}
        assert rc == abi.PB_ERR_INVALID_ARGUMENT and "not contiguous" in message


@pytestmark_capi
def test_from_a_c_program_with_torchs_dlpack_header(tmp_path):
    from torch.utils import cpp_extension
    exe = tmp_path / "dlpack"
    flags = pybridge_flags()
    aten = os.path.join(cpp_extension.include_paths()[0], "ATen")  # the wheel's dlpack.h
    subprocess.run(["gcc", "-Wall", "-Werror", "-I", aten, "-o", str(exe), os.path.join(ROOT, "tests/c/dlpack.c"),
                    *flags], check=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    run = subprocess.run([str(exe), str(free_port())], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "dlpack: 0 failed checks" in run.stdout
    assert run.stdout.count("\nok ") >= 8


# ---- Python: any object with __dlpack__ ----------------------------------------------------

class Foreign:
    """Another framework's array: only the DLPack protocol, over memory it owns."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kwargs):
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def python_dlpack(rank, world):
    pybridge.init(backend="gloo")
    try:
        owned = torch.full((4,), float(rank + 1))
        pybridge.all_reduce(Foreign(owned), pybridge.SUM)
        strided = Foreign(torch.zeros(4, 4).t())
        try:
            pybridge.all_reduce(strided)
            refused = None
        except InvalidArgument as exc:
            refused = str(exc)
        return owned.tolist(), refused
    finally:
        pybridge.finalize()


def test_python_collectives_take_dlpack_objects_in_place():
    for values, refused in run_ranks(python_dlpack, 2):
        assert values == [3.0] * 4
        assert refused is not None and "contiguous" in refused


def test_numpy_through_dlpack_shares_memory():
    a = np.arange(4, dtype=np.float32)
    t = buffers.as_tensor(Foreign(torch.from_numpy(a)))
    t += 1
    assert a.tolist() == [1, 2, 3, 4]


# ---- asynchronous calls on caller-owned memory (pb_*_tensor_async) -------------------------

def abi_tensor_async(rank, world):
    ffi, lib = load()
    g = init_world(ffi, lib, 20.0)

    def desc(t):
        d = ffi.new("pb_tensor *")
        d.data, d.count = ffi.cast("void *", t.data_ptr()), t.numel()
        d.dtype, d.device = {torch.float32: lib.PB_FLOAT32, torch.int64: lib.PB_INT64}[t.dtype], lib.PB_CPU
        return d

    def finish(rc, w):
        assert rc == 0, last_error(ffi, lib)
        assert lib.pb_work_wait(w[0], 10.0) == 0, last_error(ffi, lib)
        assert lib.pb_work_close(w[0]) == 0

    out = {}
    x = torch.full((5,), float(rank + 1))
    w = ffi.new("pb_work **")
    finish(lib.pb_all_reduce_tensor_async(g, desc(x), lib.PB_SUM, w), w)
    out["all_reduce"] = x.tolist()
    y = torch.arange(3) + 10 * rank
    finish(lib.pb_broadcast_tensor_async(g, desc(y), world - 1, w), w)
    out["broadcast"] = y.tolist()
    mine, gathered = torch.full((2,), float(rank)), torch.zeros(2 * world)  # kept alive until done
    finish(lib.pb_all_gather_tensor_async(g, desc(mine), desc(gathered), w), w)
    out["all_gather"] = gathered.tolist()
    ones, part = torch.ones(2 * world), torch.zeros(2)
    finish(lib.pb_reduce_scatter_tensor_async(g, desc(ones), desc(part), lib.PB_SUM, w), w)
    out["reduce_scatter"] = part.tolist()
    peer = (rank + 1) % world
    src = (rank - 1) % world
    sent, got = torch.full((3,), float(rank)), torch.zeros(3)
    ws, wr = ffi.new("pb_work **"), ffi.new("pb_work **")
    rcs = lib.pb_isend_tensor(g, desc(sent), peer, 4, ws)
    rcr = lib.pb_irecv_tensor(g, desc(got), src, 4, wr)
    finish(rcs, ws)
    finish(rcr, wr)
    out["p2p"] = got.tolist()
    out["bad"] = lib.pb_all_reduce_tensor_async(g, ffi.NULL, lib.PB_SUM, w), last_error(ffi, lib)
    assert lib.pb_finalize(g) == 0
    return out


@pytestmark_capi
def test_c_async_calls_on_caller_memory():
    for rank, out in enumerate(run_ranks(abi_tensor_async, 2)):
        assert out["all_reduce"] == [3.0] * 5
        assert out["broadcast"] == [10, 11, 12]
        assert out["all_gather"] == [0.0, 0.0, 1.0, 1.0]
        assert out["reduce_scatter"] == [2.0, 2.0]
        assert out["p2p"] == [float(1 - rank)] * 3
        assert out["bad"][0] == abi.PB_ERR_INVALID_ARGUMENT and "NULL" in out["bad"][1]


# ---- one libtorch in the process -------------------------------------------------------------

def test_a_second_libtorch_is_named():
    from pybridge.capi import libtorch
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    maps = "\n".join([
        f"7f00-7f01 r-xp 00000000 08:01 11 {torch_lib}/libtorch_cpu.so",
        f"7f01-7f02 r-xp 00000000 08:01 12 {torch_lib}/libc10.so",
        "7f02-7f03 r-xp 00000000 08:01 13 /opt/other-torch/lib/libc10.so",
        "7f03-7f04 r-xp 00000000 08:01 14 /usr/lib/x86_64-linux-gnu/libc.so.6",
        "7f04-7f05 rw-p 00000000 00:00 0",
    ])
    assert libtorch.foreign(maps, torch_lib) == [("libc10.so", "/opt/other-torch/lib/libc10.so")]
    assert libtorch.foreign(maps.replace("/opt/other-torch/lib", torch_lib), torch_lib) == []
    libtorch.check()  # this process: one libtorch, the imported torch's


def test_pybridge_capi_prints_the_torch_flags():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "pybridge.capi", "--torch-cflags", "--torch-libs"],
                         capture_output=True, text=True, check=True, timeout=120).stdout.split()
    incs = [f[2:] for f in out if f.startswith("-I")]
    assert any(os.path.exists(os.path.join(p, "ATen", "ATen.h")) for p in incs)
    assert any(f.startswith("-D_GLIBCXX_USE_CXX11_ABI=") for f in out)
    libdirs = [f[2:] for f in out if f.startswith("-L")]
    assert any(os.path.exists(os.path.join(p, "libtorch_cpu.so")) for p in libdirs)
    assert "-ltorch_cpu" in out and "-lc10" in out
