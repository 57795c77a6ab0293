"""TensorBoard event files, written without TensorBoard or TensorFlow installed.

An event file is a TFRecord stream (length, masked CRC-32C of the length, an `Event`
protocol buffer, masked CRC-32C of the data); the first event names the file version,
each later one holds a `Summary` of scalar values at a step. Only the few protobuf fields
scalars need are encoded here (tensorflow/core/util/event.proto, summary.proto), and
`tests/test_observe_export.py` reads the files back with TensorBoard's own reader.
"""

import os
import socket
import struct
import time


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def _next_table(prev):
    return [(v >> 8) ^ _TABLE[v & 0xFF] for v in prev]


# Slicing by 8: eight bytes per turn through eight tables (an eighth of the Python loop's turns).
_T1 = _next_table(_TABLE)
_T2 = _next_table(_T1)
_T3 = _next_table(_T2)
_T4 = _next_table(_T3)
_T5 = _next_table(_T4)
_T6 = _next_table(_T5)
_T7 = _next_table(_T6)
_WORDS = struct.Struct("<II").iter_unpack


def crc32c(data):
    c = 0xFFFFFFFF
    t0, t1, t2, t3, t4, t5, t6, t7 = _TABLE, _T1, _T2, _T3, _T4, _T5, _T6, _T7
    n = len(data) & ~7
    for lo, hi in _WORDS(memoryview(data)[:n]):
        c ^= lo
        c = (t7[c & 0xFF] ^ t6[(c >> 8) & 0xFF] ^ t5[(c >> 16) & 0xFF] ^ t4[c >> 24]
             ^ t3[hi & 0xFF] ^ t2[(hi >> 8) & 0xFF] ^ t1[(hi >> 16) & 0xFF] ^ t0[hi >> 24])
    for b in data[n:]:
        c = t0[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n):
    if n < 0x80:
        return _BYTE[n]
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_BYTE = [bytes((i,)) for i in range(0x80)]


def _field(number, wire, payload):
    key = _varint((number << 3) | wire)
    if wire == 2:  # length-delimited
        return key + _varint(len(payload)) + payload
    return key + payload


def _event(wall_time, step=None, file_version=None, summary=None):
    out = _field(1, 1, struct.pack("<d", wall_time))
    if step is not None:
        out += _field(2, 0, _varint(step & 0xFFFFFFFFFFFFFFFF))
    if file_version is not None:
        out += _field(3, 2, file_version.encode())
    if summary is not None:
        out += _field(5, 2, summary)
    return out


_TAGS = {}  # tag -> its encoded field, made once: a run logs the same few tags every step
_FLOAT = struct.Struct("<f").pack


def _summary(scalars):
    values = b""
    for tag, value in scalars.items():
        head = _TAGS.get(tag)
        if head is None:
            head = _TAGS[tag] = _field(1, 2, str(tag).encode())
        values += _field(1, 2, head + b"\x15" + _FLOAT(float(value)))  # \x15: field 2, 32-bit
    return values


_HEADS = {}  # length -> the record's header (the length and its checksum): events of a run repeat a few lengths


def _record(data):
    n = len(data)
    head = _HEADS.get(n)
    if head is None:
        packed = struct.pack("<Q", n)
        head = packed + struct.pack("<I", _masked(packed))
        if len(_HEADS) < 4096:
            _HEADS[n] = head
    return head + data + struct.pack("<I", _masked(data))


class EventWriter:
    """Scalars into `logdir/events.out.tfevents.<time>.<host>.<pid>.<suffix>`, the name
    TensorBoard looks for; one directory per rank keeps ranks apart in its run list."""

    def __init__(self, logdir, suffix=""):
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}{suffix}"
        self.path = os.path.join(logdir, name)
        self._f = open(self.path, "wb")
        self._f.write(_record(_event(time.time(), file_version="brain.Event:2")))
        self._f.flush()

    def scalars(self, step, values, wall_time=None):
        """Write `values` ({tag: number}) at `step` as one event."""
        if values:
            self._f.write(_record(_event(time.time() if wall_time is None else wall_time, int(step),
                                         summary=_summary(values))))

    def flush(self):
        self._f.flush()

    def close(self):
        if not self._f.closed:
            self._f.close()
