"""One registry each for the federated modes (federated/modes.py), server strategies
(federated/strategies.STRATEGIES) and staleness functions (federated/staleness.KINDS):
every name has its C code in capi/pybridge.h (PB_FED_<MODE>, PB_FED_STRATEGY_<NAME>,
PB_FED_STALENESS_<KIND>) and a Go constant, and every code and Go constant has its name;
the C adapter and the MNIST example take the core's tables. No ranks, no library."""

import glob
import os
import re
import sys

import pytest

from pybridge import abi
from pybridge.errors import InvalidArgument
from pybridge.federated import modes, staleness, strategies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "capi"))
import gen_abi  # noqa: E402

# PB_FED_* constants that are not modes: the task commands and the metrics bound (the
# strategy and staleness codes are told apart by their prefixes). A new PB_FED_ constant
# is either a mode or listed here.
NOT_MODES = {"PB_FED_TRAIN", "PB_FED_EVALUATE", "PB_FED_MAX_METRICS"}
FAMILIES = {  # registry, C prefix, Go type of its constants
    "mode": (modes.MODES, "PB_FED_", "FedMode"),
    "strategy": (strategies.BUILTIN, "PB_FED_STRATEGY_", "FedStrategy"),
    "staleness": (staleness.KINDS, "PB_FED_STALENESS_", "Staleness"),
}


def _header_constants(prefix):
    names = {name for name, _, _ in gen_abi.constants(open(gen_abi.HEADER).read()) if name.startswith(prefix)}
    if prefix == "PB_FED_":
        names -= NOT_MODES | {n for n in names if n.startswith(("PB_FED_STRATEGY_", "PB_FED_STALENESS_"))}
    return names


def _go_constants(go_type):
    """{Go constant: the C constant it is}, for the constants of `go_type` in go/*.go."""
    found = {}
    for path in glob.glob(os.path.join(ROOT, "go", "*.go")):
        if not path.endswith("_test.go"):
            found.update(re.findall(rf"^\s*(\w+)\s+{go_type}\s*=\s*C\.(PB_\w+)", open(path).read(), re.M))
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_every_name_has_a_c_code_and_a_go_constant_and_back(family):
    names, prefix, go_type = FAMILIES[family]
    c_names = {prefix + n.upper() for n in names}
    assert _header_constants(prefix) == c_names, f"capi/pybridge.h's {prefix}* codes and the core's {family} names"
    values = [getattr(abi, c) for c in c_names]
    assert len(set(values)) == len(values), f"two {family} names share a C code"
    go = _go_constants(go_type)
    assert sorted(go.values()) == sorted(c_names), f"go's {go_type} constants {go} and the core's {family} names"


def test_the_c_adapter_derives_its_tables_from_the_registries():
    from pybridge.capi import fed_strategies, federated
    assert sorted(federated.MODES.values()) == sorted(modes.MODES)
    assert all(code == getattr(abi, "PB_FED_" + name.upper()) for code, name in federated.MODES.items())
    assert sorted(fed_strategies.STRATEGIES.values()) == sorted(strategies.BUILTIN)
    assert tuple(strategies.STRATEGIES)[:len(strategies.BUILTIN)] == strategies.BUILTIN  # then registered ones
    assert sorted(fed_strategies.STALENESS.values()) == sorted(staleness.KINDS)
    for code, name in fed_strategies.STRATEGIES.items():  # each C code builds the registered class
        made = fed_strategies._strategy(dict(fed_strategies._DEFAULTS, strategy=code))
        assert type(made) is strategies.STRATEGIES[name] and made.name == name


def test_a_bad_c_code_names_the_codes_from_the_registry():
    from pybridge.capi import fed_strategies
    with pytest.raises(InvalidArgument) as err:
        fed_strategies._strategy(dict(fed_strategies._DEFAULTS, strategy=99))
    for name in strategies.BUILTIN:
        assert f"PB_FED_STRATEGY_{name.upper()} ({getattr(abi, 'PB_FED_STRATEGY_' + name.upper())})" in str(err.value)


def test_build_gives_each_strategy_its_own_settings():
    adam = strategies.build("fedadam", eta=0.5, momentum=0.9, beta1=0.8, beta2=0.95, tau=1e-2)
    assert (type(adam), adam.eta, adam.beta1, adam.beta2, adam.tau) == (strategies.FedAdam, 0.5, 0.8, 0.95, 1e-2)
    sgd = strategies.build("fedavg", momentum=0.9, beta1=0.8)
    assert (type(sgd), sgd.eta, sgd.momentum) == (strategies.ServerSGD, 1.0, 0.9)
    with pytest.raises(InvalidArgument, match="unknown server strategy 'fedsgd'; choose one of fedavg"):
        strategies.build("fedsgd")
    with pytest.raises(InvalidArgument, match="no server strategy takes bta1"):
        strategies.build("fedadam", bta1=0.5)


def test_the_mnist_example_takes_the_registries():
    import importlib.util
    spec = importlib.util.spec_from_file_location("federated_example_registry",
                                                  os.path.join(ROOT, "examples", "mnist", "federated.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    for mode in modes.MODES:
        assert example.parse_args(["--mode", mode]).mode == mode
    for name in strategies.STRATEGIES:
        assert example.parse_args(["--server-opt", name]).server_opt == name
    source = open(example.__file__).read()
    assert not re.search(r"^[A-Z_]+ = \{", source, re.M), "a table of its own in examples/mnist/federated.py"


def test_every_built_in_strategy_is_exported_and_in_the_docs_table():
    # The recipe's two written lines for a built-in strategy (docs/design.md, "Adding a
    # federated strategy"): its class in pybridge/federated/__init__.py (a static import, so
    # type checkers see it) and its row in docs/federated.md's strategy table.
    import pybridge.federated as fed
    table = open(os.path.join(ROOT, "docs", "federated.md")).read().split("## Server strategies", 1)[1]
    for name in strategies.BUILTIN:
        cls = strategies.STRATEGIES[name]
        assert getattr(fed, cls.__name__, None) is cls and cls.__name__ in fed.__all__, \
            f"{cls.__name__} ({name!r}): import it in pybridge/federated/__init__.py and name it in __all__"
        assert f"`PB_FED_STRATEGY_{name.upper()}`" in table, \
            f"{name!r}: its row in docs/federated.md's strategy table (C column `PB_FED_STRATEGY_{name.upper()}`)"
