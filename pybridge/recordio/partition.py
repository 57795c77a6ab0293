"""Splitting a dataset of RecordIO files across ranks.

The unit of work is a Task {file, first record, count}: a contiguous record range of one file,
so that reading a task is sequential I/O. By default there is one task per chunk (each chunk
is then decoded once per epoch); `task_records` splits them further.

Static partition (DistributedSampler semantics, over records):
  the tasks are put in epoch order (shuffled with the same permutation on every rank, from
  seed and epoch, when shuffle is on) and read as one stream of N records. Every rank takes
  a contiguous share of M records of that stream: rank r reads records [r*M, (r+1)*M).
  drop_last=False: M = ceil(N / R); the stream is padded by wrapping around to its start (as
      DistributedSampler repeats its first indices), so ranks get ceil(M / B) batches each,
      the last one possibly partial, the same size on every rank.
  drop_last=True: M = floor(floor(N / R) / B) * B; the tail is dropped and every rank gets
      M / B full batches.
Dynamic partition:
  the tasks (in epoch order) are claimed one at a time through an atomic counter in the
  process group's store (store.add(key, 1)), so a faster rank reads more tasks; every record
  is read exactly once per epoch, and ranks may end with different numbers of batches.

The shuffle is pybridge.base.shuffle.permutation (Fisher-Yates driven by splitmix64, seeded with
seed and epoch), the same one gossip's topology uses, so that every rank derives the same order.
"""

import hashlib
import threading
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Protocol, Sequence

import numpy as np

from ..base.checks import index, integer
from ..errors import InvalidArgument, classify
from ..base.shuffle import permutation


class Task(NamedTuple):
    """A contiguous range of one file's records: the unit a rank reads."""

    file: str
    first: int  # first record number within the file
    count: int  # type: ignore[assignment]  # (shadows tuple.count: the field's name is public)


_Plan = list[tuple[int, int]]  # (start, count) ranges of an epoch's record stream


def chunk_tasks(file: str, chunk_first: Iterable[int], task_records: Optional[int] = None) -> list[Task]:
    """Tasks for one file from its chunk boundaries (Index.first: each chunk's first record,
    then the total): one per chunk, split into pieces of at most task_records records."""
    if task_records is not None:
        task_records = integer("task_records", task_records, low=1)
    bounds = [int(b) for b in chunk_first]
    tasks: list[Task] = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        step = task_records or (hi - lo)
        for s in range(lo, hi, max(step, 1)):
            tasks.append(Task(file, s, min(step, hi - s)))
    return tasks


def make_tasks(files: Sequence[str], counts: Sequence[int], task_records: Optional[int] = None) -> list[Task]:
    """Tasks from per-file record counts: pieces of at most task_records (default: whole files)."""
    if len(files) != len(counts):
        raise InvalidArgument(f"{len(files)} files but {len(counts)} record counts")
    return [t for f, n in zip(files, counts) for t in chunk_tasks(f, [0, int(n)], task_records)]


def epoch_order(tasks: Iterable[Task], epoch: int = 0, seed: int = 0, shuffle: bool = False) -> list[Task]:
    """The tasks in the order every rank uses for this epoch."""
    listed = list(tasks)
    if not shuffle:
        return listed
    return [listed[i] for i in permutation(len(listed), seed, epoch)]


def per_rank_records(total: int, num_replicas: int, batch_size: int = 1, drop_last: bool = False) -> int:
    """Records each rank reads per epoch under the static partition."""
    if drop_last:
        return (total // num_replicas) // batch_size * batch_size
    return -(-total // num_replicas)


def num_batches(total: int, num_replicas: int, batch_size: int = 1, drop_last: bool = False) -> int:
    """Batches each rank gets per epoch under the static partition (equal on every rank).

    Example::

        >>> from pybridge import recordio
        >>> recordio.num_batches(1000, num_replicas=3, batch_size=64)                  # 334 records each
        6
        >>> recordio.num_batches(1000, num_replicas=3, batch_size=64, drop_last=True)  # 320 each
        5
    """
    return -(-per_rank_records(total, num_replicas, batch_size, drop_last) // batch_size)


def _check_rank(num_replicas: int, rank: int) -> tuple[int, int]:
    num_replicas = integer("num_replicas", num_replicas, low=1)
    return num_replicas, index("rank", rank, num_replicas, f"num_replicas {num_replicas}")


def take(ordered: Sequence[Task], start: int, count: int) -> list[Task]:
    """Pieces covering `count` records of the task stream from position `start`, wrapping
    around to the stream's start when it runs out (the padding of drop_last=False)."""
    total = sum(t.count for t in ordered)
    if count <= 0:
        return []
    if total == 0:
        raise InvalidArgument("the dataset holds no records")
    ends = np.cumsum([t.count for t in ordered])
    pieces: list[Task] = []
    pos = start % total
    i = int(np.searchsorted(ends, pos, side="right"))
    while count > 0:
        t = ordered[i]
        skip = pos - (int(ends[i]) - t.count)
        n = min(t.count - skip, count)
        if n > 0:
            if pieces and pieces[-1].file == t.file and pieces[-1].first + pieces[-1].count == t.first + skip:
                last = pieces.pop()  # adjacent ranges of one file read as one
                pieces.append(Task(t.file, last.first, last.count + n))
            else:
                pieces.append(Task(t.file, t.first + skip, n))
        count -= n
        pos = (pos + n) % total
        i = (i + 1) % len(ordered)
    return pieces


def static_shard(tasks: Iterable[Task], num_replicas: int, rank: int, *, batch_size: int = 1, epoch: int = 0,
                 seed: int = 0, shuffle: bool = False, drop_last: bool = False,
                 plan: Optional[_Plan] = None) -> list[Task]:
    """This rank's pieces (Tasks, in read order) for the epoch under the static partition.

    plan: the part of the epoch's record stream to share out, as (start, count) ranges of
    stream positions (default: all of it); a resumed epoch passes what is left of it."""
    num_replicas, rank = _check_rank(num_replicas, rank)
    batch_size = integer("batch_size", batch_size, low=1)
    ordered = epoch_order(tasks, epoch, seed, shuffle)
    plan = [(0, sum(t.count for t in ordered))] if plan is None else plan
    return [piece for start, count in plan_share(plan, num_replicas, rank, batch_size, drop_last)
            for piece in take(ordered, start, count)]


# ---- plans: which positions of an epoch's record stream a pass shares out ------------------
# A plan is a list of (start, count) ranges of positions in the epoch's record stream (the
# tasks in epoch order, read as one sequence). A fresh epoch's plan is [(0, N)]. Ranks split
# the plan's L positions as the static partition splits a dataset: rank r takes plan
# positions [r*M, (r+1)*M), padded by wrapping around to the plan's start. A checkpoint
# stores what is left of the plan (plan_remaining), so a resumed pass, on any number of
# ranks, reads each record that is left exactly once (plus the padding of drop_last=False
# when the rest does not divide evenly).

def _merge(ranges: Iterable[tuple[int, int]]) -> _Plan:
    out: _Plan = []
    for start, count in ranges:
        if count <= 0:
            continue
        if out and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + count)
        else:
            out.append((start, count))
    return out


def plan_ranges(plan: _Plan, start: int, count: int) -> _Plan:
    """Stream ranges of plan positions [start, start + count), wrapping around the plan."""
    total = sum(n for _, n in plan)
    out: _Plan = []
    if count <= 0:
        return out
    if total == 0:
        raise InvalidArgument("the plan holds no records")
    pos = start % total
    while count > 0:
        skipped = 0
        for s, n in plan:  # plans are short: a few ranges per rank of the run that saved them
            if pos < skipped + n:
                k = min(skipped + n - pos, count)
                out.append((s + pos - skipped, k))
                count -= k
                pos = (pos + k) % total
                break
            skipped += n
    return _merge(out)


def plan_share(plan: _Plan, num_replicas: int, rank: int, batch_size: int = 1, drop_last: bool = False) -> _Plan:
    """Stream ranges rank `rank` of `num_replicas` reads from the plan, in read order."""
    m = per_rank_records(sum(n for _, n in plan), num_replicas, batch_size, drop_last)
    return plan_ranges(plan, rank * m, m)


def plan_remaining(plan: _Plan, num_replicas: int, batch_size: int, drop_last: bool, batches: int) -> _Plan:
    """The plan left once every rank has read `batches` batches of its share (a static
    partition reads in lockstep): each rank's unread positions, in rank order. Padding
    (positions past the plan's end) is dropped: those records were read at the start."""
    if batches <= 0:
        return _merge(plan)
    total = sum(n for _, n in plan)
    m = per_rank_records(total, num_replicas, batch_size, drop_last)
    done = min(batches * batch_size, m)
    left: _Plan = []
    for r in range(num_replicas):
        lo, hi = r * m + done, min((r + 1) * m, total)
        if lo < hi:
            left.extend(plan_ranges(plan, lo, hi - lo))
    return _merge(left)


class Store(Protocol):
    """What a dynamic partition needs of a store: torch.distributed's Store.add."""

    def add(self, key: str, amount: int, /) -> int:
        """Add `amount` to the counter `key` (0 at first) atomically; returns the new value."""


class LocalStore:
    """An in-process stand-in for a torch.distributed Store (only add()), for one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = {}

    def add(self, key: str, amount: int) -> int:
        """Add `amount` to the counter `key` (0 at first); returns the new value."""
        with self._lock:
            self._values[key] = self._values.get(key, 0) + int(amount)
            return self._values[key]


def dataset_name(tasks: Iterable[Any], *settings: Any) -> str:
    """A name that is the same on every rank for the same dataset and settings."""
    h = hashlib.sha1(repr((list(tasks), settings)).encode()).hexdigest()
    return h[:16]


_instances_lock = threading.Lock()
_instances: dict[str, int] = {}  # name -> dynamic partitions this process has numbered under that name


def next_instance(name: str) -> int:
    """0 for the first dynamic partition this process opens under `name`, then 1, 2, ...:
    the same sequence on every rank that opens its loaders in the same order."""
    with _instances_lock:
        n = _instances.get(name, 0)
        _instances[name] = n + 1
        return n


class DynamicPartition:
    """Tasks claimed on demand through an atomic counter in a store shared by all ranks.

    store: anything with add(key, amount) -> new value (torch.distributed Store, LocalStore).
    Every rank must build it from the same tasks, seed, shuffle and instance, and use the
    same (epoch, pass_no) for the same pass; each pass has its own counter key.

    instance: a store keeps its counters for the life of the group, so a second partition of
    the same data (an evaluation loader reopened every epoch, two loaders at once) would find
    the first one's counters exhausted and read nothing. Give each its own instance number
    (next_instance(name), as the Loader does) and it gets counters of its own.
    """

    def __init__(self, tasks: Iterable[Task], store: Store, *, name: Optional[str] = None, shuffle: bool = False,
                 seed: int = 0, instance: int = 0) -> None:
        if not hasattr(store, "add"):
            raise InvalidArgument("store must have an add(key, amount) method (a torch.distributed Store)")
        self.tasks = list(tasks)
        self.store = store
        self.shuffle = bool(shuffle)
        self.seed = integer("seed", seed, low=0)
        self.name = name or dataset_name(self.tasks, self.shuffle, self.seed)
        self.instance = integer("instance", instance, low=0)

    def key(self, epoch: int, pass_no: int = 0) -> str:
        """The store key of a pass's counter."""
        return f"pybridge/recordio/{self.name}/{self.instance}/epoch{epoch}/pass{pass_no}"

    def claims(self, epoch: int = 0, pass_no: int = 0) -> Iterator[Task]:
        """Yield the tasks this rank claims, until every task of the pass is claimed."""
        order = epoch_order(self.tasks, epoch, self.seed, self.shuffle)
        key = self.key(epoch, pass_no)
        while True:
            try:
                i = int(self.store.add(key, 1)) - 1
            except Exception as exc:  # noqa: BLE001 - the store's host died or stopped answering
                raise classify(exc) from exc
            if i >= len(order):
                return
            yield order[i]
