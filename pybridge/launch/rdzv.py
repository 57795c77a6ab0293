"""pybridge-launch's rendezvous backends for torchrun: torch's c10d and static ones, with the
store bound to the job's address and sealed with the job secret (base/secret.py).

torch's own backends host their TCPStore on every interface and keep the c10d rendezvous
state as a pickle under a predictable key: any process that reaches the port could make
the launcher unpickle (run) what it wrote. Here the store listens on the endpoint's address
only, every value in it is sealed (a value written without the secret is refused before
torch reads it) and the run id is derived from the secret.

"pybridge-etcd" is the same dynamic rendezvous over the job's store in etcd (base/etcd_store.py):
no launcher hosts it, so any node may die and the others still meet there.

Registered as "pybridge-c10d", "pybridge-static" and "pybridge-etcd" when pybridge-launch
starts torchrun.
"""

import datetime
import errno

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousInfo, registry
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousStoreInfo
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous, create_rdzv_handler
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from ..base import etcd_store as _etcd_store
from ..base import netif
from ..base import sealed_store as _sealed
from ..base import secret as _secret

C10D, STATIC, ETCD = "pybridge-c10d", "pybridge-static", "pybridge-etcd"


def store(host, port, timeout, *, world_size=None, hosting=None):
    """A TCPStore at host:port, sealed with the job secret when there is one. hosting=None:
    host it when `host` is an address of this machine and the port is free (else connect),
    as torch's c10d backend guesses. Returns (store, hosted)."""
    fd = None
    if hosting is not False:
        try:
            fd = netif.listener(host, port).detach()
        except OSError as exc:
            if hosting or exc.errno not in (errno.EADDRNOTAVAIL, errno.EADDRINUSE):
                raise RendezvousConnectionError(f"cannot host the rendezvous store at {host}:{port}: "
                                                f"{exc.strerror or exc}") from exc
    s = dist.TCPStore(host, port, world_size, fd is not None, datetime.timedelta(seconds=timeout),
                      wait_for_workers=False, multi_tenant=fd is None, master_listen_fd=fd)
    return _sealed.protect(s, _secret.job_secret()), fd is not None


class _Backend(C10dRendezvousBackend):
    @property
    def name(self):
        return C10D


def _c10d(params):
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    is_host = params.get_as_bool("is_host")
    s, _ = store(host, port, params.get_as_int("read_timeout", 60), hosting=is_host)
    return create_handler(s, _Backend(s, params.run_id), params)


class _EtcdBackend(C10dRendezvousBackend):
    @property
    def name(self):
        return ETCD


def _etcd(params):
    # The endpoints, TLS and users as the workers get them (PYBRIDGE_ETCD_*, set by the launcher)
    settings = _etcd_store.settings(params.endpoint)
    timeout = params.get_as_int("read_timeout", 60)
    client = _etcd_store.connect(settings, timeout)
    store = _etcd_store.store(client, f"{_etcd_store.ROOT}/{params.run_id}/launch", timeout)
    sealed = _sealed.protect(store, _secret.job_secret())
    handler = create_handler(sealed, _EtcdBackend(sealed, params.run_id), params)
    handler.keep = (store, sealed)  # torch holds the Python stores by C++ pointers only
    return handler


class _Static(StaticTCPRendezvous):
    def get_backend(self):
        return STATIC

    def next_rendezvous(self):
        if not self._store:
            self._store, _ = store(self.master_addr, self.master_port, self.timeout.total_seconds(),
                                   world_size=self.world_size, hosting=self.rank == 0)
        return RendezvousInfo(dist.PrefixStore(self.run_id, self._store), self.rank, self.world_size,
                              RendezvousStoreInfo(self.master_addr, self.master_port))


def _static(params):
    h = create_rdzv_handler(params)  # its checks; --rdzv-conf hands the rank over as text
    return _Static(h.master_addr, h.master_port, int(h.rank), h.world_size, h.run_id, int(h.timeout.total_seconds()))


def register():
    """Make the two backends known to torchrun (once per process)."""
    known = registry.handler_registry._registry
    if C10D not in known:
        registry.handler_registry.register(C10D, _c10d)
    if STATIC not in known:
        registry.handler_registry.register(STATIC, _static)
    if ETCD not in known:
        registry.handler_registry.register(ETCD, _etcd)
