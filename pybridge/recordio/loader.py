"""Loader: this rank's batches of a sharded RecordIO dataset, prefetched on a background thread.

Each batch is one contiguous uint8 buffer plus int64 offsets (a Batch); no per-record Python
object is created on the way. Iteration is either Python's (`for batch in loader`) or
scanner-style for the C ABI (`next_batch()` returns None at the end of a pass).
"""

import glob
import os
import queue
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterable, Iterator, Optional, Union

from ..base import agree
from ..base.checks import index, integer
from ..errors import Closed, InvalidArgument
from ..observe import clock as _clock
from ..observe import state as _obs
from .batch import Batch, decode_fixed  # noqa: F401 - decode_fixed is part of the loader API
from .index import SIDECAR_SUFFIX
from .partition import (DynamicPartition, LocalStore, Store, Task, _merge, chunk_tasks, dataset_name, next_instance,
                        num_batches, plan_remaining, static_shard)
from .reader import Reader, Span, join

if TYPE_CHECKING:
    from ..comm.group import Group

_Path = Union[str, "os.PathLike[str]"]
_Plan = list[tuple[int, int]]

PARTITIONS = ("static", "dynamic")
_OPEN_FILES = 8  # readers keeping a file descriptor at once


def expand_files(files: Union[_Path, Iterable[_Path]]) -> list[str]:
    """A list of paths, or one path / glob pattern string (sorted; sidecar index files skipped)."""
    if isinstance(files, (str, os.PathLike)):
        pattern = os.fspath(files)
        if glob.has_magic(pattern):
            found = sorted(p for p in glob.glob(pattern) if not p.endswith(SIDECAR_SUFFIX))
            if not found:
                raise InvalidArgument(f"no files match {pattern!r}")
            return found
        return [pattern]
    out = [os.fspath(f) for f in files]
    if not out:
        raise InvalidArgument("no input files given")
    return out


class _End:
    pass


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Pass:
    """One pass over the rank's share: an iterator fed by a prefetch thread (or inline)."""

    def __init__(self, gen: Generator[Batch, None, None], prefetch: int, check: Callable[[], None]) -> None:
        self._gen = gen
        self._check = check  # raises when the loader may no longer be read
        self.handed = 0  # batches given to the caller (the loader's position)
        self._stop = threading.Event()
        self._done = False
        self._thread: Optional[threading.Thread] = None
        self._q: "queue.Queue[object]"
        if prefetch > 0:
            self._q = queue.Queue(maxsize=prefetch)
            self._thread = threading.Thread(target=self._produce, name="pybridge-recordio-prefetch",
                                            daemon=True)
            self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for batch in self._gen:
                if not self._put(batch):
                    return
            self._put(_End)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(_Failed(exc))
        finally:
            self._gen.close()

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Batch:
        rec = _obs.REC
        if rec is None:
            return self._next()
        start = _clock.now_us()
        item = self._next()
        rec.on_loader(start, len(item))
        return item

    def _next(self) -> Batch:
        if self._done:
            raise StopIteration
        self._check()
        if self._thread is None:
            try:
                item = next(self._gen)
            except BaseException:
                self._done = True
                raise
            self.handed += 1
            return item
        while True:
            try:
                got = self._q.get(timeout=0.5)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._q.empty():
                    self._done = True
                    raise RuntimeError("recordio prefetch thread ended without a result") from None
        if got is _End:
            self._done = True
            raise StopIteration
        if isinstance(got, _Failed):
            self._done = True
            raise got.exc
        assert isinstance(got, Batch)
        self.handed += 1
        return got

    def close(self) -> None:
        self._done = True
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:  # unblock a producer waiting on a full queue
                    self._q.get_nowait()
                except queue.Empty:
                    pass
                self._thread.join(timeout=0.05)
        else:
            self._gen.close()


class Loader:
    """Batches of this rank's share of a RecordIO dataset.

    files: paths, or a glob pattern; every rank must see the same list in the same order.
    batch_size: records per batch.
    partition: "static" (fixed disjoint shares, DistributedSampler semantics, equal batch
        counts on every rank) or "dynamic" (ranks claim tasks through the store; a faster
        rank reads more; every record exactly once per epoch). See partition.py.
    group: the pybridge group whose ranks share the data (default: the world group when one
        is live); num_replicas, rank: default to the group's size and rank, else 1 and 0.
    shuffle, seed: shuffle the task order with the same permutation on every rank, from
        seed and the epoch (set_epoch); records keep their order inside a task.
    drop_last: static: drop the tail so every batch is full (else pad by wrapping around);
        dynamic: drop each rank's final partial batch.
    task_records: split tasks to at most this many records (default: one task per chunk).
    store, name: dynamic only; the store defaults to the group's rendezvous store (a local
        counter in a single process), name keys the counters (default: derived from the
        dataset and settings). Each dynamic loader has its own counters, so loaders over the
        same data, open at once or one after another, each read every record once per
        epoch; every rank must open its dynamic loaders in the same order.
    prefetch: batches prepared ahead on a background thread (0: read on the caller's thread).
    skip_corrupt, verify_checksums, index_cache, max_decoded_bytes: passed to each Reader.

    The static partition is deterministic for given (files, seed, epoch); the dynamic
    partition's assignment depends on timing, by design.

    A task is read by decoding the chunks it touches, and each Reader caches its last two
    decoded chunks: shuffling small tasks of files with big (32 MiB) chunks decodes a whole
    chunk for a few records. For fine-grained shuffling, write smaller chunks
    (Writer(max_chunk_bytes=...), `pack --max-chunk-bytes`).

    Example::

        >>> import pybridge
        >>> from pybridge import recordio
        >>> for shard in range(2):
        ...     n = recordio.write_file(f"train-{shard}.recordio", [bytes([i, i]) for i in range(32)])
        >>> loader = recordio.Loader("train-*.recordio", batch_size=8, shuffle=True)   # after init()
        >>> for epoch in range(2):
        ...     loader.set_epoch(epoch)
        ...     for batch in loader:               # this rank's share: 64 records over the ranks
        ...         arrays = batch.decode([("label", "u1", ()), ("x", "u1", ())])
        >>> len(loader) == 64 // 8 // pybridge.size()
        True
        >>> loader.close()
    """

    def __init__(self, files: Union[_Path, Iterable[_Path]], batch_size: int, *, partition: str = "static",
                 group: "Optional[Group]" = None, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shuffle: bool = False, seed: int = 0, drop_last: bool = False, task_records: Optional[int] = None,
                 store: Optional[Store] = None, name: Optional[str] = None, prefetch: int = 2,
                 skip_corrupt: bool = False, verify_checksums: bool = True,
                 index_cache: Union[bool, _Path] = False, epoch: int = 0,
                 max_decoded_bytes: Optional[int] = None) -> None:
        batch_size = integer("batch_size", batch_size, low=1)
        if partition not in PARTITIONS:
            raise InvalidArgument(f"partition must be 'static' or 'dynamic', got {partition!r}")
        self.batch_size = batch_size
        self.partition = partition
        self.shuffle = bool(shuffle)
        self.seed = integer("seed", seed, low=0)  # checked now, not at the first shuffled batch
        self.drop_last = bool(drop_last)
        self.prefetch = _prefetch_count(prefetch)
        group = group or _live_group()
        if group is not None:
            group.check_open()
        # Made from the group (its ranks or store): once it is finalized, reading fails.
        self._group = group if group is not None and (
            num_replicas is None or rank is None or (partition == "dynamic" and store is None)) else None
        if num_replicas is None:
            num_replicas = group.size if group else 1
        if rank is None:
            rank = group.rank if group else 0
        self.num_replicas = integer("num_replicas", num_replicas, low=1)
        self.rank = index("rank", rank, self.num_replicas, f"num_replicas {self.num_replicas}")
        self.files = expand_files(files)
        self._readers: dict[str, Reader] = {}
        self._open_order: list[str] = []
        self._lock = threading.Lock()
        self._pass: Optional[_Pass] = None
        # (epoch, plan, _Pass) of the latest pass: what state_dict reports
        self._position: Optional[tuple[int, _Plan, _Pass]] = None
        self._resume: Optional[tuple[int, _Plan]] = None  # (epoch, plan) the next pass of that epoch reads
        self._layout: Optional[str] = None
        self._passes: dict[int, int] = {}  # epoch -> passes started (keys the dynamic counters)
        self.closed = False
        try:
            for path in self.files:
                r = Reader(path, skip_corrupt=skip_corrupt, verify_checksums=verify_checksums,
                           index_cache=index_cache, allow_empty=skip_corrupt,
                           max_decoded_bytes=max_decoded_bytes)
                r.release()  # reopened on first read: many shards must not hold many descriptors
                self._readers[path] = r
            self.tasks = [t for path in self.files
                          for t in chunk_tasks(path, self._readers[path].index.first, task_records)]
        except BaseException:
            self.close()
            raise
        self.num_records = sum(r.num_records for r in self._readers.values())
        if self.num_records == 0:
            self.close()
            raise InvalidArgument(f"the dataset ({len(self.files)} files) holds no records")
        self._dynamic: Optional[DynamicPartition] = None
        if partition == "dynamic":
            if store is None:
                if group is not None and self.num_replicas > 1:
                    store = group.store
                    self._check_same_everywhere(store)
                elif self.num_replicas == 1:
                    store = LocalStore()
                else:
                    self.close()
                    raise InvalidArgument(f"a dynamic partition over {self.num_replicas} ranks needs a "
                                          "store: call pybridge.init() first or pass store=")
            name = name or dataset_name(self.tasks, self.batch_size, self.shuffle, self.seed)
            self._dynamic = DynamicPartition(self.tasks, store, shuffle=self.shuffle, seed=self.seed,
                                             name=name, instance=next_instance(name))
        self.epoch = 0
        self.set_epoch(epoch)

    def _check_same_everywhere(self, store: Store) -> None:
        """Ranks opening a dynamic loader over other files or options would each count on
        counters of their own and read records twice: compare once, through the store."""
        g = self._group  # the loader's group (a store of the caller's own is not checked)
        assert g is not None
        row = (len(self.files), self.num_records, self.batch_size, self.shuffle, self.seed, self.drop_last,
               dataset_name(self.tasks))
        try:
            agree.in_store(store, f"pybridge/loader-open/{next_instance('open:' + g.uid)}", g.rank, g.size, row,
                           timeout=g.timeout, what="dynamic loader open: ranks disagree",
                           cancel=lambda: g.check_aborted("opening the dynamic loader"),
                           describe=_describe_open, fields=_OPEN_FIELDS)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ epoch and size

    def set_epoch(self, epoch: int) -> None:
        """Epoch of the next pass (changes the shuffle; keys the dynamic counters)."""
        self.epoch = integer("epoch", epoch, low=0)

    def set_prefetch(self, batches: int) -> None:
        """Batches prepared ahead on the background thread from the next pass on (0: none)."""
        self.prefetch = _prefetch_count(batches)

    @property
    def num_batches(self) -> Optional[int]:
        """Batches per pass on this rank (static partition; None for dynamic); for an epoch
        resumed by load_state_dict, the batches of what is left of it."""
        if self.partition == "dynamic":
            return None
        plan = self._full_plan()
        if self._resume is not None and self._resume[0] == self.epoch:
            plan = self._resume[1]  # a resumed epoch: what is left of it
        elif self._position is not None and self._position[0] == self.epoch and not self._position[2]._done:
            plan = self._position[1]
        return num_batches(sum(n for _, n in plan), self.num_replicas, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        n = self.num_batches
        if n is None:
            raise TypeError("a dynamic partition has no fixed number of batches per rank")
        return n

    @property
    def corrupt_chunks(self) -> int:
        """Corrupt chunks skipped so far (skip_corrupt), over all files."""
        return sum(r.corrupt_chunks for r in self._readers.values())

    @property
    def skipped_records(self) -> int:
        """Records lost in chunks found corrupt while reading (skip_corrupt)."""
        return sum(r.skipped_records for r in self._readers.values())

    @property
    def corrupt_errors(self) -> list[Exception]:
        """The CorruptData of every chunk skipped so far (skip_corrupt), over all files."""
        return [e for r in self._readers.values() for e in r.corrupt_errors]

    # ------------------------------------------------------------ reading

    def _reader(self, path: str) -> Reader:
        r = self._readers[path]
        with self._lock:
            if path in self._open_order:
                self._open_order.remove(path)
            self._open_order.append(path)
            while len(self._open_order) > _OPEN_FILES:
                self._readers[self._open_order.pop(0)].release()
        return r

    def _pieces_stream(self, epoch: int, pass_no: int, plan: _Plan) -> Iterator[Task]:
        if self._dynamic is not None:
            return self._dynamic.claims(epoch, pass_no)
        return iter(static_shard(self.tasks, self.num_replicas, self.rank, batch_size=self.batch_size,
                                 epoch=epoch, seed=self.seed, shuffle=self.shuffle,
                                 drop_last=self.drop_last, plan=plan))

    def _batches(self, epoch: int, pass_no: int, plan: _Plan) -> Generator[Batch, None, None]:
        """Generator of this pass's batches (runs on the prefetch thread)."""
        batch: list[Span] = []
        want = self.batch_size
        for task in self._pieces_stream(epoch, pass_no, plan):
            first, left = task.first, task.count
            while left:
                n = min(left, want)
                batch.extend(self._reader(task.file).spans(first, n))
                first, left, want = first + n, left - n, want - n
                if want == 0:
                    yield join(batch)
                    batch, want = [], self.batch_size
        if want < self.batch_size and not (self.drop_last and self._dynamic is not None):
            yield join(batch)

    def __iter__(self) -> Iterator[Batch]:
        """Start a pass over this rank's share for the current epoch."""
        self._check_usable()
        self._end_pass()
        pass_no = self._passes.get(self.epoch, 0)
        self._passes[self.epoch] = pass_no + 1
        plan = self._full_plan()
        if self._resume is not None and self._resume[0] == self.epoch:
            plan, self._resume = self._resume[1], None
        self._pass = _Pass(self._batches(self.epoch, pass_no, plan), self.prefetch, self._check_usable)
        self._position = (self.epoch, plan, self._pass)
        return self._pass

    # ------------------------------------------------------------ position (checkpoints)

    def _full_plan(self) -> _Plan:
        return [(0, self.num_records)]

    def _fingerprint(self) -> str:
        """Names the record stream's layout (files' names, task boundaries), not the paths."""
        if self._layout is None:  # computed once: a checkpoint may be saved every step
            self._layout = dataset_name([(os.path.basename(t.file), t.first, t.count) for t in self.tasks])
        return self._layout

    def state_dict(self) -> dict[str, Any]:
        """The loader's position, to resume mid-epoch (static partition only): the epoch and
        the ranges of that epoch's record stream not yet handed out by any rank.

        Every rank of a static partition reads in lockstep, so any rank's state is everyone's;
        load_state_dict splits what is left over the loader's own world size. Counts batches
        given to the caller (not those prefetched): save it after the step that used them.
        """
        self._check_usable()
        if self._dynamic is not None:
            raise InvalidArgument("a dynamic partition's position cannot be saved (which rank read "
                                  "what depends on timing): resume mid-epoch with partition='static'")
        if self._position is not None and self._position[0] == self.epoch:
            _, plan, p = self._position
            left = plan_remaining(plan, self.num_replicas, self.batch_size, self.drop_last, p.handed)
        elif self._resume is not None and self._resume[0] == self.epoch:
            left = self._resume[1]
        else:
            left = self._full_plan()
        return {"partition": "static", "epoch": self.epoch, "num_records": self.num_records,
                "layout": self._fingerprint(), "shuffle": self.shuffle, "seed": self.seed,
                "remaining": [[int(s), int(n)] for s, n in left]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state_dict() (saved on any number of ranks): the next pass reads the
        rest of the saved epoch, shared over this loader's ranks; later epochs are whole."""
        self._check_usable()
        if self._dynamic is not None:
            raise InvalidArgument("a dynamic partition cannot resume mid-epoch: use partition='static'")
        if not isinstance(state, dict):
            raise InvalidArgument(f"loader state must be a dict from state_dict(), got {type(state).__name__}")
        missing = [k for k in ("epoch", "num_records", "layout", "shuffle", "seed", "remaining") if k not in state]
        if missing or state.get("partition") != "static":
            raise InvalidArgument(f"not a static loader state (missing {missing or 'partition=static'})")
        mine = {"num_records": self.num_records, "layout": self._fingerprint(),
                "shuffle": self.shuffle, "seed": self.seed}
        differ = [f"{k} {state[k]!r} (this loader: {v!r})" for k, v in mine.items() if state[k] != v]
        if differ:
            raise InvalidArgument("the loader state is of another dataset or order: " + ", ".join(differ))
        epoch = state["epoch"]
        plan: _Plan = []
        for item in state["remaining"]:
            ok = (isinstance(item, (list, tuple)) and len(item) == 2
                  and all(type(v) is int and v >= 0 for v in item))  # exactly what state_dict writes
            if not ok or item[0] + item[1] > self.num_records:
                raise InvalidArgument(f"loader state: bad remaining range {item!r} for "
                                      f"{self.num_records} records")
            plan.append((item[0], item[1]))
        self.set_epoch(epoch)
        self._end_pass()
        self._position = None
        self._resume = (self.epoch, _merge(plan))

    def rebind(self, group: "Group") -> None:
        """Share the data over another group from now on (elastic training's new world): the
        pass in progress ends, and the next one splits what its position holds over the new
        ranks (load_state_dict with a committed position first, as State.reset does)."""
        if self.closed:
            raise Closed("loader is closed")
        if self._dynamic is not None:
            raise InvalidArgument("a dynamic partition cannot be re-bound to another group (which rank "
                                  "read what depends on timing): use partition='static' for elastic training")
        group.check_open()
        self._end_pass()
        self._group = group
        self.num_replicas, self.rank = group.size, group.rank

    def _check_usable(self) -> None:
        if self.closed:
            raise Closed("loader is closed")
        if self._group is not None and self._group.closed:
            raise Closed("the process group this loader was opened with was finalized")

    def next_batch(self) -> Optional[Batch]:
        """Scanner-style: the next Batch of the current pass, or None when it ends.

        The call after None starts the next pass (call set_epoch before it). None (or the
        end of `for batch in loader`) is the signal that this rank has no more batches this
        epoch: under the dynamic partition the ranks' counts differ, and a rank that runs
        out joins (DistributedDataParallel.join(), Reducer.join()) so that the others
        finish without waiting for it.
        """
        self._check_usable()
        if self._pass is None or self._pass._done:
            iter(self)
        assert self._pass is not None  # (iter made it)
        try:
            return next(self._pass)
        except StopIteration:
            self._end_pass()  # joins the finished prefetch thread
            return None
        except BaseException:
            self._end_pass()
            raise

    def _end_pass(self) -> None:
        p, self._pass = self._pass, None
        if p is not None:
            p.close()

    def close(self) -> None:
        """Stop prefetching and close every file. Safe to call twice."""
        self._end_pass()
        for r in self._readers.values():
            r.close()
        self.closed = True

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, kind: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._end_pass()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __repr__(self) -> str:
        return (f"<recordio.Loader files={len(self.files)} records={self.num_records} "
                f"batch_size={self.batch_size} {self.partition} rank={self.rank}/{self.num_replicas}>")


def _prefetch_count(n: int) -> int:
    return integer("prefetch", n, low=0)


_OPEN_FIELDS = ("files", "records", "batch", "shuffle", "seed", "drop_last", "data")


def _describe_open(row: Iterable[Any]) -> str:
    return "opened " + ", ".join(f"{v} {k}" if k in ("files", "records") else f"{k} {v}"
                                 for k, v in zip(_OPEN_FIELDS, row))


def _live_group() -> "Optional[Group]":
    from ..comm import world  # late: keeps `import pybridge.recordio` free of process-group state
    live: Optional[Group] = world.current() if world.is_initialized() else None
    return live
