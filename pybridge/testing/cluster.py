"""A simulated cluster on one machine: nodes as network namespaces on one bridge.

For multi-node tests and benchmarks (docs/testing.md, bench/cluster): each node is a
network namespace with loopback up and one link (`eth0`, address 198.18.0.<k+1>/24, in
RFC 2544's benchmarking range, known to the others as node<k>) to a bridge that lives in a namespace of its own, so the
host's interfaces, routes and addresses are never touched and traffic can reach only the
nodes. A link may be rate-limited with tc htb in both directions (the node's egress and
the bridge port's egress towards it), and given a CPU budget (`cpus`: a cgroup v1 cpu
quota per node, cpulimit.py), so that N nodes have N times the compute of one even on a
machine with fewer cores, and a scaling curve means what it says. Needs root and
iproute2; `available()` says whether this machine can, and why not.

    with Cluster(2, rate_mbit=1000, cpus=0.2) as c:
        p = c.nodes[1].popen(["python3", "-m", "pybridge.launch", ...])
        print(c.nodes[0].address, c.nodes[1].link_bytes())
        print(c.report())   # per node: the rate and CPU budget set, the CPU and bytes used

Teardown kills every process started in a node (their process groups) and deletes the
namespaces (which deletes their links), on exit from the `with` block, on close(), at
interpreter exit, and for namespaces left by a process that died without it (their
names carry its pid).
"""

import atexit
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from ..errors import InvalidArgument, PyBridgeError
from . import cpulimit

SUBNET = "198.18.0"  # RFC 2544: reserved for benchmarking; nodes are .1, .2, ...
PREFIX = "pbc"       # namespace names: pbc<pid>x<count>-<node> and pbc<pid>x<count>-sw
ETC_NETNS = "/etc/netns"
_count = itertools.count()
_live = set()
_lock = threading.Lock()


class ClusterError(PyBridgeError):
    """The cluster could not be built (not root, no iproute2, a command failed)."""


def _ip(*args, check=True):
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {p.stderr.strip() or p.returncode}")
    return p


def _tc(ns, *args):
    p = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise ClusterError(f"tc {' '.join(args)} in {ns}: {p.stderr.strip() or p.returncode}")


def available():
    """(True, "") when this machine can build a cluster, else (False, why not)."""
    if os.geteuid() != 0:
        return False, "needs root (network namespaces)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"needs {tool} (iproute2)"
    probe = f"{PREFIX}{os.getpid()}probe"
    p = _ip("netns", "add", probe, check=False)
    if p.returncode != 0:
        return False, f"cannot create a network namespace: {p.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return True, ""


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale():
    """Delete the namespaces of clusters whose process is gone (killed before teardown)."""
    p = _ip("netns", "list", check=False)
    for line in p.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX):
            continue
        digits = name[len(PREFIX):].split("x", 1)[0]
        if digits.isdigit() and not _pid_alive(int(digits)):
            _kill_namespace(name)
            _ip("netns", "del", name, check=False)
            shutil.rmtree(os.path.join(ETC_NETNS, name), ignore_errors=True)
    for root in (cpulimit.CPU_ROOT, cpulimit.ACCT_ROOT):  # the nodes' CPU budgets (named as their namespaces)
        for name in os.listdir(root) if os.path.isdir(root) else ():
            digits = name[len(PREFIX):].split("x", 1)[0] if name.startswith(PREFIX) else ""
            if digits.isdigit() and not _pid_alive(int(digits)):
                try:
                    os.rmdir(os.path.join(root, name))
                except OSError:
                    pass


class Node:
    """One node: a network namespace with `address` on its link `eth0`."""

    def __init__(self, cluster, index, ns, address):
        self.cluster, self.index, self.ns, self.address = cluster, index, ns, address
        self.budget = None  # cpulimit.CpuBudget when the cluster gives nodes a CPU budget
        self._procs = []

    def command(self, argv):
        """argv run inside this node's namespace (and CPU budget)."""
        cmd = ["ip", "netns", "exec", self.ns, *argv]
        return self.budget.wrap(cmd) if self.budget is not None else cmd

    def popen(self, argv, **kwargs):
        """Start argv in the node (its own process group, killed at teardown)."""
        kwargs.setdefault("start_new_session", True)
        p = subprocess.Popen(self.command(argv), **kwargs)
        self._procs.append(p)
        return p

    def run(self, argv, *, timeout, **kwargs):
        """Run argv in the node to completion, its output (stderr into stdout, text) in the
        result's stdout; on timeout its process group is killed."""
        p = self.popen(argv, **{"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, **kwargs})
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(p)
            out, _ = p.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, out) from None
        return subprocess.CompletedProcess(argv, p.returncode, out, None)

    def link_bytes(self):
        """(bytes sent, bytes received) on the node's link so far."""
        p = _ip("-n", self.ns, "-s", "-j", "link", "show", "eth0")
        stats = json.loads(p.stdout)[0]["stats64"]
        return stats["tx"]["bytes"], stats["rx"]["bytes"]

    def report(self):
        """What was set for this node and what it used so far: link rate, bytes sent and
        received, CPU budget, CPU seconds and throttled periods."""
        sent, received = self.link_bytes()
        out = {"node": self.index, "address": self.address, "rate_mbit": self.cluster.rate_mbit,
               "sent_bytes": sent, "received_bytes": received, "cpus": None}
        if self.budget is not None:
            out.update(self.budget.report())
        return out

    def unplug(self):
        """Take the node's link down, as a machine that lost power or its switch port: its
        peers' packets go nowhere and nothing answers them (no connection reset)."""
        _ip("-n", self.ns, "link", "set", "eth0", "down")

    def plug(self):
        """Bring the node's link back up (a replacement machine in the same place)."""
        _ip("-n", self.ns, "link", "set", "eth0", "up")

    def kill(self):
        """Kill every process in this node, at once (a node lost): those started here and
        any they started in sessions of their own (torchrun's workers), found by namespace."""
        _kill_namespace(self.ns)
        for p in self._procs:
            _kill(p)


def _kill_namespace(ns):
    # Stop every process first, then kill: a kill one by one would let the last ones run for
    # a moment after the first died, and see (and answer for) a node that is already lost.
    pids = []
    for pid in _ip("netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGSTOP)
            pids.append(int(pid))
        except (ProcessLookupError, ValueError):
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _kill(p):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class Cluster:
    """`nodes` namespaces on one bridge; `rate_mbit` limits each node's link (both ways);
    `cpus` gives each node that many CPUs (e.g. 0.2; None: no budget, the machine's)."""

    def __init__(self, nodes, *, rate_mbit=None, cpus=None):
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 250:
            raise InvalidArgument(f"nodes must be an integer from 1 to 250, got {nodes!r}")
        if rate_mbit is not None and not (isinstance(rate_mbit, (int, float)) and rate_mbit > 0):
            raise InvalidArgument(f"rate_mbit must be a positive number of Mbit/s or None, got {rate_mbit!r}")
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not cpus > 0):
            raise InvalidArgument(f"cpus must be a positive number of CPUs per node or None, got {cpus!r}")
        ok, why = available()
        if not ok:
            raise ClusterError(f"cannot build a cluster here: {why}")
        if cpus is not None:
            ok, why = cpulimit.available()
            if not ok:
                raise ClusterError(f"cannot give nodes a CPU budget here: {why}")
        remove_stale()
        self.rate_mbit, self.cpus = rate_mbit, cpus
        base = f"{PREFIX}{os.getpid()}x{next(_count)}"
        self.switch = f"{base}-sw"
        self.nodes = [Node(self, k, f"{base}-{k}", f"{SUBNET}.{k + 1}") for k in range(nodes)]
        self._closed = False
        with _lock:
            _live.add(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        if self.cpus is not None:
            for node in self.nodes:
                node.budget = cpulimit.CpuBudget(self.cpus, name=node.ns)
        # `ip netns exec` shows /etc/netns/<ns>/hosts as /etc/hosts: the nodes know each
        # other as node0, node1, ... (and peers' reverse lookups find a name).
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.address} node{n.index}\n" for n in self.nodes)
        for node in self.nodes:
            os.makedirs(os.path.join(ETC_NETNS, node.ns), exist_ok=True)
            with open(os.path.join(ETC_NETNS, node.ns, "hosts"), "w") as f:
                f.write(hosts)
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for node in self.nodes:
            port = f"p{node.index}"
            _ip("netns", "add", node.ns)
            _ip("-n", node.ns, "link", "set", "lo", "up")
            # Both ends are created inside the namespaces: nothing appears on the host.
            _ip("-n", node.ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", self.switch)
            _ip("-n", node.ns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", node.ns, "link", "set", "eth0", "up")
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            if self.rate_mbit is not None:
                for ns, dev in ((node.ns, "eth0"), (self.switch, port)):
                    rate = f"{self.rate_mbit}mbit"
                    _tc(ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
                    _tc(ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
                        "rate", rate, "ceil", rate)

    def report(self):
        """Per node, what was set (link rate, CPU budget) and what it used so far."""
        return [n.report() for n in self.nodes]

    def launch(self, argv, *, nproc_per_node, port, **kwargs):
        """Start `pybridge-launch ... argv` in every node, as on real machines: --nnodes,
        each node's --node-rank, node 0 hosting the rendezvous on `port`. Output is piped
        (stderr into stdout, text). Returns the Popens, by node."""
        kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, **kwargs}
        return [n.popen([sys.executable, "-m", "pybridge.launch", "--nproc-per-node", str(nproc_per_node),
                         "--nnodes", str(len(self.nodes)), "--node-rank", str(n.index), "--master-addr", "node0",
                         "--master-port", str(port), *argv], **kwargs)
                for n in self.nodes]

    def communicate(self, procs, timeout):
        """The outputs of `procs` (launch's), all within `timeout` seconds in total; past it
        every node is killed and subprocess.TimeoutExpired raised."""
        deadline = time.monotonic() + timeout
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                for n in self.nodes:
                    n.kill()
                raise subprocess.TimeoutExpired(p.args, timeout) from None
        return outs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Kill every process started in the nodes and delete the namespaces."""
        if self._closed:
            return
        self._closed = True
        for node in self.nodes:
            node.kill()
            if node.budget is not None:
                node.budget.close()
        for ns in [n.ns for n in self.nodes] + [self.switch]:
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(os.path.join(ETC_NETNS, ns), ignore_errors=True)
        with _lock:
            _live.discard(self)


@atexit.register
def _close_all():
    for c in list(_live):
        c.close()


__all__ = ["Cluster", "ClusterError", "Node", "available", "remove_stale"]
