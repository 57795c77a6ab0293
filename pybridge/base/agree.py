"""Do all ranks agree? One comparison for every "each rank must pass the same thing" check.

Every rank contributes a small row (a collective's fingerprint in checked mode, the
reducer's parameters and options, broadcast_parameters' tensors, a dynamic loader's
dataset, the world size at init); check() compares the rows and raises InvalidArgument
naming the ranks that differ from the others and how. Every rank sees the same rows, so
every rank raises the same error and none is left waiting.

Two transports gather the rows, because some checks cannot issue a collective:
- collectives.agree(row, what, group=...): an all_gather of a row of integers, for checks
  that sit in the group's stream of collectives (every member calls them in order);
- in_store() here: through the rendezvous store, for a dynamic loader's open (a
  data-loading call, not a collective: it must not take a place in the group's collective
  order, which training threads share). The roster at init (comm/roster.py: no process
  group exists yet) gathers its entries through the store itself, naming the ranks that
  never joined, and compares them with check().
"""

import hashlib
import json
import time

from ..errors import InvalidArgument, PyBridgeError, Timeout, classify


def who(ranks):
    """'rank 1' or 'ranks [0, 2]'."""
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def check(what, rows, *, describe=str, fields=None, hint=""):
    """Raise InvalidArgument unless every rank's row is the same.

    rows: the rows by rank (a list, or a dict rank -> row holding the ranks heard from).
    The message is "{what}: " then each distinct row once, in rank order, as
    "{ranks} {describe(row)}"; rows that differ from the reference (the most common row,
    the lowest rank's on a tie) add "({fields} differs)" when `fields` names the row's
    items. `hint` ends the message (what to do about it)."""
    items = sorted(rows.items()) if isinstance(rows, dict) else list(enumerate(rows))
    by = {}
    for r, row in items:
        by.setdefault(_hashable(row), []).append(r)
    if len(by) <= 1:
        return
    reference = min(by, key=lambda row: (-len(by[row]), by[row][0]))
    parts = []
    for row, ranks in sorted(by.items(), key=lambda kv: kv[1][0]):
        text = f"{who(ranks)} {describe(row)}"
        if fields is not None and row != reference:
            names = [f for f, a, b in zip(fields, row, reference) if a != b]
            text += f" ({', '.join(names)} differs)"
        parts.append(text)
    raise InvalidArgument(f"{what}: {'; '.join(parts)}{hint}")


def _hashable(row):
    return tuple(row) if isinstance(row, list) else row


def signature(items):
    """A 56-bit hash of a list (e.g. of (dtype, count) pairs), the same on every rank:
    fits a row of int64s, so long lists can be compared in one small message."""
    digest = hashlib.sha256(repr(items).encode()).digest()
    return int.from_bytes(digest[:7], "little")


def in_store(store, key, rank, size, row, *, timeout, what, cancel=None, **how):
    """Publish `row` (plain data: numbers, strings, lists) under key/rank, wait up to
    `timeout` seconds for every rank's, and check() them (`how`: its keyword arguments).
    A one-off exchange: `key` must be new for each use, the same on every rank. `cancel`,
    called while waiting, may raise to end the wait (a group that was aborted)."""
    try:
        store.set(f"{key}/{rank}", json.dumps(row))
        keys = [f"{key}/{r}" for r in range(size)]
        deadline = time.monotonic() + timeout
        while not store.check(keys):
            if time.monotonic() > deadline:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise Timeout(f"{what}: ranks {missing} did not take part within {timeout:g} s")
            if cancel is not None:
                cancel()
            time.sleep(0.01)
        rows = [json.loads(store.get(k)) for k in keys]
    except PyBridgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the store failing (its host gone) is a pybridge error
        raise classify(exc) from exc
    check(what, [_hashable(r) for r in rows], **how)
