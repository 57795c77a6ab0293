"""SealedStore: a torch.distributed Store whose keys and values only the holders of the job
secret can read or write (the scheme: base/secret.py)."""

import torch.distributed as dist

from .secret import Seal, _bytes


class SealedStore(dist.Store):
    """A torch.distributed Store over `inner` whose keys and values only holders of the
    secret can read or write (see base/secret.py), its keys under `prefix` (as
    PrefixStore(prefix, inner) would put them, but hidden in the opaque names). Usable
    wherever torch takes a store: PrefixStore, ProcessGroupGloo, init_process_group,
    torchrun's rendezvous."""

    def __init__(self, inner, secret, prefix=""):
        super().__init__()
        self.inner = inner
        self.seal = Seal(secret, prefix)
        self._made_with = (secret, prefix)

    def clone(self):
        """The same sealed view over a connection of its own (the inner store's clone), as
        torch's Store.clone: for waits that must not hold up this store's other callers."""
        return SealedStore(self.inner.clone(), *self._made_with)

    # values
    def set(self, key, value):
        self.inner.set(self.seal.name(key), self.seal.seal(key, value))

    def get(self, key):
        return self.seal.open(key, self.inner.get(self.seal.name(key)))

    def multi_get(self, keys):
        raws = self.inner.multi_get([self.seal.name(k) for k in keys])
        return [self.seal.open(k, r) for k, r in zip(keys, raws)]

    def multi_set(self, keys, values):
        self.inner.multi_set([self.seal.name(k) for k in keys],
                             [self.seal.seal(k, v) for k, v in zip(keys, values)])

    def compare_set(self, key, expected, desired):
        """As Store.compare_set, on opened values: `expected` is compared with the opened
        current value (b"" for a missing key); returns the opened value now stored. The
        swap itself is the server's, on the exact stored bytes: still atomic."""
        name, expected = self.seal.name(key), _bytes(expected)
        new = self.seal.seal(key, desired)
        if self.inner.check([name]):
            raw = self.inner.get(name)
            if self.seal.open(key, raw) != expected:
                return self.seal.open(key, raw)
            raw_expected = raw
        else:
            if expected:
                return expected  # torch's own rule: a missing key returns `expected`
            raw_expected = b""
        return self.seal.open(key, self.inner.compare_set(name, raw_expected, new))

    # counters and keys (plain: the server adds)
    def add(self, key, amount):
        return self.inner.add(self.seal.name(key), amount)

    def check(self, keys):
        return self.inner.check([self.seal.name(k) for k in keys])

    def wait(self, keys, timeout=None):
        names = [self.seal.name(k) for k in keys]
        return self.inner.wait(names) if timeout is None else self.inner.wait(names, timeout)

    def delete_key(self, key):
        return self.inner.delete_key(self.seal.name(key))

    def num_keys(self):
        return self.inner.num_keys()

    def set_timeout(self, timeout):
        return self.inner.set_timeout(timeout)

    @property
    def timeout(self):
        return self.inner.timeout

    def has_extended_api(self):
        return True


def protect(store, secret, prefix=""):
    """`store` sealed with `secret` (keys under `prefix`, as PrefixStore(prefix, store) would
    put them), or without a secret `store` itself (PrefixStore(prefix, store) for a prefix).

    The sealed store is a Python object that torch holds only by a C++ pointer once handed
    over: whoever hands it to torch keeps a Python reference for as long as torch uses it
    (pybridge.init keeps it on the world group); else its methods are lost ("Not implemented")."""
    if secret is None:
        return dist.PrefixStore(prefix, store) if prefix else store
    return SealedStore(store, secret, prefix)
