"""Server strategies: how the server applies a step's pseudo-gradient g (the weighted mean
of the clients' deltas, round model - trained weights; see buffered.UpdateBuffer) to its
flat model x, and central differential privacy.

    ServerSGD(eta, momentum)  x <- x - eta * g        (momentum m <- momentum * m + g, x <- x - eta * m)
                              eta 1, no momentum: FedAvg; with momentum: FedAvgM
    FedAdagrad / FedAdam / FedYogi (Reddi et al. 2021, "Adaptive Federated Optimization",
    Algorithm 2), with Delta = -g, m_{-1} = 0, v_{-1} = tau^2:
        m <- beta1 * m + (1 - beta1) * Delta
        v <- v + Delta^2                                        (FedAdagrad)
        v <- beta2 * v + (1 - beta2) * Delta^2                  (FedAdam)
        v <- v - (1 - beta2) * Delta^2 * sign(v - Delta^2)      (FedYogi)
        x <- x + eta * m / (sqrt(v) + tau)

The optimizers' state and arithmetic are float64 whatever the model's dtype; the model is
written once per step. ServerSGD without momentum steps in the model's dtype, exactly as
torch.optim.SGD does, so FedAvg rounds keep their bits. `eta_l` is the clients' learning
rate in the paper's notation: recorded with each step, used by the workers (the server
does not send it).

STRATEGIES is the one registry of strategies by name: the built-ins (BUILTIN, each with its
C code PB_FED_STRATEGY_<NAME>) and those a program registers with register_strategy. A
strategy provides `Strategy` (the Protocol FedAvgRounds relies on).
"""

import math
from typing import Any, Callable, Optional, Protocol, runtime_checkable

import torch

from ..base.checks import positive_finite
from ..base.registry import Registry, describe, provides
from ..errors import InvalidArgument


@runtime_checkable
class Strategy(Protocol):
    """name, eta, step(model, g, lr) and settings(): what FedAvgRounds uses of a server strategy.

    `name` is its key in STRATEGIES; `eta` the server learning rate a step given none uses
    (FedAvgRounds sets it when a round is given an lr); `step(model, g, lr)` moves the flat
    model by the pseudo-gradient g (float64, same length) at lr (None: eta);
    `settings()` is recorded with every step in `history`. A strategy class also says in
    `SETTINGS` which keywords besides eta it takes (C's pb_fed_options fields of those
    names reach it); none when it has no SETTINGS."""

    name: str
    eta: float

    def step(self, model: torch.Tensor, g: torch.Tensor, lr: float | None = None) -> None: ...

    def settings(self) -> dict[str, Any]: ...


def _unit(name: str, value: Any, *, closed: bool = False) -> float:
    """A number in [0, 1) (or [0, 1] with closed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or value > 1 or (value == 1 and not closed):
        raise InvalidArgument(f"{name} must be in [0, 1{']' if closed else ')'}, got {value!r}")
    return float(value)


class ServerOptimizer:
    """Applies pseudo-gradients to a flat model; `eta` is the server learning rate used
    when a step is given none. `name` is its key in STRATEGIES, `SETTINGS` the keywords
    besides eta and eta_l that build() passes it."""

    name = "?"
    SETTINGS: tuple[str, ...] = ()

    def __init__(self, eta: float, eta_l: Optional[float] = None) -> None:
        self.eta = positive_finite("eta", eta)
        self.eta_l = None if eta_l is None else positive_finite("eta_l", eta_l)

    def step(self, model: torch.Tensor, g: torch.Tensor, lr: Optional[float] = None) -> None:
        """model (flat, floating point) moves by the pseudo-gradient g (float64, same length)."""
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        return {"strategy": self.name, "eta": self.eta, "eta_l": self.eta_l}


class ServerSGD(ServerOptimizer):
    """FedAvg (eta 1.0) and FedAvgM (momentum > 0)."""

    name = "fedavg"
    SETTINGS = ("momentum",)

    def __init__(self, eta: float = 1.0, momentum: float = 0.0, eta_l: Optional[float] = None) -> None:
        super().__init__(eta, eta_l)
        self.momentum = _unit("momentum", momentum)
        self._m: Optional[torch.Tensor] = None

    def step(self, model: torch.Tensor, g: torch.Tensor, lr: Optional[float] = None) -> None:
        lr = self.eta if lr is None else lr
        if self.momentum:
            self._m = g.clone() if self._m is None else self._m.mul_(self.momentum).add_(g)
            g = self._m
        model.add_(g.to(model.dtype), alpha=-lr)  # torch.optim.SGD's arithmetic

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "momentum": self.momentum}


class _Adaptive(ServerOptimizer):
    SETTINGS = ("beta1", "beta2", "tau")

    def __init__(self, eta: float = 1e-2, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
                 eta_l: Optional[float] = None) -> None:
        super().__init__(eta, eta_l)
        self.beta1 = _unit("beta1", beta1)
        self.beta2 = _unit("beta2", beta2)
        self.tau = positive_finite("tau", tau)
        self.m: Optional[torch.Tensor] = None
        self.v: Optional[torch.Tensor] = None

    def _second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> None:
        """v (the second moment, in place) after a step whose squared delta is d2."""
        raise NotImplementedError

    def step(self, model: torch.Tensor, g: torch.Tensor, lr: Optional[float] = None) -> None:
        lr = self.eta if lr is None else lr
        delta = -g.to(torch.float64)
        m, v = self.m, self.v
        if m is None or v is None:  # both are set on the first step
            m = self.m = torch.zeros_like(delta)
            v = self.v = torch.full_like(delta, self.tau * self.tau)
        m.mul_(self.beta1).add_(delta, alpha=1 - self.beta1)
        self._second_moment(v, delta * delta)
        x = model.to(torch.float64) + lr * m / (v.sqrt() + self.tau)
        model.copy_(x)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "beta1": self.beta1, "beta2": self.beta2, "tau": self.tau}


class FedAdagrad(_Adaptive):
    name = "fedadagrad"

    def _second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> None:
        v.add_(d2)


class FedAdam(_Adaptive):
    name = "fedadam"

    def _second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> None:
        v.mul_(self.beta2).add_(d2, alpha=1 - self.beta2)


class FedYogi(_Adaptive):
    name = "fedyogi"

    def _second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> None:
        v.sub_((1 - self.beta2) * d2 * torch.sign(v - d2))


# The one registry of server strategies, by name: the built-ins, then register_strategy's.
# The built-ins' C codes are the header's PB_FED_STRATEGY_<NAME> and Go's FedStrategy
# constants (tests/test_federated_registry.py checks both); C's strategy_name, Go's
# WithServerOptimizerName and the MNIST example's --server-opt take any name here.
STRATEGIES: Registry[Callable[..., Any]] = Registry("server strategy")
for _builtin in (ServerSGD, FedAdagrad, FedAdam, FedYogi):
    STRATEGIES.register(_builtin.name, _builtin)
BUILTIN = tuple(STRATEGIES)  # the names with a C code


def _settings_of(make: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(getattr(make, "SETTINGS", ()))


def register_strategy(name: str, make: Callable[..., Any]) -> None:
    """Register the server strategy `make` as `name`, for FedAvgRounds' users to choose by
    name: `strategies.build(name)`, C's `pb_fed_options.strategy_name`, Go's
    `WithServerOptimizerName`. `make(eta=..., **settings)` builds it (a class, usually a
    ServerOptimizer subclass), its `SETTINGS` naming the keywords besides eta it takes.
    Checked here by building one with its defaults (what a C caller's eta 0 asks for),
    which must provide `Strategy` with `name` equal to `name`.

    As torch's rendezvous registry: registering the same class again does nothing; another
    under a registered name (a built-in's included) is InvalidArgument naming both. Each
    process that chooses it registers it: a C or Go program imports the module that does
    (pb_import_module, ImportModule)."""
    what = f"register_strategy({name!r}, {describe(make)})"
    if not callable(make):
        raise InvalidArgument(f"{what}: the strategy must be a class (or callable) building it, got {make!r}")
    settings = getattr(make, "SETTINGS", ())
    if not isinstance(settings, (tuple, list)) or not all(isinstance(k, str) for k in settings):
        raise InvalidArgument(f"{what}: SETTINGS must be a tuple of keyword names, got {settings!r}")
    try:
        probe = make()
    except Exception as exc:
        raise InvalidArgument(f"{what}: {describe(make)}() must build a strategy with its defaults, "
                              f"but raised {type(exc).__name__}: {exc}") from exc
    provides(f"{what}: {describe(make)}()", probe, Strategy)
    if probe.name != name:
        raise InvalidArgument(f"{what}: its name is {probe.name!r}, not {name!r} (settings() and the "
                              "history name a strategy by `name`)")
    STRATEGIES.register(name, make)


def build(name: str, eta: Optional[float] = None, **settings: Any) -> Strategy:
    """The strategy registered as `name`, at server learning rate `eta` (None: its default),
    given those of `settings` it takes (its SETTINGS) and none of the others: a C caller
    passes every pb_fed_options field whatever the strategy."""
    make = STRATEGIES.lookup(name)
    unknown = sorted(set(settings).difference(*(_settings_of(c) for c in STRATEGIES.values())))
    if unknown:
        raise InvalidArgument(f"no server strategy takes {', '.join(unknown)}")
    given = {k: v for k, v in settings.items() if k in _settings_of(make)}
    strategy: Strategy = make(**given) if eta is None else make(eta=eta, **given)
    return strategy


class CentralDP:
    """Central differential privacy at the server (DP-FedAvg, McMahan et al. 2018): each
    client's delta is clipped to L2 norm `clip_norm` (C), the step's n clients are weighted
    equally, and the mean gets Gaussian noise of standard deviation
    noise_multiplier * C / n, drawn in float64 from a generator seeded with `seed`."""

    def __init__(self, clip_norm: float, noise_multiplier: float, seed: int = 0) -> None:
        self.clip_norm = positive_finite("clip_norm", clip_norm)
        if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, (int, float)) \
                or not math.isfinite(noise_multiplier) or noise_multiplier < 0:
            raise InvalidArgument(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier!r}")
        self.noise_multiplier = float(noise_multiplier)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidArgument(f"seed must be an integer, got {seed!r}")
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def clip(self, delta: torch.Tensor) -> bool:
        """Scale `delta` (float64, in place) to norm C at most; True if it was scaled."""
        norm = float(torch.linalg.vector_norm(delta))
        if norm > self.clip_norm:
            delta.mul_(self.clip_norm / norm)
            return True
        return False

    def noise(self, numel: int, clients: int) -> tuple[torch.Tensor, float]:
        """The noise of a step over `clients` clients (float64, on the CPU) and its std."""
        std = self.noise_multiplier * self.clip_norm / clients
        return torch.randn(numel, dtype=torch.float64, generator=self.generator) * std, std
