"""Elastic training, part 1: training state that can be committed and rolled back in memory
and sent to another rank over the network (issue 25; docs/elastic.md says what exists and
what does not yet).

A `State` holds what a restart needs (model, optimizer, reducer counters, loader position,
named tensors, user values) the way Horovod Elastic's TorchState does: `commit()` keeps a
copy in memory, `restore()` rolls every object back to it, `sync()` sends the committed
copy of one rank to every rank (how a joiner would receive the live state, no disk). The
copy is a checkpoint's state dict (checkpoint.state_of) with its tensors copied, so a
commit, a file checkpoint and what a joiner receives are one format, loaded by one
function (checkpoint.apply); only sync() serializes it.
"""

import torch

from . import checkpoint, collectives
from . import group as _group
from .errors import InvalidArgument

_OBJECTS = ("model", "optimizer", "reducer", "loader")


class State:
    """State(model=..., optimizer=..., reducer=..., loader=..., tensors={...}, epoch=0, step=0)

    Keyword values other than the objects are user values, read and set as attributes
    (`state.epoch += 1`) and committed with the rest. The state is committed once at
    construction, so restore() always has a copy to go back to."""

    def __init__(self, *, model=None, optimizer=None, reducer=None, loader=None, tensors=None, **values):
        for name in values:
            if name.startswith("_") or name in _OBJECTS or name in ("tensors", "values", "commits"):
                raise InvalidArgument(f"State value {name!r}: the name is taken (objects, tensors, "
                                      "values, commits) or private")
        object.__setattr__(self, "_objects", {"model": model, "optimizer": optimizer, "reducer": reducer,
                                              "loader": loader, "tensors": dict(tensors or {})})
        object.__setattr__(self, "values", dict(values))
        object.__setattr__(self, "commits", 0)
        object.__setattr__(self, "_committed", None)
        self.commit()

    def __getattr__(self, name):
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"State has no value {name!r} (values: {sorted(values)})")

    def __setattr__(self, name, value):
        if name in self.values:
            self.values[name] = value
        else:
            raise AttributeError(f"State has no value {name!r}: give it at construction (State({name}=...))")

    def bind(self, *, model=None, optimizer=None, reducer=None, loader=None, tensors=None):
        """Replace the objects the state commits and restores (the C ABI binds the caller's
        tensors for the length of each call). The commits made so far stay."""
        self._objects.update(model=model, optimizer=optimizer, reducer=reducer, loader=loader,
                             tensors=dict(tensors or {}))

    def commit(self):
        """Keep a copy of the whole state in memory (replacing the previous one). The copy
        reuses the previous commit's memory when the shapes are unchanged: a commit is a
        memory copy of the model and optimizer state, nothing is serialized."""
        o = self._objects
        live = checkpoint.state_of(self.commits, model=o["model"], optimizer=o["optimizer"], reducer=o["reducer"],
                                   loader=o["loader"], tensors=o["tensors"], extra=dict(self.values))
        object.__setattr__(self, "_committed", _copy(live, self._committed))
        object.__setattr__(self, "commits", self.commits + 1)

    @property
    def committed_bytes(self):
        """The tensor bytes of the last commit (about what sync() sends)."""
        return _nbytes(self._committed)

    def restore(self):
        """Roll every object and value back to the last commit."""
        self._load(self._committed)

    def _load(self, state):
        o = self._objects
        # load_state_dict copies out of the commit, which stays intact for the next restore.
        checkpoint.apply(state, "the committed state", model=o["model"], optimizer=o["optimizer"],
                         reducer=o["reducer"], loader=o["loader"], tensors=o["tensors"])
        object.__setattr__(self, "values", dict(state.get("extra") or {}))

    def sync(self, root=0, *, group=None):
        """COLLECTIVE: every rank takes rank `root`'s last commit (its bytes, over the
        network) as its own and restores it. A joiner calls this to receive the live state."""
        g = group or _group.current()
        root = g.check_rank("root", root)
        data = checkpoint.to_bytes(self._committed) if g.rank == root else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        collectives.broadcast(size, root, group=g)
        buf = torch.empty(int(size.item()), dtype=torch.uint8)
        if g.rank == root:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        collectives.broadcast(buf, root, group=g)
        if g.rank != root:
            object.__setattr__(self, "_committed", checkpoint.decode(buf.numpy().tobytes(), f"rank {root}'s state"))
        self._load(self._committed)


def _copy(live, old):
    """A copy of `live` (dicts, lists, tuples, tensors, plain values), written into `old`'s
    tensors where they match in shape, dtype and device (no new memory), else cloned."""
    if isinstance(live, torch.Tensor):
        if isinstance(old, torch.Tensor) and old.shape == live.shape and old.dtype == live.dtype \
                and old.device == live.device:
            return old.copy_(live.detach())
        return live.detach().clone()
    if isinstance(live, dict):
        old = old if isinstance(old, dict) else {}
        return {k: _copy(v, old.get(k)) for k, v in live.items()}
    if isinstance(live, (list, tuple)):
        old = old if isinstance(old, type(live)) and len(old) == len(live) else [None] * len(live)
        return type(live)(_copy(v, o) for v, o in zip(live, old))
    return live


def _nbytes(obj):
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


__all__ = ["State"]
