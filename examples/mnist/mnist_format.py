"""The conventions shared by prepare.py, the Python twin (train.py), the Go trainer and the tests.

This file is the one definition; README.md in this folder restates it for the Go trainer,
which hardcodes the same numbers. Change both together, never one.

Record (one per image, fixed size, RECORD_BYTES = 785 bytes):
    byte 0       label, uint8 0..9
    bytes 1..784 pixels, uint8 0..255, row-major 28x28 (row 0 = top), 0 = background
Trainers scale pixels to float32 by /255 (no mean/std normalisation).

Shards (a prepared folder):
    train-00000-of-0000N.recordio ... (TRAIN_GLOB: "train-*.recordio", sorted by name)
    test-00000-of-0000M.recordio ...  (TEST_GLOB: "test-*.recordio", sorted by name)
    manifest.json                     (kind "synthetic" or "mnist", counts, shards, layout)
RecordIO chunks hold CHUNK_RECORDS records each (the unit of the loader's shuffle).

Checkpoint / weights file (little-endian, written by rank 0, atomically via rename):
    8 bytes  magic b"PBMLP01\\n"
    uint64   epochs completed
    uint64   global steps completed
    uint32   number of tensors (8)
    then per tensor: uint32 ndim, ndim x uint32 dims, float32 data (row-major), in this order:
        w1 [128, 784], b1 [128], w2 [10, 128], b2 [10]               (parameters)
        m_w1, m_b1, m_w2, m_b2, same shapes                           (SGD momentum buffers)
    w1/w2 are [out, in] (torch.nn.Linear's layout): hidden = relu(x @ w1.T + b1).
"""

import os
import struct

import numpy as np

IMAGE_SIDE = 28
IMAGE_BYTES = IMAGE_SIDE * IMAGE_SIDE  # 784
LABEL_BYTES = 1
RECORD_BYTES = LABEL_BYTES + IMAGE_BYTES  # 785: label first, then the pixels
LAYOUT = [("label", "u1", ()), ("image", "u1", (IMAGE_SIDE, IMAGE_SIDE))]
NUM_CLASSES = 10
HIDDEN = 128

TRAIN_GLOB = "train-*.recordio"
TEST_GLOB = "test-*.recordio"
MANIFEST = "manifest.json"
CHUNK_RECORDS = 64


def shard_name(split, index, count):
    """e.g. shard_name("train", 0, 4) == "train-00000-of-00004.recordio"."""
    return f"{split}-{index:05d}-of-{count:05d}.recordio"


def encode_record(label, image):
    """One record: the label byte, then the 784 pixel bytes."""
    return bytes([int(label)]) + np.ascontiguousarray(image, np.uint8).tobytes()


# ---------------------------------------------------------------- checkpoint / weights file

MAGIC = b"PBMLP01\n"
TENSOR_NAMES = ["w1", "b1", "w2", "b2", "m_w1", "m_b1", "m_w2", "m_b2"]
SHAPES = {"w1": (HIDDEN, IMAGE_BYTES), "b1": (HIDDEN,), "w2": (NUM_CLASSES, HIDDEN),
          "b2": (NUM_CLASSES,)}
for _n in list(SHAPES):
    SHAPES["m_" + _n] = SHAPES[_n]


def write_checkpoint(path, epoch, step, tensors):
    """tensors: name -> float32 array (TENSOR_NAMES; missing momentum buffers are zeros)."""
    parts = [MAGIC, struct.pack("<QQI", int(epoch), int(step), len(TENSOR_NAMES))]
    for name in TENSOR_NAMES:
        a = tensors.get(name)
        a = np.zeros(SHAPES[name], np.float32) if a is None else np.asarray(a, np.float32)
        if a.shape != SHAPES[name]:
            raise ValueError(f"checkpoint tensor {name} has shape {a.shape}, want {SHAPES[name]}")
        parts.append(struct.pack("<I", a.ndim) + struct.pack(f"<{a.ndim}I", *a.shape))
        parts.append(np.ascontiguousarray(a, "<f4").tobytes())
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(b"".join(parts))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_checkpoint(path):
    """(epoch, step, {name: float32 array}); ValueError for a file that is not one."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] != MAGIC:
        raise ValueError(f"{path}: not a pybridge MNIST checkpoint (bad magic)")
    epoch, step, count = struct.unpack_from("<QQI", raw, 8)
    if count != len(TENSOR_NAMES):
        raise ValueError(f"{path}: {count} tensors, want {len(TENSOR_NAMES)}")
    pos, out = 28, {}
    for name in TENSOR_NAMES:
        (ndim,) = struct.unpack_from("<I", raw, pos)
        shape = struct.unpack_from(f"<{ndim}I", raw, pos + 4)
        pos += 4 + 4 * ndim
        if tuple(shape) != SHAPES[name]:
            raise ValueError(f"{path}: tensor {name} has shape {shape}, want {SHAPES[name]}")
        n = int(np.prod(shape))
        if pos + 4 * n > len(raw):
            raise ValueError(f"{path}: truncated in tensor {name}")
        out[name] = np.frombuffer(raw, "<f4", n, pos).reshape(shape).astype(np.float32)
        pos += 4 * n
    if pos != len(raw):
        raise ValueError(f"{path}: {len(raw) - pos} trailing bytes")
    return epoch, step, out
