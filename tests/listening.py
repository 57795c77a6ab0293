"""Which TCP sockets a job listens on (Linux /proc), for the tests that no store or backend of
the job listens on all interfaces; and which federated listener threads this process runs,
for the tests that a server leaves none behind."""

import os
import socket
import struct

from pybridge.comm.sockets import open_sockets

WILDCARDS = ("0.0.0.0", "::")


def _address(hexaddr, v6):
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if v6:  # four 32-bit words, each in host byte order
        raw = b"".join(struct.pack("=I", struct.unpack(">I", raw[i:i + 4])[0]) for i in range(0, 16, 4))
        text = socket.inet_ntop(socket.AF_INET6, raw)
    else:
        text = socket.inet_ntop(socket.AF_INET, struct.pack("=I", int(ip, 16)))
    return text, int(port, 16)


def listening(pids):
    """[(address, port)] of the TCP sockets in LISTEN state held by these processes."""
    inodes = set()
    for pid in pids:
        inodes |= open_sockets(pid)
    out = []
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                out.append(_address(f[1], v6))
    return out


def family(root):
    """`root` and its descendants (pids)."""
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def wildcards(found):
    return [a for a in found if a[0] in WILDCARDS]


def listener_threads():
    """The names of the federated server's listener threads alive in this process."""
    import threading

    from pybridge.federated.listener import THREAD_PREFIX
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]
