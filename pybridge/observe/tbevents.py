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


def crc32c(data):
    c = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


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


def _summary(scalars):
    values = b""
    for tag, value in scalars.items():
        v = _field(1, 2, str(tag).encode()) + _field(2, 5, struct.pack("<f", float(value)))
        values += _field(1, 2, v)
    return values


def _record(data):
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", _masked(head)) + data + struct.pack("<I", _masked(data))


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
