"""Which network interface a node's ranks talk on (multi-node jobs).

gloo and NCCL pick their listening address from the machine's hostname unless told an
interface (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). On many machines the hostname resolves
to a loopback address (Debian's 127.0.1.1, containers' 127.0.0.1), so peers on other nodes
are handed an address they cannot reach and the job stalls until the timeout. The
launcher therefore names, for a multi-node job, the interface whose address routes to the
rendezvous host: the one this node already reaches the others through.
"""

import fcntl
import os
import random
import re
import socket
import struct

from ..errors import InvalidArgument

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def ipv4_of(name):
    """Interface `name`'s IPv4 address, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None  # no IPv4 address
    return socket.inet_ntoa(packed[20:24])


def local_address_towards(host):
    """This machine's IPv4 address that traffic to `host` leaves from (no packet is sent)."""
    ip = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((ip, 9))  # UDP connect only picks the route
        return s.getsockname()[0]


def interface_with(address):
    """The name of the interface holding IPv4 `address`, or None."""
    for _, name in socket.if_nameindex():
        if ipv4_of(name) == address:
            return name
    return None


def interface_towards(host):
    """(interface name, local address) that reaches `host`; (None, None) if unknown."""
    try:
        address = local_address_towards(host)
    except OSError:
        return None, None
    return interface_with(address), address


# Rendezvous ports are picked below Linux's default ephemeral range (32768-60999): a port
# found free there can be taken, before the store binds it, as the source port of any
# outgoing connection on the machine (seen in CI: "address already in use").
# PYBRIDGE_PORTS=LOW-HIGH narrows the range: a firewall's open ports, or one range per job
# where several share a machine (the test suite gives each of its workers its own).
DEFAULT_PORTS = range(20000, 32000)

# Not the global generator: programs (torch's test cases among them) seed it, and two
# processes seeded alike would pick the same "free" port at the same moment (seen in CI).
_random = random.SystemRandom()


def port_range(env=None):
    """The ports rendezvous ports are picked from: PYBRIDGE_PORTS, else 20000-31999."""
    spec = (os.environ if env is None else env).get("PYBRIDGE_PORTS", "").strip()
    if not spec:
        return DEFAULT_PORTS
    m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", spec)
    if not m or not 1024 <= int(m[1]) <= int(m[2]) <= 65535:
        raise InvalidArgument(f"PYBRIDGE_PORTS={spec!r}: expected LOW-HIGH, two ports from 1024 to "
                              "65535 with LOW <= HIGH, e.g. 20000-31999")
    return range(int(m[1]), int(m[2]) + 1)


def free_port():
    """A TCP port nothing listens on now, from port_range() (for a rendezvous)."""
    ports = port_range()
    for _ in range(200):
        port = _random.choice(ports)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    with socket.socket() as s:  # the range is full: let the kernel choose
        s.bind(("", 0))
        return s.getsockname()[1]


def is_loopback(host):
    """True when `host` (a name or an address) resolves to loopback addresses only."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(_loopback(ai[4][0]) for ai in infos)


def _loopback(address):
    return address == "::1" or address.startswith("127.") or address.startswith("::ffff:127.")


def listener(host, port):
    """A listening TCP socket for a store hosted at `host`:`port` (port 0: any free one),
    bound to the address `host` names on this machine, never to all interfaces: another
    process can then reach the store only where the job itself does (loopback for a
    single-node job). Returns the socket; give its fileno() to TCPStore(master_listen_fd=)
    and keep the socket open as long as the store lives.

    Raises OSError when `host` is not an address of this machine (the store would be
    unreachable there anyway) or the port is taken."""
    last = None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot resolve the store's host {host!r}: {exc.strerror or exc}") from None
    # IPv4 first: the address clients resolve the same name to most often
    for family, _, _, _, address in sorted(infos, key=lambda ai: ai[0] != socket.AF_INET):
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server
            s.bind(address)
            s.listen(2048)
            s.set_inheritable(False)
            return s
        except OSError as exc:
            last = exc
            s.close()
    raise last
