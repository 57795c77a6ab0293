"""The rendezvous store of init(), built by pybridge so that every way of failing is bounded.

torch's own rendezvous (init_process_group(init_method=...)) has two unbounded waits:
  * file:// in a directory that does not exist: FileStore retries opening the file for its
    default timeout (5 minutes), whatever timeout init was given;
  * tcp:// and env:// with rank 0 (the store's host) missing: the TCPStore client retries
    connecting with a back-off that overshoots, taking 1.5-3x the timeout.
Here a missing directory fails at once, naming it, and a client first waits for the store's
host itself (a plain connect loop with a deadline, then the TCPStore gets what is left), so
init fails within the timeout and says that rank 0, the store's host, is missing.
"""

import datetime
import errno
import os
import socket
import struct
import time
from urllib.parse import urlparse

import torch.distributed as dist

from ..base import etcd_store as _etcd
from ..base import netif
from ..base import sealed_store as _sealed
from ..base import secret as _secret
from . import cancel as _cancel
from ..errors import InvalidArgument, PyBridgeError, Timeout, classify

RETRY_SECONDS = 0.05  # between connection attempts to a store host that is not up yet
MIN_STORE_SECONDS = 1.0  # the least a TCPStore is given to connect to a host that answered
REPLY_MARGIN_SECONDS = 2.0  # a store reply may take the store's timeout (a wait for a key), plus this


def store(method, rank, world_size, timeout):
    """The store for init_process_group(store=...): as torch's rendezvous would build it for
    `method` (env://, tcp://HOST:PORT or file://PATH), under the same key prefix."""
    url = urlparse(method)
    if url.scheme == "file":
        return _file_store(url.path, world_size, timeout)
    host, port = tcp_address(method)
    return seal(_tcp_store(host, port, rank, world_size, timeout), host, "default_pg")


def etcd_selected(backend, endpoint, other_given):
    """The etcd endpoints init() rendezvouses through, or None for the others (the TCPStore,
    a file, a given store). rdzv_backend beside init_method, master_* or store is refused;
    PYBRIDGE_RDZV_BACKEND is read only when none of them is given."""
    if other_given:
        if backend not in (None, "") or endpoint:
            raise InvalidArgument("give either rdzv_backend/rdzv_endpoint or init_method, master_addr/master_port "
                                  "or store, not both")
        return None
    return _etcd.selected(backend, endpoint)


def seal_etcd(store):
    """A store in etcd as the job sees it: sealed with the job secret where there is one."""
    return _sealed.protect(store, _secret.job_secret(), "default_pg")


def etcd(endpoint, conf, job, rank, world_size, timeout):
    """The store of init() in etcd (base/etcd_store.py): (sealed store, World). The keys of
    one attempt of one job live under /pybridge/<id>/<attempt>/, the id made unguessable
    from the job secret when there is one, as torchrun's run id is here."""
    settings = _etcd.settings(endpoint, conf)
    run = _etcd.run_name(settings, _etcd.job_id(job))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    try:
        world = _etcd.open_world(settings, run, attempt if attempt.isdigit() else 0, rank, world_size, timeout)
    except Exception as exc:  # noqa: BLE001 - python-etcd's own errors too: named, typed
        err = exc if isinstance(exc, PyBridgeError) else _etcd.error(settings, exc)
        raise type(err)(f"init (rank {rank}): {err}") from exc
    world.on_loopback = settings.on_loopback()
    return seal_etcd(world.store), world


def seal(store, host, prefix=""):
    """The job's view of a TCP store at `host`, its keys under `prefix`: sealed with the job
    secret when there is one (base/secret.py); without one, a store reachable from other
    machines is named in a warning."""
    key = _secret.job_secret()
    if key is None and not netif.is_loopback(host):
        _secret.warn_unprotected(f"the rendezvous store at {host}")
    return _sealed.protect(store, key, prefix)


def tcp_address(method):
    """(host, port) of the store of an env:// or tcp://HOST:PORT method."""
    url = urlparse(method)
    if url.scheme == "env":
        return os.environ["MASTER_ADDR"], _port(os.environ["MASTER_PORT"], "MASTER_PORT")
    host, port = url.hostname, _port(url.port, f"init_method {method!r}")
    if not host:
        raise InvalidArgument(f"init_method {method!r} names no host")
    return host, port


def tcp_host(store):
    """The host of `store` when it is a TCPStore, under any prefixes; None for another store
    (a FileStore, or a store sealed with the job secret)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store.host if isinstance(store, dist.TCPStore) else None


def agent_hosts_store():
    """Under torchrun's agent store, the agent (not rank 0) hosts the store."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _port(value, what):
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = -1
    if not 0 < port < 65536:
        raise InvalidArgument(f"{what} must give a port in 1..65535, got {value!r}")
    return port


def _file_store(path, world_size, timeout):
    if not path:
        raise InvalidArgument("init_method file:// names no file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidArgument(f"init_method file://{path}: the directory {folder} does not exist "
                              "(it must exist, on a file system every rank shares)")
    try:
        s = dist.FileStore(path, world_size)
        s.set_timeout(datetime.timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001
        raise classify(exc) from exc
    return dist.PrefixStore("default_pg", s)


def _tcp_store(host, port, rank, world_size, timeout):
    hosting = rank == 0 and not agent_hosts_store()
    deadline = time.monotonic() + timeout
    if not hosting:
        _wait_for_host(host, port, rank, timeout, deadline)
    left = max(deadline - time.monotonic(), MIN_STORE_SECONDS)
    try:
        # The host listens on the address the job uses (MASTER_ADDR), not on every
        # interface: torch's own server binds the wildcard address.
        fd = _listen_fd(host, port) if hosting else None
        # No wait for all workers here (it says only "1/2 clients joined"): the roster
        # (roster.py) waits instead and names the ranks that are missing.
        s = dist.TCPStore(host, port, world_size, hosting, datetime.timedelta(seconds=left),
                          wait_for_workers=False, multi_tenant=True, master_listen_fd=fd)
        s.set_timeout(datetime.timedelta(seconds=timeout))  # for the keys waited on later
        _bound_replies(host, port, timeout + REPLY_MARGIN_SECONDS)
    except Exception as exc:  # noqa: BLE001
        err = classify(exc)
        if hosting and "address already in use" in str(exc).lower():
            err = InvalidArgument(f"rank 0 cannot host the rendezvous store on port {port}: it is "
                                  f"already in use ({exc})")
        raise err from exc
    return s


def _listen_fd(host, port):
    """A socket bound to `host`:`port` for the store's server (which takes it over), or None
    when the port is taken: a server of this process on that port is then reused
    (multi_tenant), otherwise torch reports the port in use."""
    try:
        return netif.listener(host, port).detach()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return None
        raise InvalidArgument(f"rank 0 cannot host the rendezvous store at {host}:{port}: {exc.strerror or exc} "
                              "(MASTER_ADDR must be an address of rank 0's machine)") from None


def _wait_for_host(host, port, rank, timeout, deadline):
    """Return once the store's host accepts a connection; Timeout at the deadline."""
    last = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.01)):
                return
        except OSError as exc:
            last = exc
        if time.monotonic() + RETRY_SECONDS >= deadline:
            break
        _cancel.check(f"init, while waiting for the rendezvous store at {host}:{port}")
        time.sleep(RETRY_SECONDS)
    raise Timeout(f"rank {rank}: the rendezvous store at {host}:{port}, hosted by rank 0, did not "
                  f"accept a connection within {timeout:g} s ({last.strerror or last}): rank 0 is "
                  "missing, has not started yet, or the address is wrong")


def _bound_replies(host, port, seconds):
    """Give this process's connections to the store a receive timeout.

    The TCPStore client waits for each reply in a recv() without a deadline: with the host
    stopped or cut off (no FIN, no RST), an add() or a subgroup's rendezvous waited for ever.
    Every legitimate reply comes within the store's timeout (waits for a key are bounded by
    it), so `seconds` above it only ends the hangs; torch then raises a timeout. Linux
    (/proc/self/fd); elsewhere nothing changes."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
        addrs = {ai[4][0] for ai in socket.getaddrinfo(host, port)}
    except OSError:
        return
    limit = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    for fd in fds:
        try:
            copy = os.dup(fd)  # closing the copy leaves the store's own
        except OSError:
            continue  # closed meanwhile
        try:
            s = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)
            continue  # not a socket
        try:
            peer = s.getpeername()
            if peer[1] == port and peer[0].removeprefix("::ffff:") in addrs:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
        except (OSError, IndexError, TypeError):
            pass  # unconnected, or not an IP socket
        finally:
            s.close()
