"""Registries by name (comm hooks, server strategies), with the rules of torch's rendezvous
handler registry (torch.distributed.elastic.rendezvous.api.RendezvousHandlerRegistry.register):
a name is a non-empty string; registering what a name already holds does nothing (a module
imported twice); anything else under a taken name is refused, naming both. And `provides`,
the check that an object has every member of a typing.Protocol, naming what it lacks."""

from collections.abc import Iterator, Mapping
from typing import Any, Callable, Generic, TypeVar

from ..errors import InvalidArgument

E = TypeVar("E")


def describe(obj: Any) -> str:
    """A function's or class's module and qualified name; repr() for anything else."""
    name = getattr(obj, "__qualname__", None)
    module = getattr(obj, "__module__", None)
    return f"{module}.{name}" if isinstance(name, str) and module else repr(obj)


class Registry(Mapping[str, E], Generic[E]):
    """Entries by name, read as a mapping; `register` is the one way in. `what` names the
    kind in errors ("comm hook", "server strategy"); `describe` spells an entry in them."""

    def __init__(self, what: str, describe: Callable[[E], str] = describe) -> None:
        self.what = what
        self._describe = describe
        self._entries: dict[str, E] = {}

    def __getitem__(self, name: str) -> E:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what}: {', '.join(self._entries)})"

    def register(self, name: str, entry: E) -> None:
        """Add `entry` as `name`. The same entry again is a no-op; another is refused."""
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise InvalidArgument(f"a {self.what}'s name must be a non-empty string without spaces, got {name!r}")
        current = self._entries.get(name)
        if current is not None and current != entry:
            raise InvalidArgument(f"the {self.what} {name!r} cannot be registered with {self._describe(entry)} "
                                  f"as it is already registered with {self._describe(current)}")
        self._entries[name] = entry

    def lookup(self, name: str) -> E:
        """The entry of `name`, else InvalidArgument naming it and every registered name."""
        if not isinstance(name, str):
            raise InvalidArgument(f"a {self.what} is chosen by its name (a string), got {name!r}")
        try:
            return self._entries[name]
        except KeyError:
            raise InvalidArgument(f"unknown {self.what} {name!r}; choose one of {', '.join(self._entries)}") from None


def members(protocol: type) -> list[str]:
    """The members a typing.Protocol class declares (methods and annotated attributes), its
    bases' included, in declaration order."""
    names: list[str] = []
    for cls in reversed(protocol.__mro__):
        if cls is object or not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue
        for name in [*getattr(cls, "__annotations__", {}), *vars(cls)]:
            if not name.startswith("_") and name not in names:
                names.append(name)
    return names


def provides(what: str, obj: Any, protocol: type) -> Any:
    """`obj`, if it has every member of `protocol` (a method's member callable), else
    InvalidArgument: "{what} does not provide X, Y (Protocol: its docstring's first line)"."""
    missing = []
    for name in members(protocol):
        method = callable(getattr(protocol, name, None))  # an annotated attribute has no value there
        value = getattr(obj, name, _MISSING)
        if value is _MISSING or (method and not callable(value)):
            missing.append(f"{name}()" if method else name)
    if missing:
        doc = (protocol.__doc__ or "").strip().split("\n")[0]
        raise InvalidArgument(f"{what} does not provide {', '.join(missing)} ({protocol.__name__}: {doc})")
    return obj


_MISSING = object()

__all__ = ["Registry", "describe", "members", "provides"]
