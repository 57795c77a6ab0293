"""Where an elastic job keeps its membership and each world's rendezvous (docs/elastic.md).

Two places, one interface (connect, describe, gloo_host):

  TcpStore   the TCPStore hosted by pybridge-launch --elastic on node 0: the default. The
             store lives in that launcher, so node 0's death ends the job.
  EtcdStore  the job's folder in etcd (--rdzv-backend etcd, base/etcd_store.py), a store
             replicated by Raft that the cluster runs: no process of the job holds state the
             others need, so any node, node 0 included, may die.

Every value is sealed with the job secret where there is one, in either place.
"""

import datetime
import os
from typing import Any, Mapping, Optional, Union

import torch.distributed as dist

from ..base import etcd_store as _etcd
from ..base import netif
from ..base import sealed_store as _sealed
from ..base import secret as _secret
from ..errors import InvalidArgument, PyBridgeError


class TcpStore:
    """The TCPStore of node 0's launcher at host:port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, int(port)

    @property
    def gloo_host(self) -> Optional[str]:
        """An address the job's traffic goes to (gloo listens on loopback when it is one)."""
        return self.host

    def describe(self) -> str:
        return f"the store at {self.host}:{self.port} (hosted by pybridge-launch --elastic on node 0)"

    def worker_env(self) -> dict[str, str]:
        """What a launcher's workers are told to find the store by."""
        return {"MASTER_ADDR": self.host, "MASTER_PORT": str(self.port)}

    def serve(self) -> Any:
        """Host the store (node 0's launcher), listening on its address only (loopback for a
        single-node job); the hosting client, sealed. The server lives as long as this object."""
        fd = netif.listener(self.host, self.port).detach()
        self._server = dist.TCPStore(  # type: ignore[attr-defined]  # (not in torch.distributed's __all__)
            self.host, self.port, None, True, datetime.timedelta(seconds=60), wait_for_workers=False,
            multi_tenant=True, master_listen_fd=fd)
        return _sealed.protect(self._server, _secret.job_secret())

    def connect(self, timeout: float, prefix: str = "") -> Any:
        """A client of its own (a TCPStore client serializes its calls), sealed, keys under `prefix`."""
        client = dist.TCPStore(  # type: ignore[attr-defined]  # (not in torch.distributed's __all__)
            self.host, self.port, None, False, datetime.timedelta(seconds=timeout), wait_for_workers=False)
        key = _secret.job_secret()
        if key is None and not netif.is_loopback(self.host):
            _secret.warn_unprotected(f"the elastic store at {self.host}:{self.port}")
        return _sealed.protect(client, key, prefix)


class EtcdStore:
    """The folder /pybridge/<job>/elastic of the etcd cluster `settings` (the job id made
    unguessable from the job secret where there is one, as init's is)."""

    def __init__(self, settings: Any, job: str) -> None:
        self.settings, self.job = settings, job
        self.root = f"{_etcd.ROOT}/{_etcd.run_name(settings, job)}/elastic"
        # torch holds a Python store only by a C++ pointer: each one handed out is kept here,
        # or its methods would be gone once the caller's reference is ("Not implemented").
        self._kept: list[Any] = []

    @property
    def gloo_host(self) -> Optional[str]:
        return "127.0.0.1" if self.settings.on_loopback() else None

    def describe(self) -> str:
        return f"{self.settings.describe()} (elastic job {self.job!r})"

    def worker_env(self) -> dict[str, str]:
        """Nothing: a launcher's workers find etcd by PYBRIDGE_RDZV_*, which it already set."""
        return {}

    def connect(self, timeout: float, prefix: str = "") -> Any:
        try:
            raw = _etcd.store(_etcd.connect(self.settings, timeout), self.root, timeout)
        except PyBridgeError:
            raise
        except Exception as exc:  # noqa: BLE001 - python-etcd's own errors: named, typed
            raise _etcd.error(self.settings, exc) from exc
        self._kept.append(raw)
        return _sealed.protect(raw, _secret.job_secret(), prefix)

    def remove(self) -> None:
        """Remove the job's folder (a job on one node, once it ended). Never raises."""
        try:
            _etcd.connect(self.settings, _etcd.LEAVE_SECONDS).delete(self.root, recursive=True, dir=True)
        except Exception:  # noqa: BLE001 - the job is over: a folder left behind only holds its keys
            pass


def from_environment(store_addr: Optional[str] = None,
                     environ: Optional[Mapping[str, str]] = None) -> Union[TcpStore, EtcdStore]:
    """The elastic store of this process: `store_addr` ("host:port"), else etcd when
    PYBRIDGE_RDZV_BACKEND=etcd (pybridge-launch --elastic --rdzv-backend etcd sets it), else
    the launcher's TCPStore at MASTER_ADDR:MASTER_PORT."""
    env = os.environ if environ is None else environ
    if store_addr is None:
        endpoint = _etcd.selected(environ=env)
        if endpoint is not None:
            return EtcdStore(_etcd.settings(endpoint, None, env), _etcd.job_id(None, env))
        if not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
            raise InvalidArgument("an elastic job needs the launcher's store: run under pybridge-launch "
                                  "--elastic (MASTER_ADDR, MASTER_PORT; or PYBRIDGE_RDZV_BACKEND=etcd with "
                                  "PYBRIDGE_RDZV_ENDPOINT) or give the store's address (host:port)")
        store_addr = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    host, _, port_text = str(store_addr).rpartition(":")
    return TcpStore(host, _port(port_text, store_addr))


def _port(text: str, whole: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise InvalidArgument(f"elastic store address {whole!r}: expected host:port")
    return port
