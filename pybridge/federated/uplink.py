"""The up direction of the federated protocol (worker -> server): one TCP stream per worker,
read by the server with its own framing, so that no bytes a worker sends can overrun a
buffer the server posted.

Why not gloo: a gloo receive is posted with a size, and a peer that sends more than that
aborts the receiving process (gloo's `op.preamble.length <= op.nbytes` enforcement is a
C++ exception thrown on gloo's own thread: std::terminate, SIGABRT). No check in Python
can run first. Here the server reads exactly the bytes it decided to read, after checking
the header against what it expects: surplus bytes are read later as the next header (and
refused), a short payload is a connection that ends or stalls mid-message.

Setup: the server listens on the address the job uses (uplink_address: the rendezvous
store's host interface, loopback for a single-node job; never the wildcard), publishes
host, port and one random token per worker in the federation's store namespace, accepts
one connection per worker (each opens with a HELLO naming its rank and token; anything
else is closed unread) and closes the listening socket. Frames, all little-endian:

  message  = header (8 x int64, protocol.FIELDS) + payload (length x dtype's size bytes)
             + metrics (metrics bytes of text) + trailer (8 bytes, TRAILER)
  hello    = HELLO_MAGIC (8 bytes) + rank (int64) + token (16 bytes)
"""

import hmac
import json
import os
import secrets
import select
import socket
import struct
import time
from typing import TYPE_CHECKING, Iterable, Optional, Sequence, Union

import torch

from ..base import dtypes, netif
from ..comm import group as _group
from ..comm import rendezvous
from ..errors import CommError, Timeout

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

HEADER = struct.Struct("<8q")  # protocol.FIELDS, in order
HELLO = struct.Struct("<8sq16s")
HELLO_MAGIC = b"PBFEDUP1"
TRAILER = b"PBFEDEND"
TOKEN_BYTES = 16
SMALL = 1 << 16  # messages up to this size go out in one send


class Misbehaved(Exception):
    """A worker broke the up protocol (the text says how): it is retired."""


def uplink_address() -> str:
    """The address the server's up listener binds: the interface of the rendezvous store's
    host (MASTER_ADDR), GLOO_SOCKET_IFNAME's if set, loopback for a loopback store or when
    nothing tells. Never 0.0.0.0."""
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    if ifname:
        address: Optional[str] = netif.ipv4_of(ifname)
        if address:
            return address
    host = _store_host() or os.environ.get("MASTER_ADDR")
    if not host:
        return "127.0.0.1"
    try:
        ip = str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])  # AF_INET: (host, port)
    except OSError:
        return "127.0.0.1"
    if ip.startswith("127."):
        return "127.0.0.1"
    try:
        address_towards: str = netif.local_address_towards(ip)
        return address_towards
    except OSError:
        return "127.0.0.1"


def _store_host() -> Optional[str]:
    try:
        store = _group.world_store()
    except Exception:  # noqa: BLE001 - no world: fall back on the environment
        return None
    host: Optional[str] = rendezvous.tcp_host(store)
    return host


def _key(w: int) -> str:
    return f"federated/uplink/{w}"


class Listener:
    """The server's side of the setup: listen, publish, accept one connection per worker."""

    def __init__(self, store: "Store", workers: Iterable[int]) -> None:
        self.store = store
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((uplink_address(), 0))
        workers = list(workers)
        self.sock.listen(max(len(workers), 8))
        host, port = self.sock.getsockname()
        self.tokens = {w: secrets.token_bytes(TOKEN_BYTES) for w in workers}
        for w, token in self.tokens.items():
            store.set(_key(w), json.dumps({"host": host, "port": port, "token": token.hex()}))

    @property
    def address(self) -> tuple[str, int]:
        address: tuple[str, int] = self.sock.getsockname()
        return address

    def accept(self, timeout: float) -> dict[int, "Conn"]:
        """{worker rank: Conn} of the workers that connected within `timeout` seconds. A
        connection whose hello is not a worker's (wrong magic, rank or token) is closed."""
        conns: dict[int, Conn] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(conns) < len(self.tokens):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.sock.settimeout(left)
                try:
                    s, _ = self.sock.accept()
                except (socket.timeout, OSError):
                    break
                try:
                    s.settimeout(min(left, 10.0))
                    magic, rank, token = HELLO.unpack(_read(s, HELLO.size))
                except (OSError, EOFError, struct.error):
                    s.close()
                    continue
                expected = self.tokens.get(rank)
                if magic != HELLO_MAGIC or expected is None or rank in conns or \
                        not hmac.compare_digest(token, expected):
                    s.close()
                    continue
                conns[rank] = Conn(s)
        finally:
            self.close()
        return conns

    def close(self) -> None:
        self.sock.close()
        for w in self.tokens:
            try:
                self.store.delete_key(_key(w))
            except Exception:  # noqa: BLE001 - best effort: the tokens are spent anyway
                pass


def connect(store: "Store", rank: int, timeout: float) -> socket.socket:
    """The worker's side of the setup: the server's published address and this rank's
    token from the store, a connection, the hello. Returns the connected socket."""
    try:
        entry = json.loads(store.get(_key(rank)).decode())
        s = socket.create_connection((entry["host"], int(entry["port"])), timeout=timeout)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise CommError(f"federated worker {rank} could not reach the server's up link: {exc}") from None
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(HELLO.pack(HELLO_MAGIC, rank, bytes.fromhex(entry["token"])))
    return s


def _read(s: socket.socket, n: int) -> bytes:
    """Exactly n bytes from socket `s` (its own timeout); EOFError when it ends first."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = s.recv_into(view[got:])
        if not k:
            raise EOFError(got)
        got += k
    return bytes(buf)


class Conn:
    """The server's end of one worker's up stream."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def read_into(self, view: memoryview, timeout: float, what: str) -> None:
        """Fill memoryview `view`; Misbehaved when the stream ends or no byte comes for
        `timeout` seconds before it is full (what: the part being read, for the message)."""
        n, got = len(view), 0
        self.sock.settimeout(timeout)
        while got < n:
            try:
                k = self.sock.recv_into(view[got:])
            except socket.timeout:
                raise Misbehaved(f"sent {got} of the {n} bytes of {what}, then nothing for {timeout:g} s") from None
            if not k:
                raise Misbehaved(f"sent {got} of the {n} bytes of {what}, then closed its connection")
            got += k

    def read_header(self, idle: Optional[float], timeout: float) -> tuple[int, ...]:
        """The next header's 8 fields: waits up to `idle` seconds (None: for ever) for its
        first byte. EOFError when the stream ends cleanly before it (the worker is gone)."""
        buf = bytearray(HEADER.size)
        view = memoryview(buf)
        self.sock.settimeout(idle)
        try:
            k = self.sock.recv_into(view)
        except socket.timeout:
            raise Timeout(f"no message for {idle:g} s") from None
        if not k:
            raise EOFError("its connection closed")
        if k < HEADER.size:
            self.read_into(view[k:], timeout, "a header")
        return HEADER.unpack(buf)

    def read_tensor(self, numel: int, dtype: int, timeout: float, what: str) -> torch.Tensor:
        t = torch.empty(numel, dtype=dtypes.BY_CODE[dtype])
        if numel:
            self.read_into(memoryview(t.view(torch.uint8).numpy()), timeout, what)
        return t

    def read_bytes(self, n: int, timeout: float, what: str) -> bytes:
        buf = bytearray(n)
        if n:
            self.read_into(memoryview(buf), timeout, what)
        return bytes(buf)

    def shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


def send_message(sock: socket.socket, fields: Sequence[int], payload: torch.Tensor, metrics: bytes) -> None:
    """A worker's message: header `fields`, `payload` (a CPU tensor) and `metrics` (bytes),
    then the trailer. Raises CommError when the server's end is gone: checked before the
    send, since a send to a closed peer can succeed into the kernel's buffer."""
    _check_alive(sock)
    data: Union[memoryview, bytes] = memoryview(payload.contiguous().view(torch.uint8).numpy()) if payload.numel() else b""
    head = HEADER.pack(*fields)
    try:
        if len(data) <= SMALL:
            sock.sendall(b"".join((head, data, metrics, TRAILER)))
        else:
            sock.sendall(head)
            sock.sendall(data)
            sock.sendall(metrics + TRAILER)
    except OSError as exc:
        raise CommError(f"the up link to the server broke: {exc}") from None


def _check_alive(sock: socket.socket) -> None:
    """CommError if the server closed the stream (it never writes to it, so anything to read
    is its end: EOF or a reset)."""
    try:
        if not select.select([sock], [], [], 0)[0]:
            return
        data = sock.recv(1, socket.MSG_PEEK)
    except OSError as exc:
        raise CommError(f"the up link to the server broke: {exc}") from None
    if not data:
        raise CommError("the server closed the up link")
