"""Staleness functions of buffered asynchronous aggregation (FedBuff, FedAsync): the weight
s(tau) of an update computed on a model `tau` versions older than the one it is applied
to (tau >= 0 whole versions; 0 for an update on the current model).

    constant          s(tau) = 1
    polynomial(a)     s(tau) = (1 + tau) ** -a                      a >= 0
    hinge(a, b)       s(tau) = 1 if tau <= b else 1 / (a * (tau - b) + 1)    a, b >= 0

polynomial(0.5) is FedBuff's 1/sqrt(1 + tau); polynomial and hinge are FedAsync's (Xie et
al. 2019). Pure Python floats, no torch: the tests compare them exactly.
"""

import math
import operator
from dataclasses import dataclass
from typing import Callable, Optional, Union

from ..errors import InvalidArgument

KINDS = ("constant", "polynomial", "hinge")  # the one list; C codes PB_FED_STALENESS_<KIND>, Go Staleness*
PARAMETERS = {"constant": "", "polynomial": "a", "hinge": "ab"}  # what each kind's function takes, in order


@dataclass(frozen=True)
class Staleness:
    """One staleness function: kind (see KINDS) and its parameters a, b."""

    kind: str = "constant"
    a: float = 0.0
    b: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgument(f"unknown staleness function {self.kind!r}; choose one of {', '.join(KINDS)}")
        for name in ("a", "b"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidArgument(f"staleness {self.kind}'s {name} must be a finite number >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))

    def __call__(self, tau: int) -> float:
        try:
            tau = operator.index(tau)
        except TypeError:
            raise InvalidArgument(f"staleness must be a whole number of versions, got {tau!r}") from None
        if tau < 0:
            raise InvalidArgument(f"staleness must be >= 0, got {tau}")
        if self.kind == "polynomial":
            return float((1.0 + tau) ** -self.a)
        if self.kind == "hinge" and tau > self.b:
            return 1.0 / (self.a * (tau - self.b) + 1.0)
        return 1.0

    def __str__(self) -> str:
        return {"constant": "constant", "polynomial": f"polynomial(a={self.a:g})",
                "hinge": f"hinge(a={self.a:g}, b={self.b:g})"}[self.kind]


def constant() -> Staleness:
    return Staleness("constant")


def polynomial(a: float = 0.5) -> Staleness:
    return Staleness("polynomial", a)


def hinge(a: float = 10.0, b: float = 4.0) -> Staleness:
    return Staleness("hinge", a, b)


def parse(spec: Union[Staleness, str, None]) -> Staleness:
    """A Staleness from itself, None (constant) or a string "constant", "polynomial[:a]",
    "hinge[:a[:b]]" (the defaults above)."""
    if spec is None:
        return constant()
    if isinstance(spec, Staleness):
        return spec
    if not isinstance(spec, str):
        raise InvalidArgument(f"staleness must be a Staleness or a string such as 'polynomial:0.5', got {spec!r}")
    kind, *args = spec.split(":")
    make: Optional[Callable[..., Staleness]] = {"constant": constant, "polynomial": polynomial, "hinge": hinge}.get(kind)
    if make is None or len(args) > len(PARAMETERS[kind]):
        raise InvalidArgument(f"bad staleness {spec!r}: write constant, polynomial[:a] or hinge[:a[:b]]")
    try:
        values = [float(x) for x in args]
    except ValueError:
        raise InvalidArgument(f"bad staleness {spec!r}: its parameters must be numbers") from None
    return make(*values)
