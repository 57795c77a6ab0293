"""The job secret, and a store that only the holders of it can read or change
(docs/security.md says what it protects and what not).

torch's TCPStore authenticates nobody: any process that reaches its port can list every
key (list_keys), read every value and write any. A job that has a secret (PYBRIDGE_SECRET,
or a file named by PYBRIDGE_SECRET_FILE; pybridge-launch makes one for a single-node job and
hands it to its workers) talks to its store through SealedStore (base/sealed_store.py; this module imports no torch,
so that the launcher's command line stays light):

  * key names are replaced by HMAC-SHA256(secret, name): an outsider sees opaque names and
    cannot tell which key is which, nor address one it has not seen;
  * every value is sealed: encrypted (XOR with a keystream of SHAKE256 over a derived key
    and a random 16-byte nonce) and then authenticated (HMAC-SHA256 over the key's name,
    the nonce and the ciphertext). A value that does not open with the secret (written by an
    outsider, or moved from another key) is refused with CorruptData naming the key.

Counters (Store.add) stay plain: the server adds to them, so they cannot be sealed. An
outsider can bump one (under its opaque name) or delete keys: that can stall or fail a job
(denial of service), never steer it, since every decision is taken from sealed values.
"""

import hashlib
import hmac
import os
import secrets
import warnings

from ..errors import CorruptData, InvalidArgument

ENV = "PYBRIDGE_SECRET"
ENV_FILE = "PYBRIDGE_SECRET_FILE"
NONCE = 16
TAG = 32
MIN_LENGTH = 16  # characters: a shorter secret is refused (it could be guessed)


def job_secret(environ=None):
    """The job's secret as bytes (PYBRIDGE_SECRET, else the contents of PYBRIDGE_SECRET_FILE
    with surrounding white space removed), or None when neither is set."""
    env = os.environ if environ is None else environ
    raw, where = env.get(ENV), ENV
    if not raw and env.get(ENV_FILE):
        path = env[ENV_FILE]
        try:
            with open(path, "rb") as f:
                raw = f.read().strip()
        except OSError as exc:
            raise InvalidArgument(f"{ENV_FILE}={path}: cannot read the job secret ({exc.strerror or exc})") from None
        where = f"{ENV_FILE} ({path})"
    if not raw:
        return None
    raw = raw.encode() if isinstance(raw, str) else raw
    if len(raw) < MIN_LENGTH:
        raise InvalidArgument(f"the job secret from {where} has {len(raw)} characters; use at least {MIN_LENGTH} "
                              "(pybridge-launch makes one: python -c 'import secrets; print(secrets.token_hex(32))')")
    return raw


def generate():
    """A new secret (64 hex characters)."""
    return secrets.token_hex(32)


def derive(secret, purpose):
    """A key for one purpose, from the secret (HMAC-SHA256(secret, purpose))."""
    return hmac.new(secret, purpose.encode(), hashlib.sha256).digest()


def run_id(secret, name):
    """An unguessable rendezvous id for `name` (torchrun's run id)."""
    return f"{name}-{derive(secret, 'pybridge rendezvous ' + name).hex()[:32]}"


def _keystream_xor(key, nonce, data):
    """`data` XOR the keystream SHAKE256(key, nonce): SHA-3's extendable output with a secret
    prefix is a pseudo-random function (no length extension, as KMAC relies on)."""
    if not data:
        return b""
    pad = hashlib.shake_256(key + nonce).digest(len(data))
    return (int.from_bytes(data, "little") ^ int.from_bytes(pad, "little")).to_bytes(len(data), "little")


def _bytes(value):
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list):  # torch hands some values over as lists of ints
        return bytes(value)
    raise InvalidArgument(f"a store value must be str or bytes, got {type(value).__name__}")


class Seal:
    """Sealing and opening of values, and the opaque names of keys, under one secret."""

    def __init__(self, secret, prefix=""):
        self._names = derive(secret, "pybridge store key names")
        self._enc = derive(secret, "pybridge store encryption")
        self._mac = derive(secret, "pybridge store authentication")
        self.prefix = f"{prefix}/" if prefix else ""  # as PrefixStore's, but hidden in the name

    def name(self, key):
        return "pb/" + hmac.new(self._names, (self.prefix + key).encode(), hashlib.sha256).hexdigest()[:40]

    def seal(self, key, value):
        nonce = os.urandom(NONCE)
        body = _keystream_xor(self._enc, nonce, _bytes(value))
        tag = hmac.new(self._mac, (self.prefix + key).encode() + b"\0" + nonce + body, hashlib.sha256).digest()
        return nonce + body + tag

    def open(self, key, raw):
        raw = _bytes(raw)
        if len(raw) >= NONCE + TAG:
            nonce, body, tag = raw[:NONCE], raw[NONCE:-TAG], raw[-TAG:]
            want = hmac.new(self._mac, (self.prefix + key).encode() + b"\0" + nonce + body, hashlib.sha256).digest()
            if hmac.compare_digest(tag, want):
                return _keystream_xor(self._enc, nonce, body)
        raise CorruptData(f"store key {key!r}: the value is not sealed with this job's secret (written by a "
                          "process outside the job, or by one with another PYBRIDGE_SECRET); ignored")


_warned = set()


def warn_unprotected(where):
    """Once per place: the job's store is open to anyone who reaches its port."""
    if where in _warned:
        return
    _warned.add(where)
    warnings.warn(f"{where}: no job secret ({ENV} or {ENV_FILE}): any process that reaches the store's port "
                  "can read and change the job's state (membership, rendezvous). Give every process of a "
                  "multi-node job the same secret (docs/launcher.md, 'The job secret')", stacklevel=3)
