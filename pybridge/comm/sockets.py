"""The sockets a process group opened, so that leaving a broken world closes them at once.

A gloo world's sockets stay open while anything still references its context (a failed
work, a traceback), and a peer blocked on this rank then waits for its whole timeout
(abort() does not close them). Elastic training (elastic.py) notes the sockets that appear
while a world is built and shuts them down when it leaves the world: every peer blocked on
this rank fails at once. Linux (/proc/self/fd); elsewhere nothing is noted or closed.
"""

import os
import socket


def open_sockets(pid="self"):
    """The inode numbers of a process's open sockets (this process's by default)."""
    found = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def shut_down(inodes):
    """shutdown(SHUT_RDWR) every connected socket among `inodes`: both ends see it at once; the
    owner's file descriptors stay valid until it closes them."""
    if not inodes:
        return
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}")[8:-1] not in inodes:
                continue
            s = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            s.getpeername()  # connected ones only: gloo aborts the process when its listener fails
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected
        finally:
            s.close()  # the duplicate only
