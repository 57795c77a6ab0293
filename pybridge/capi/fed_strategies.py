"""C ABI functions for the federated server's strategies, buffered modes and central DP
(capi/pybridge.h, "Federated server strategies"). Conversion only: the logic is
pybridge/federated/strategies.py, buffered.py and staleness.py, run by FedAvgRounds."""

from .. import abi, capi
from ..errors import InvalidArgument
from ..federated import FedAvgRounds, strategies
from ..federated import staleness as _staleness
from ..federated.strategies import CentralDP
from . import options
from .federated import _not_null, _server, choices, codes

# pb_fed_options: each field and the default pb_fed_options_init gives it, in struct order.
_DEFAULTS = {"strategy": abi.PB_FED_STRATEGY_FEDAVG, "eta": 0.0, "momentum": 0.0, "beta1": 0.9, "beta2": 0.99,
             "tau": 1e-3, "buffer_size": 0, "staleness": abi.PB_FED_STALENESS_CONSTANT, "staleness_a": -1.0,
             "staleness_b": -1.0, "max_staleness": -1, "dp_clip_norm": 0.0, "dp_noise_multiplier": 0.0,
             "dp_seed": 0, "strategy_name": None}
STRATEGIES = codes("PB_FED_STRATEGY_", strategies.BUILTIN)  # pb_fed_options.strategy -> the core's name
STALENESS = codes("PB_FED_STALENESS_", _staleness.KINDS)  # pb_fed_options.staleness -> the core's kind
# The strategies' settings (each a pb_fed_options field of the same name), from the built-ins.
_SETTINGS = sorted({k for name in strategies.BUILTIN for k in strategies.STRATEGIES[name].SETTINGS})


def _strategy(o):
    name = options.name(o["strategy_name"], "pb_fed_options.strategy_name")
    if name is not None:
        if o["strategy"] != _DEFAULTS["strategy"]:
            raise InvalidArgument(f"pb_fed_options.strategy_name is {name!r} but strategy is set too; choose "
                                  "the strategy one way")
    else:
        name = STRATEGIES.get(o["strategy"])
    if name is None:
        raise InvalidArgument(f"pb_fed_options.strategy must be {choices('PB_FED_STRATEGY_', STRATEGIES)}, "
                              f"got {o['strategy']}")
    return strategies.build(name, eta=None if o["eta"] == 0 else o["eta"], **{k: o[k] for k in _SETTINGS})


def _buffered(o):
    """FedAvgRounds' buffered keywords that differ from the defaults (None: not given)."""
    kind = STALENESS.get(o["staleness"])
    if kind is None:
        raise InvalidArgument(f"pb_fed_options.staleness must be {choices('PB_FED_STALENESS_', STALENESS)}, "
                              f"got {o['staleness']}")
    params = {name: o[f"staleness_{name}"] for name in _staleness.PARAMETERS[kind]
              if o[f"staleness_{name}"] >= 0}  # < 0: the function's default
    return {"buffer_size": o["buffer_size"] or None,
            "staleness": None if kind == "constant" else getattr(_staleness, kind)(**params),
            "max_staleness": None if o["max_staleness"] == -1 else o["max_staleness"]}


def pb_fed_server_configure(server, opts):
    s = _server(server)
    o = options.read(opts, "pb_fed_options", _DEFAULTS)
    if s.rounds.started:
        raise InvalidArgument("configure the federated server before its first round")
    dp = None if o["dp_clip_norm"] == 0 else CentralDP(o["dp_clip_norm"], o["dp_noise_multiplier"], o["dp_seed"])
    if dp is None and o["dp_noise_multiplier"] != 0:
        raise InvalidArgument("pb_fed_options.dp_noise_multiplier is set but dp_clip_norm is 0: "
                              "central DP needs a clip norm")
    buffered = {k: v for k, v in _buffered(o).items() if v is not None}
    s.rounds = FedAvgRounds(s.rounds.server, strategy=_strategy(o), dp=dp, **buffered)


def pb_fed_server_last_step(server, out, has_step, refused):
    s = _server(server)
    _not_null((out, "out"), (has_step, "has_step"))
    capi.ffi.memmove(out, bytes(capi.ffi.sizeof("pb_fed_step")), capi.ffi.sizeof("pb_fed_step"))
    has_step[0] = 0
    if refused != capi.ffi.NULL:
        refused[0] = len(s.rounds.refused)
    if not s.rounds.history:
        return
    h = s.rounds.history[-1]
    out.version, out.clients, out.samples, out.lr = h["version"], h["clients"], h["samples"], h["lr"]
    out.max_staleness = max(h["staleness"])
    out.clipped = h.get("clipped", 0)
    out.clip_norm, out.noise_multiplier = h.get("clip_norm", 0.0), h.get("noise_multiplier", 0.0)
    out.noise_std = h.get("noise_std", 0.0)
    has_step[0] = 1
