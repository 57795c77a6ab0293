"""Training state checkpoints for restarts: save, and restore on every rank from the newest.

One checkpoint is one file, DIRECTORY/step-NNNNNNNNNNNN.pt (the step, 12 digits), holding
torch.save of a dict (docs/checkpoint.md lists its keys): model and optimizer state_dicts,
named flat tensors (what C and Go register), the reducer's counters, the loader's position
and `extra`. It is written atomically: a temporary file in the same folder, fsync, rename,
fsync of the folder; a crash leaves the previous checkpoint intact (and maybe a
`.step-*.tmp` file, which is never read).

save() is local: a rank writes its own file (ranks may share a folder or each have one).
restore() is collective: every rank looks in its own folder, the ranks agree (one
all_gather) on the newest step any of them holds, and the lowest rank holding it reads its
file and broadcasts the bytes; every rank then loads the same state. The loader resumes
the saved epoch where the ranks stopped, re-shared over the current world size.
"""

import io
import os
import re
import tempfile
from typing import Any, Mapping, NamedTuple, Optional, Protocol, Union

import torch

from ..comm import collectives
from ..comm import group as _group
from ..comm import world as _world
from .. import observe as _observe
from ..base.checks import integer
from ..errors import CorruptData, InvalidArgument, IOFailure

_Path = Union[str, "os.PathLike[str]"]


class Stateful(Protocol):
    """What save() and restore() take: torch modules and optimizers, pybridge's Reducer and
    recordio.Loader (layers above this one, so named here only by what they provide)."""

    def state_dict(self) -> Any:
        """What to keep."""

    def load_state_dict(self, state_dict: Any, /) -> Any:
        """Take back what state_dict() gave."""


FORMAT = "pybridge-checkpoint"
VERSION = 1
_FILE = re.compile(r"^step-(\d{12})\.pt$")


class Restored(NamedTuple):
    """What restore() found: the step, save()'s extra, the rank that sent it, the saving world's size."""

    step: int          # the step saved
    extra: Any         # save()'s extra
    source_rank: int   # the rank whose file was used
    world_size: int    # the world size of the run that saved it


def path_for(directory: _Path, step: int) -> str:
    """The file of `step`'s checkpoint in `directory`."""
    return os.path.join(os.fspath(directory), f"step-{step:012d}.pt")


def checkpoints(directory: _Path) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint in the folder, oldest first ([] if none)."""
    folder = os.fspath(directory)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise IOFailure(f"cannot list checkpoint folder {folder}: {exc}") from exc
    found = sorted((int(m.group(1)), os.path.join(folder, n)) for n in names if (m := _FILE.match(n)))
    return found


def newest(directory: _Path) -> Optional[tuple[int, str]]:
    """(step, path) of the folder's newest checkpoint, or None."""
    found = checkpoints(directory)
    return found[-1] if found else None


def _step(step: int) -> int:
    return integer("step", step, low=0, high=10**12 - 1, expected="an integer in [0, 10^12)")


def _check_tensors(tensors: Optional[Mapping[str, torch.Tensor]]) -> Mapping[str, torch.Tensor]:
    if tensors is None:
        return {}
    if not isinstance(tensors, dict):
        raise InvalidArgument(f"tensors must be a dict of name -> tensor, got {type(tensors).__name__}")
    for name, t in tensors.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"tensor names must be non-empty strings, got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(f"tensor {name!r} is a {type(t).__name__}, not a torch.Tensor")
    return tensors


def state_of(step: int, *, model: Optional[Stateful] = None, optimizer: Optional[Stateful] = None,
             reducer: Optional[Stateful] = None, loader: Optional[Stateful] = None,
             tensors: Optional[Mapping[str, torch.Tensor]] = None, extra: Any = None) -> dict[str, Any]:
    """The checkpoint as a dict (what encode() serializes and apply() loads). Its tensors
    are the objects' own (state_dict() shares memory), except `tensors`, copied to the CPU."""
    return {
        "format": FORMAT, "version": VERSION, "step": _step(step),
        "world_size": _world.current().size if _world.is_initialized() else 1,
        "model": None if model is None else model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "reducer": None if reducer is None else reducer.state_dict(),
        "loader": None if loader is None else loader.state_dict(),
        "tensors": {k: t.detach().to("cpu", copy=True) for k, t in _check_tensors(tensors).items()},
        "extra": extra,
    }


def to_bytes(state: dict[str, Any]) -> bytes:
    """A checkpoint dict's bytes (torch.save)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def encode(step: int, *, model: Optional[Stateful] = None, optimizer: Optional[Stateful] = None,
           reducer: Optional[Stateful] = None, loader: Optional[Stateful] = None,
           tensors: Optional[Mapping[str, torch.Tensor]] = None, extra: Any = None) -> bytes:
    """The checkpoint's bytes (what save() writes)."""
    return to_bytes(state_of(step, model=model, optimizer=optimizer, reducer=reducer, loader=loader,
                             tensors=tensors, extra=extra))


def _write_atomic(path: str, data: bytes) -> None:
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".step-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise IOFailure(f"cannot write a checkpoint in {folder}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(folder, os.O_RDONLY)  # the rename itself must reach the disk
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise IOFailure(f"cannot write checkpoint {path}: {exc}") from exc


@_observe.recorded("checkpoint.save", "checkpoint")
def save(directory: _Path, step: int, *, model: Optional[Stateful] = None, optimizer: Optional[Stateful] = None,
         reducer: Optional[Stateful] = None, loader: Optional[Stateful] = None,
         tensors: Optional[Mapping[str, torch.Tensor]] = None, extra: Any = None, keep: int = 2) -> str:
    """Write the state at `step` atomically to DIRECTORY/step-<step>.pt; return its path.

    model, optimizer: anything with state_dict()/load_state_dict() (torch modules and
    optimizers). reducer: a pybridge Reducer (its iteration and hook step counters).
    loader: a static-partition recordio.Loader (its position: save after the step that used
    the batches it handed out). tensors: dict name -> tensor (copied). extra: plain data
    (numbers, strings, lists, dicts, tensors), returned by restore(). keep: checkpoints to
    keep in the folder, the newest ones (0 keeps all). Local: no collective.

    Example::

        >>> import torch
        >>> from pybridge.runtime import checkpoint
        >>> model = torch.nn.Linear(4, 2)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> path = checkpoint.save("ckpt", 100, model=model, optimizer=opt, extra={"epoch": 3})
        >>> path
        'ckpt/step-000000000100.pt'
    """
    keep = integer("keep", keep, low=0)
    path = path_for(directory, _step(step))
    _write_atomic(path, encode(step, model=model, optimizer=optimizer, reducer=reducer, loader=loader,
                               tensors=tensors, extra=extra))
    if keep:
        for _, old in checkpoints(directory)[:-keep]:
            try:
                os.unlink(old)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise IOFailure(f"cannot remove old checkpoint {old}: {exc}") from exc
    return path


def decode(data: bytes, source: str = "checkpoint") -> dict[str, Any]:
    """The state dict from a checkpoint's bytes (CorruptData naming `source` if unreadable)."""
    try:
        state: Any = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CorruptData(f"{source}: not a readable checkpoint: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CorruptData(f"{source}: not a pybridge checkpoint")
    if state.get("version") != VERSION:
        raise CorruptData(f"{source}: checkpoint version {state.get('version')!r}, this pybridge reads {VERSION}")
    _check_fields(state, source)
    checked: dict[str, Any] = state
    return checked


def _check_fields(state: dict[str, Any], source: str) -> None:
    """The metadata restore() and apply() read, type-checked: CorruptData naming the field, not
    a ValueError (or a silently truncated float) from int() later."""
    for field, low, high, default in (("step", 0, 10**12 - 1, None), ("world_size", 1, 1 << 31, 1)):
        value = state.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise CorruptData(f"{source}: field {field!r} is {value!r} ({type(value).__name__}), "
                              f"not an integer in [{low}, {high}]")
    tensors = state.get("tensors")
    if tensors is not None and not (isinstance(tensors, dict) and all(
            isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in tensors.items())):
        raise CorruptData(f"{source}: field 'tensors' is not a dict of name -> tensor")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise IOFailure(f"cannot read checkpoint {path}: {exc}") from exc


def _agree_and_fetch(directory: _Path, g: Optional[_group.Group]) -> Optional[tuple[bytes, str, int]]:
    """(bytes of the newest checkpoint any rank holds, its source description, source rank), or None."""
    if g is None or g.size == 1:
        mine = newest(directory)
        return None if mine is None else (_read(mine[1]), mine[1], 0)
    failed: Optional[IOFailure] = None
    try:
        mine = newest(directory)
    except IOFailure as exc:  # still join the all_gather, so the others fail too, not hang
        mine, failed = None, exc
    dev = g.device
    code = -2 if failed else -1 if mine is None else mine[0]
    steps = [row[0] for row in collectives.gather_rows([code], group=g)]
    if failed:
        raise failed
    bad = [r for r, s in enumerate(steps) if s == -2]
    if bad:
        raise IOFailure(f"ranks {bad} could not list their checkpoint folder (see their errors)")
    best = max(steps)
    if best < 0:
        return None
    src = steps.index(best)  # the lowest rank holding the newest step
    data: Optional[bytes] = None
    error: Optional[IOFailure] = None
    if g.rank == src:
        assert mine is not None  # the lowest rank holding the newest step
        try:
            data = _read(mine[1])
        except IOFailure as exc:
            error = exc
    size = torch.tensor([-1 if data is None else len(data)], dtype=torch.int64, device=dev)
    collectives.broadcast(size, src, group=g)
    n = int(size.item())
    source = f"rank {src}'s checkpoint of step {best}"
    if n < 0:
        if error is not None:
            raise error
        raise IOFailure(f"{source} could not be read on rank {src} (see that rank's error)")
    buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev) if data is not None and n
           else torch.empty(n, dtype=torch.uint8, device=dev))
    if n:
        collectives.broadcast(buf, src, group=g)
    if data is not None and mine is not None:  # this rank sent it
        return data, mine[1], src
    return buf.cpu().numpy().tobytes(), source, src


def _load_into(what: str, obj: Any, state: Any, source: str) -> None:
    if state is None:
        raise InvalidArgument(f"{source} holds no {what} state, but a {what} was given to restore")
    try:
        obj.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        if getattr(exc, "code", None) is not None:
            raise
        raise InvalidArgument(f"{source}: the {what} state does not fit: {exc}") from exc


def _check_fit(tensors: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor], source: str) -> None:
    """Every given tensor exists in the checkpoint with the same size and dtype, and the
    other way round; checked before anything is overwritten."""
    given, held = set(tensors), set(saved)
    if given != held:
        raise InvalidArgument(f"{source}: tensor names differ: missing from the checkpoint "
                              f"{sorted(given - held)}, not given {sorted(held - given)}")
    for name, t in tensors.items():
        s = saved[name]
        if s.numel() != t.numel() or s.dtype != t.dtype:
            raise InvalidArgument(f"{source}: tensor {name!r} holds {s.numel()} {s.dtype} elements, "
                                  f"the one given {t.numel()} {t.dtype}")


@_observe.recorded("checkpoint.restore", "checkpoint")
def restore(directory: _Path, *, group: Optional[_group.Group] = None, model: Optional[Stateful] = None,
            optimizer: Optional[Stateful] = None, reducer: Optional[Stateful] = None,
            loader: Optional[Stateful] = None, tensors: Optional[Mapping[str, torch.Tensor]] = None,
            strict: bool = True, local: bool = False) -> Optional[Restored]:
    """Load the newest checkpoint any rank holds into the objects given, on every rank.

    COLLECTIVE over `group` (default: the world when one is live; else, or with local=True,
    this process alone).
    Each rank looks in its own `directory` (a shared folder or one per rank); the lowest rank
    holding the newest step sends its file to the others. Returns None, changing nothing,
    when no rank holds a checkpoint. tensors: dict name -> tensor, filled in place; with
    strict, the names must be those saved. The loader continues the saved epoch, shared over
    its own ranks (the world size may differ from the run that saved it).

    Example::

        >>> import torch
        >>> from pybridge.runtime import checkpoint
        >>> model = torch.nn.Linear(4, 2)
        >>> checkpoint.restore("nothing-saved-here", model=model) is None   # nothing anywhere: no change
        True
        >>> path = checkpoint.save("ckpt", 7, model=model, extra="hello")
        >>> got = checkpoint.restore("ckpt", model=model)   # every rank loads the newest step
        >>> got.step, got.extra
        (7, 'hello')
    """
    tensors = _check_tensors(tensors)
    g = None if local else group or (_world.current() if _world.is_initialized() else None)
    if g is not None:
        g.check_open()
    got = _agree_and_fetch(directory, g)
    if got is None:
        return None
    data, source, src = got
    state = decode(data, source)
    apply(state, source, model=model, optimizer=optimizer, reducer=reducer, loader=loader, tensors=tensors,
          strict=strict)
    return Restored(state["step"], state.get("extra"), src, state.get("world_size", 1))


def apply(state: dict[str, Any], source: str, *, model: Optional[Stateful] = None,
          optimizer: Optional[Stateful] = None, reducer: Optional[Stateful] = None,
          loader: Optional[Stateful] = None, tensors: Optional[Mapping[str, torch.Tensor]] = None,
          strict: bool = True) -> None:
    """Load a decoded checkpoint `state` into the objects given (restore's last half; the
    elastic State's rollback). Tensors are checked to fit before anything is overwritten."""
    tensors = _check_tensors(tensors)
    saved = state.get("tensors") or {}
    if strict:
        _check_fit(tensors, saved, source)
    else:
        _check_fit({k: t for k, t in tensors.items() if k in saved},
                   {k: t for k, t in saved.items() if k in tensors}, source)
    for what, obj in (("model", model), ("optimizer", optimizer), ("reducer", reducer), ("loader", loader)):
        if obj is not None:
            _load_into(what, obj, state.get(what), source)
    with torch.no_grad():
        for name, t in tensors.items():
            if name in saved:
                t.copy_(saved[name].reshape(t.shape))
