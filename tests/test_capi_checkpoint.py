"""Checkpoints through the C ABI (pb_checkpoint_save / pb_checkpoint_restore, cffi ABI mode):
tensors in caller memory, a loader resumed mid-epoch, and errors that name the culprit.
Multi-rank restores from C are tested through Go (go/checkpoint_test.go)."""

import os

import pytest

from capi_loader import LIB_PATH, last_error, load
from test_capi_recordio import Loader, make_dataset

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


@pytest.fixture(scope="module")
def abi():
    return load()


class Named:
    """names and pb_tensor descriptors over cffi-owned float32 / int64 arrays."""

    def __init__(self, ffi, **arrays):
        self._keep = []
        self.n = len(arrays)
        self.names = ffi.new("char *[]", [self._str(ffi, k) for k in arrays])
        self.tensors = ffi.new("pb_tensor[]", self.n)
        self.data = {}
        for i, (name, (ctype, dtype, values)) in enumerate(arrays.items()):
            buf = ffi.new(f"{ctype}[]", values)
            self.data[name] = buf
            self.tensors[i].data, self.tensors[i].count = buf, len(values)
            self.tensors[i].dtype, self.tensors[i].device = dtype, -1

    def _str(self, ffi, s):
        c = ffi.new("char[]", s.encode())
        self._keep.append(c)
        return c


def test_save_and_restore_tensors_and_loader_position(abi, tmp_path):
    ffi, lib = abi
    paths, records = make_dataset(tmp_path)
    d = str(tmp_path / "ck").encode()
    ld = Loader(ffi, lib, paths, 8, shuffle=1, seed=2)
    assert ld.rc == 0, ld.msg
    assert lib.pb_loader_set_epoch(ld.h, 3) == 0
    first = [r for _ in range(5) for r in ld.next()]
    saved = Named(ffi, w=("float", lib.PB_FLOAT32, [1.5, 2.5]), n=("int64_t", lib.PB_INT64, [40]))
    assert lib.pb_checkpoint_save(d, 5, saved.n, saved.names, saved.tensors, ld.h, ffi.NULL, 2) == 0
    assert ld.close() == 0

    ld2 = Loader(ffi, lib, paths, 8, shuffle=1, seed=2)
    into = Named(ffi, w=("float", lib.PB_FLOAT32, [0, 0]), n=("int64_t", lib.PB_INT64, [0]))
    step = ffi.new("int64_t *")
    rc = lib.pb_checkpoint_restore(ffi.NULL, d, into.n, into.names, into.tensors, ld2.h, ffi.NULL, step)
    assert rc == 0, last_error(ffi, lib)
    assert step[0] == 5 and list(into.data["w"]) == [1.5, 2.5] and into.data["n"][0] == 40
    epoch = ffi.new("int64_t *")
    assert lib.pb_loader_epoch(ld2.h, epoch) == 0 and epoch[0] == 3  # the loop continues from here
    rest = [r for b in ld2.run_pass() for r in b]
    assert len(first) == 40 and sorted(first + rest) == sorted(records)  # each record once
    assert ld2.close() == 0

    empty = ffi.new("int64_t *", 99)
    assert lib.pb_checkpoint_restore(ffi.NULL, str(tmp_path / "none").encode(), 0, ffi.NULL, ffi.NULL,
                                     ffi.NULL, ffi.NULL, empty) == 0
    assert empty[0] == -1


def test_bad_arguments_are_named(abi, tmp_path):
    ffi, lib = abi
    d = str(tmp_path / "ck").encode()
    t = Named(ffi, w=("float", lib.PB_FLOAT32, [1, 2]))
    step = ffi.new("int64_t *")
    assert lib.pb_checkpoint_save(d, 1, t.n, t.names, t.tensors, ffi.NULL, ffi.NULL, 0) == 0
    assert lib.pb_checkpoint_save(ffi.NULL, 1, 0, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 0) == \
        lib.PB_ERR_INVALID_ARGUMENT and "directory" in last_error(ffi, lib)
    assert lib.pb_checkpoint_save(d, -3, 0, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 0) == \
        lib.PB_ERR_INVALID_ARGUMENT and "step" in last_error(ffi, lib)
    assert lib.pb_checkpoint_save(d, 2, 1, ffi.NULL, t.tensors, ffi.NULL, ffi.NULL, 0) == \
        lib.PB_ERR_INVALID_ARGUMENT and "names is NULL" in last_error(ffi, lib)
    twice = Named(ffi, w=("float", lib.PB_FLOAT32, [1]))
    names2 = ffi.new("char *[]", [twice.names[0], twice.names[0]])
    tensors2 = ffi.new("pb_tensor[]", [twice.tensors[0], twice.tensors[0]])
    assert lib.pb_checkpoint_save(d, 2, 2, names2, tensors2, ffi.NULL, ffi.NULL, 0) == \
        lib.PB_ERR_INVALID_ARGUMENT and "repeats the tensor name 'w'" in last_error(ffi, lib)
    short = Named(ffi, w=("float", lib.PB_FLOAT32, [0]))
    assert lib.pb_checkpoint_restore(ffi.NULL, d, short.n, short.names, short.tensors, ffi.NULL, ffi.NULL,
                                     step) == lib.PB_ERR_INVALID_ARGUMENT
    assert "'w' holds 2 PB_FLOAT32 elements, the one given 1" in last_error(ffi, lib)
    assert lib.pb_checkpoint_restore(ffi.NULL, d, t.n, t.names, t.tensors, ffi.NULL, ffi.NULL,
                                     ffi.NULL) == lib.PB_ERR_INVALID_ARGUMENT and "step" in last_error(ffi, lib)
    (tmp_path / "ck" / "step-000000000007.pt").write_bytes(b"not a checkpoint")
    assert lib.pb_checkpoint_restore(ffi.NULL, d, t.n, t.names, t.tensors, ffi.NULL, ffi.NULL,
                                     step) == lib.PB_ERR_CORRUPT
    assert "step-000000000007.pt" in last_error(ffi, lib)

    paths, _ = make_dataset(tmp_path)
    dyn = Loader(ffi, lib, paths, 4, partition=lib.PB_PARTITION_DYNAMIC)
    assert lib.pb_checkpoint_save(d, 9, 0, ffi.NULL, ffi.NULL, dyn.h, ffi.NULL, 0) == \
        lib.PB_ERR_INVALID_ARGUMENT and "dynamic partition" in last_error(ffi, lib)
    assert dyn.close() == 0
    assert lib.pb_checkpoint_save(d, 9, 0, ffi.NULL, ffi.NULL, dyn.h, ffi.NULL, 0) == lib.PB_ERR_CLOSED
