"""The job's store in etcd: torch's own EtcdStore over the python-etcd client (etcd's v2 API),
with what pybridge needs beside it.

etcd is replicated by Raft: with three members any one may die and the store goes on. The
pieces here, each kept small:

  * `Settings`: the endpoints ("h1:2379,h2:2379,h3:2379", http:// or https://) and etcd's
    own TLS and authentication (CA, client certificate and key, user and password), from
    init's arguments or the PYBRIDGE_RDZV_* / PYBRIDGE_ETCD_* variables; a bad one is an
    InvalidArgument naming it.
  * `_Client`: python-etcd's client, told to try every endpoint in turn when one does not
    answer (python-etcd alone gives up on a member for good once it failed), with urllib3's
    own retries off (it retried a read timeout three times on the same dead member) and a
    request that keeps failing retried until the store's timeout, then a Timeout naming the
    store, the endpoints and what was asked.
  * `EtcdStore`: torch's, plus the calls torch's lacks and pybridge uses (compare_set,
    delete_key, multi_get/multi_set, num_keys); add(key, 0), the watchdog's poll, is a
    read, not a write through Raft.
  * `open_world`: the store of one attempt of one job, under /pybridge/<run>/<attempt>/:
    each rank claims its rank there first (a second job with the same id is refused by name
    instead of reading the first one's keys), and the last rank to leave removes the folder.

etcd 3.4 and 3.5 serve the v2 API with `--enable-v2`; 3.6 has dropped it (docs/elastic.md).
"""

import datetime
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass

from ..errors import CommError, InvalidArgument, PyBridgeError, Timeout
from . import netif
from .secret import _bytes

DEFAULT_PORT = 2379
ROOT = "/pybridge"
REQUEST_SECONDS = 2.0  # one request to one member; a member slower than this is tried again later
RETRY_SECONDS = 0.1  # between rounds over the members while none answers
LEAVE_SECONDS = 2.0  # finalize's clean-up is given this long, then left to etcd's operator

BACKENDS = ("etcd", "etcd-v2")  # torchrun's names for the backends over etcd
DEFAULT_BACKENDS = ("", "c10d", "static", "tcp", "env")  # the TCPStore (the default)
ENV_BACKEND = "PYBRIDGE_RDZV_BACKEND"
ENV_ENDPOINT = "PYBRIDGE_RDZV_ENDPOINT"
ENV_ID = "PYBRIDGE_RDZV_ID"
# etcd's TLS and authentication: init's rdzv_conf keys, and the variables read when absent
CONF_ENV = {"cacert": "PYBRIDGE_ETCD_CACERT", "cert": "PYBRIDGE_ETCD_CERT", "key": "PYBRIDGE_ETCD_KEY",
            "user": "PYBRIDGE_ETCD_USER", "password": "PYBRIDGE_ETCD_PASSWORD"}
_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


class EtcdUnavailable(Timeout):
    """No member of the etcd cluster answered within the store's timeout (dead, cut off, or
    without a quorum)."""


def _client_module():
    try:
        import etcd  # python-etcd
    except ImportError:
        raise InvalidArgument("the etcd rendezvous needs the python-etcd package: pip install python-etcd "
                              "(or pybridge[etcd])") from None
    return etcd


# ---- settings ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    endpoints: tuple  # ((host, port), ...)
    protocol: str = "http"
    cacert: str = None
    cert: str = None
    key: str = None
    user: str = None
    password: str = None

    def describe(self):
        """'the etcd store at 127.0.0.1:2379,127.0.0.1:2381' (as given, scheme if https)."""
        hosts = ",".join(_hostport(h, p) for h, p in self.endpoints)
        return f"the etcd store at {'https://' if self.protocol == 'https' else ''}{hosts}"

    def on_loopback(self):
        """Every member on this machine's loopback: a job on one machine."""
        return all(netif.is_loopback(h) for h, _ in self.endpoints)


def run_name(s, job):
    """A job's name in etcd: `job`, made unguessable from the job secret when there is one,
    as torchrun's run id is here; without one, members others can reach with no TLS client
    certificate or user are named in a warning."""
    from . import secret as _secret
    key = _secret.job_secret()
    if key is None and not (s.user or s.cert) and not s.on_loopback():
        _secret.warn_unprotected(s.describe())
    return job if key is None else _secret.run_id(key, job)


def _hostport(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_endpoints(text, what="rdzv_endpoint"):
    """(protocol, ((host, port), ...)) of "h1:2379,h2:2379" (a port may be left out: 2379;
    http:// or https:// before each, all alike; IPv6 as [::1]:2379). InvalidArgument naming
    the bad piece otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgument(f"{what} must list the etcd members as HOST:PORT,HOST:PORT,..., got {text!r}")
    out, schemes = [], set()
    for raw in text.split(","):
        item = raw.strip()
        m = re.fullmatch(r"(?:(https?)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(\d{1,5}))?/?", item)
        if not item or not m:
            raise InvalidArgument(f"{what} {text!r}: {item!r} is not HOST:PORT (an etcd member's client address, "
                                  "e.g. 10.0.0.1:2379 or https://etcd1:2379)")
        scheme, host, port = m.groups()
        port = DEFAULT_PORT if port is None else int(port)
        if not 0 < port < 65536:
            raise InvalidArgument(f"{what} {text!r}: port {port} of {item!r} is not in 1..65535")
        schemes.add(scheme or "")
        out.append((host.strip("[]"), port))
    if {"http", "https"} <= schemes or ("https" in schemes and "" in schemes):
        raise InvalidArgument(f"{what} {text!r}: give every member the same scheme (all https:// or none)")
    if len(set(out)) != len(out):
        raise InvalidArgument(f"{what} {text!r} names a member twice")
    return ("https" if "https" in schemes else "http"), tuple(out)


def settings(endpoint, conf=None, environ=None):
    """Settings from an endpoint list and rdzv_conf (a dict, or "key=value,key=value"), the
    keys it lacks read from PYBRIDGE_ETCD_CACERT, _CERT, _KEY, _USER and _PASSWORD."""
    env = os.environ if environ is None else environ
    conf = _conf(conf)
    protocol, endpoints = parse_endpoints(endpoint)
    got = {k: conf.get(k) or env.get(v) or None for k, v in CONF_ENV.items()}
    for k in ("cacert", "cert", "key"):
        if got[k] and not os.path.isfile(got[k]):
            raise InvalidArgument(f"etcd {k} {got[k]!r} (rdzv_conf {k}= or {CONF_ENV[k]}): no such file")
    if got["key"] and not got["cert"]:
        raise InvalidArgument(f"etcd client key given without its certificate (cert=, {CONF_ENV['cert']})")
    if bool(got["user"]) != bool(got["password"]):
        raise InvalidArgument("etcd authentication needs both user and password "
                              f"({CONF_ENV['user']} and {CONF_ENV['password']})")
    if protocol == "http" and (got["cacert"] or got["cert"]):
        protocol = "https"  # TLS settings given: the members are spoken to over TLS
    return Settings(endpoints, protocol, **got)


def conf(conf):
    """rdzv_conf as a dict of known keys (InvalidArgument naming a bad one)."""
    return _conf(conf)


def _conf(conf):
    if conf is None or conf == "":
        return {}
    if isinstance(conf, str):
        pairs = [p for p in conf.split(",") if p.strip()]
        bad = [p for p in pairs if "=" not in p]
        if bad:
            raise InvalidArgument(f"rdzv_conf {conf!r}: {bad[0]!r} is not KEY=VALUE")
        conf = dict(p.strip().split("=", 1) for p in pairs)
    if not isinstance(conf, dict):
        raise InvalidArgument(f"rdzv_conf must be a dict or 'key=value,...', got {type(conf).__name__}")
    unknown = sorted(set(conf) - set(CONF_ENV))
    if unknown:
        raise InvalidArgument(f"rdzv_conf: unknown key(s) {', '.join(unknown)}; known: {', '.join(CONF_ENV)}")
    return {k: str(v) for k, v in conf.items()}


def selected(backend=None, endpoint=None, environ=None):
    """The backend init uses: None for the TCPStore (the default), or the endpoint list for
    etcd. From init's arguments, else PYBRIDGE_RDZV_BACKEND and PYBRIDGE_RDZV_ENDPOINT."""
    env = os.environ if environ is None else environ
    name = backend if backend is not None else env.get(ENV_BACKEND, "")
    where = "rdzv_backend" if backend is not None else ENV_BACKEND
    name = str(name).strip().lower()
    if name in DEFAULT_BACKENDS:
        if endpoint:
            raise InvalidArgument(f"rdzv_endpoint {endpoint!r} given without rdzv_backend='etcd'")
        return None
    if name not in BACKENDS:
        raise InvalidArgument(f"{where} {name!r} is not known: use 'etcd' (or leave it out for the TCPStore, "
                              "hosted by rank 0)")
    endpoint = endpoint if endpoint is not None else env.get(ENV_ENDPOINT)
    if not endpoint:
        raise InvalidArgument(f"the etcd rendezvous needs the members' addresses: rdzv_endpoint= or {ENV_ENDPOINT} "
                              "(HOST:PORT,HOST:PORT,...)")
    return endpoint


def job_id(given=None, environ=None):
    """The job's id in etcd, the same on every rank and another for every job: rdzv_id, else
    PYBRIDGE_RDZV_ID, else torchrun's TORCHELASTIC_RUN_ID, else SLURM's job and step ids.
    InvalidArgument when nothing gives one: two jobs on one etcd must not share keys."""
    env = os.environ if environ is None else environ
    for value, source in ((given, "rdzv_id"), (env.get(ENV_ID), ENV_ID),
                          (env.get("TORCHELASTIC_RUN_ID"), "TORCHELASTIC_RUN_ID")):
        if value and value != "none":  # torchrun's default id is "none": shared by every job
            if not _ID.fullmatch(str(value)):
                raise InvalidArgument(f"{source} {value!r}: an etcd job id is 1-128 letters, digits, '.', '_' or '-'")
            return str(value)
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    raise InvalidArgument(f"the etcd rendezvous needs the job's id, the same on every rank and unique to the job: "
                          f"rdzv_id= or {ENV_ID} (pybridge-launch --rdzv-id)")


# ---- the client ----------------------------------------------------------------------------

def connect(s, timeout):
    """A python-etcd client over every endpoint of `s`, patient for `timeout` seconds."""
    return _client_class()(s, timeout)


_CLASS = None


def _client_class():
    """_Client, defined on first use (python-etcd is imported only for an etcd job)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    etcd = _client_module()
    import logging
    import urllib3
    # python-etcd logs every failed request at ERROR, which a program without logging set
    # up prints on stderr: a member's death is the store's business, said once when it matters.
    logging.getLogger("etcd").addHandler(logging.NullHandler())

    # What is worth asking again: no answer from any member, or a member that had no leader.
    # Answers about keys (not found, exists, compare failed) and a watch's end are not.
    def transient(exc):
        if isinstance(exc, etcd.EtcdWatchTimedOut) or _tls_failure(exc):
            return False
        if isinstance(exc, (etcd.EtcdConnectionFailed, etcd.EtcdLeaderElectionInProgress)):
            return True
        status = (exc.payload or {}).get("status") if type(exc) is etcd.EtcdException else None
        return isinstance(status, int) and status >= 500

    class _Client(etcd.Client):
        last_good = {}  # endpoints -> the member that last answered a request of this process

        def __init__(self, s, timeout):
            self.settings = s
            self.patience = float(timeout)
            self._urls = [f"{s.protocol}://{_hostport(h, p)}" for h, p in s.endpoints]
            self._failed = 0
            cert = (s.cert, s.key) if s.cert and s.key else s.cert
            super().__init__(host=tuple(s.endpoints), protocol=s.protocol, allow_reconnect=True, use_proxies=True,
                             read_timeout=min(REQUEST_SECONDS, self.patience), cert=cert, ca_cert=s.cacert,
                             username=s.user, password=s.password)
            # The member that answered this process last (python-etcd's own first choice would
            # lack an IPv6 address's brackets): a new client (each elastic world makes some)
            # does not wait again on a member found dead.
            key = tuple(self._urls)
            if key not in _Client.last_good:  # first a member on this machine: it is gone only if we are
                _Client.last_good[key] = self._urls[_own_member(s.endpoints)]
            self._base_uri = _Client.last_good[key]
            # urllib3 would retry a timed-out PUT on the same member three times: one try
            # per member, then the next member.
            self.http.connection_pool_kw["retries"] = urllib3.Retry(total=None, connect=0, read=0, status=0,
                                                                      other=0, redirect=5)

        def _next_server(self, cause=None):
            # Every endpoint, in turn, however often members fail over the job's life
            # (python-etcd's own list only shrinks); one round per request.
            self._errors[self._base_uri] = _short(cause)
            self._failed += 1
            if self._failed >= len(self._urls):
                raise etcd.EtcdConnectionFailed("no etcd member answered", cause=cause)
            at = self._urls.index(self._base_uri) if self._base_uri in self._urls else -1
            return self._urls[(at + 1) % len(self._urls)]

        def api_execute(self, path, method, params=None, timeout=None):
            deadline = time.monotonic() + self.patience
            self._errors = {}
            while True:
                self._failed = 0
                self._base_uri = _Client.last_good.get(tuple(self._urls), self._base_uri)  # another client's luck
                try:
                    answer = super().api_execute(path, method, params=params, timeout=timeout)
                    _Client.last_good[tuple(self._urls)] = self._base_uri
                    return answer
                except etcd.EtcdException as exc:
                    if not transient(exc):
                        raise
                    if not isinstance(exc, etcd.EtcdConnectionFailed):  # an answer: no leader, no quorum
                        self._errors[self._base_uri] = _short(exc)
                    if time.monotonic() + RETRY_SECONDS >= deadline:
                        seen = "; ".join(f"{u.split('://')[-1]}: {e}" for u, e in self._errors.items())
                        raise EtcdUnavailable(
                            f"{self.settings.describe()} did not answer {_what(method, path, params)} within "
                            f"{self.patience:g} s: no member answered, or none had a quorum (is a majority of "
                            f"the members down?); last seen: {seen}") from None
                    time.sleep(RETRY_SECONDS)

    _CLASS = _Client
    return _CLASS


def _own_member(endpoints):
    """The index of the first member whose address is one of this machine's (not loopback:
    then every member is), else 0."""
    for i, (host, _) in enumerate(endpoints):
        try:
            ip = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
            if not ip.startswith("127.") and netif.local_address_towards(ip) == ip:
                return i
        except OSError:
            continue
    return 0


def _tls_failure(exc):
    import ssl
    import urllib3
    cause = getattr(exc, "cause", None)
    return isinstance(cause, (ssl.SSLError, urllib3.exceptions.SSLError)) or \
        isinstance(getattr(cause, "reason", None), (ssl.SSLError, urllib3.exceptions.SSLError))


def error(s, exc):
    """A PyBridgeError naming the store for an exception of python-etcd (or urllib3)."""
    etcd = _client_module()
    if isinstance(exc, etcd.EtcdInsufficientPermissions):
        return InvalidArgument(f"{s.describe()} refused the request: permission denied for "
                               f"{'user ' + repr(s.user) if s.user else 'a client without a user'} (etcd's "
                               f"authentication: rdzv_conf user=, password= or {CONF_ENV['user']}, "
                               f"{CONF_ENV['password']}): {_reason(exc)}")
    if _tls_failure(exc):
        return InvalidArgument(f"{s.describe()}: the TLS handshake failed (rdzv_conf cacert=, cert=, key= or "
                               f"{CONF_ENV['cacert']}, {CONF_ENV['cert']}, {CONF_ENV['key']}): {_reason(exc)}")
    return CommError(f"{s.describe()}: {type(exc).__name__}: {_reason(exc)}")


def _short(exc):
    """'connection refused', 'no answer in time', ...: one member's failure, for a message."""
    import urllib3
    reason = getattr(exc, "reason", None) or getattr(exc, "cause", None) or exc
    reason = getattr(reason, "reason", None) or reason
    if isinstance(reason, urllib3.exceptions.ReadTimeoutError):
        return "no answer in time"
    text = str(reason)
    text = re.sub(r"^\w*Connection\w*\([^)]*\): ", "", text)
    text = re.sub(r"^Failed to establish a new connection: (\[Errno \d+\] )?", "", text)
    return text.replace("\n", " ")[:160].lower() or type(reason).__name__


def _what(method, path, params):
    path = path.removeprefix("/v2/keys")
    if isinstance(params, dict) and params.get("wait") == "true":
        return f"a watch of {path}"
    return {"GET": "a read of", "PUT": "a write of", "POST": "a write under", "DELETE": "a delete of"}.get(
        method, method) + f" {path}"


def _reason(exc):
    cause = getattr(exc, "cause", None)
    text = str(exc) if cause is None else f"{exc} ({cause})"
    return text.replace("\n", " ")[:300]


# ---- the store -----------------------------------------------------------------------------

def _store_class():
    from torch.distributed.elastic.rendezvous import etcd_store as _torch
    etcd = _client_module()

    class EtcdStore(_torch.EtcdStore):
        """torch's EtcdStore with the calls pybridge also uses; every value base64 as torch's."""

        def __init__(self, client, prefix, timeout):
            super().__init__(client, prefix, datetime.timedelta(seconds=timeout))

        def set_timeout(self, timeout):
            super().set_timeout(timeout)
            self.client.patience = max(timeout.total_seconds(), REQUEST_SECONDS)

        def _path(self, key):
            return self.prefix + self._encode(key)

        # torch's get, check and wait read the job's whole folder on each call (then watch
        # it): a key that is there is read alone first, so a call costs one small read.
        def _present(self, keys):
            try:
                return [self._decode(self.client.get(self._path(k)).value) for k in keys]
            except etcd.EtcdKeyNotFound:
                return None

        def get(self, key):
            found = self._present([key])
            return found[0] if found is not None else super().get(key)

        def check(self, keys):
            return self._present(keys) is not None

        def wait(self, keys, override_timeout=None):
            if self._present(keys) is None:
                super().wait(keys, override_timeout)

        def add(self, key, amount):
            if int(amount) == 0:  # a read: the watchdog polls this every quarter second
                try:
                    return int(self._decode(self.client.get(self._path(key)).value))
                except etcd.EtcdKeyNotFound:
                    return 0
            return super().add(key, int(amount))

        def compare_set(self, key, expected, desired):
            path = self._path(key)
            expected, desired = _bytes(expected), _bytes(desired)
            try:
                if expected == b"":
                    self.client.write(path, self._encode(desired), prevExist=False)
                else:
                    self.client.test_and_set(path, self._encode(desired), self._encode(expected))
                return desired
            except etcd.EtcdAlreadyExist:
                pass
            except etcd.EtcdKeyNotFound:
                return expected  # torch's rule: a missing key returns `expected`, unset
            except etcd.EtcdCompareFailed:
                pass
            try:
                return self._decode(self.client.get(path).value)
            except etcd.EtcdKeyNotFound:
                return expected

        def delete_key(self, key):
            try:
                self.client.delete(self._path(key))
                return True
            except etcd.EtcdKeyNotFound:
                return False

        def multi_get(self, keys):
            return [self.get(k) for k in keys]

        def multi_set(self, keys, values):
            for k, v in zip(keys, values):
                self.set(k, v)

        def num_keys(self):
            try:
                return sum(1 for n in self.client.get(self.prefix).children if n.key and not n.dir)
            except etcd.EtcdKeyNotFound:
                return 0

    return EtcdStore


def store(client, prefix, timeout):
    """An EtcdStore at `prefix` (a folder of its own) through `client`."""
    return _store_class()(client, prefix, timeout)


class World:
    """One attempt of one job in etcd: its store (unsealed; rendezvous.py seals it), a second
    store for the watchdog's thread, and leave() for finalize."""

    def __init__(self, s, run, attempt, rank, world_size, timeout):
        self.settings, self.rank, self.world_size, self.timeout = s, rank, world_size, timeout
        self.root = f"{ROOT}/{run}/{attempt}"
        self.client = connect(s, timeout)
        self._claim()
        self.store = self._store(self.client)

    def _store(self, client):
        return store(client, f"{self.root}/kv", self.timeout)

    def another(self):
        """The same store through a client of its own (a thread that must not queue behind
        another's blocking wait)."""
        return self._store(connect(self.settings, self.timeout))

    def _claim(self):
        """Create <root>/ranks/<rank>, or refuse: a job with the same id and attempt holds it."""
        etcd = _client_module()
        mine = uuid.uuid4().hex  # nothing about this process: the folder is readable without the secret
        path = f"{self.root}/ranks/{self.rank}"
        try:
            self.client.write(path, mine, prevExist=False)
            return
        except etcd.EtcdAlreadyExist:
            pass
        held = self.client.get(path).value
        if held == mine:  # our own write, whose answer was lost and which was asked again
            return
        raise InvalidArgument(
            f"{self.settings.describe()} already holds rank {self.rank} of this job ({self.root}, claimed "
            f"by another process): another job runs with the same id, or one with it ended without "
            f"finalize; give this job another id (rdzv_id=, {ENV_ID}, pybridge-launch --rdzv-id) or remove "
            f"{self.root} from etcd")

    def leave(self):
        """Count this rank out; the last one removes the job's folder. Never raises: the job
        is over, and a folder left behind only holds its id."""
        etcd = _client_module()
        try:
            self.client.patience = LEAVE_SECONDS
            left = self.store.add("pybridge/left", 1)
            if left >= self.world_size:
                self.client.delete(self.root, recursive=True, dir=True)
                self.client.delete(self.root.rsplit("/", 1)[0], dir=True)  # the job's, once no attempt is left
        except etcd.EtcdDirNotEmpty:
            pass  # a folder of another attempt (one that crashed) is still there
        except (etcd.EtcdException, PyBridgeError, OSError):
            pass


_worlds = {}  # (job, attempt): the worlds this process has opened in it


def open_world(s, run, attempt, rank, world_size, timeout):
    """The World of `rank` in attempt `attempt` of job `run` (already made unguessable by the
    caller where there is a secret). A process's second world in the same attempt (init
    after finalize, with the same id) gets the folder <attempt>.1, its third <attempt>.2:
    every rank makes the same worlds in the same order, and the ranks still leaving the
    previous world need not be waited for."""
    if not _ID.fullmatch(str(run)):
        raise InvalidArgument(f"etcd job id {run!r}: 1-128 letters, digits, '.', '_' or '-'")
    n = _worlds.get((run, int(attempt)), 0)
    world = World(s, run, f"{int(attempt)}" + (f".{n}" if n else ""), rank, world_size, timeout)
    _worlds[(run, int(attempt))] = n + 1
    return world
