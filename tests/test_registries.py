"""Open registries: a user's module outside the package (tests/data/plugins/pb_user_registry.py)
registers a comm hook and a server strategy by name, and Python, a C program
(tests/c/registries.c) and Go (go/registry_test.go) choose them by name and train or
aggregate with them on 2 ranks. Registering follows torch's rendezvous registry (the same
entry again is a no-op, another under a taken name is refused naming both), a registered
hook or strategy is checked against its Protocol (naming what it lacks), and an unknown
name is refused naming every choice."""

import doctest
import functools
import os
import subprocess
import sys

import pytest
import torch

from capi_loader import LIB_PATH, ROOT, pybridge_flags, run_two_ranks
from pybridge.algorithms import comm_hooks
from pybridge.errors import InvalidArgument
from pybridge.federated import strategies
from ranks import run_ranks

PLUGINS = os.path.join(ROOT, "tests", "data", "plugins")


def _plugin():
    if PLUGINS not in sys.path:
        sys.path.insert(0, PLUGINS)
    import pb_user_registry
    return pb_user_registry


# ---- registering (no ranks) -------------------------------------------------------------


def test_the_user_module_registers_once_and_a_second_import_changes_nothing():
    plugin = _plugin()
    assert comm_hooks.HOOKS["elementwise_max"] == comm_hooks.Registered(plugin.max_hook, plugin.MaxState)
    assert strategies.STRATEGIES["signsgd"] is plugin.ServerSignSGD
    # torch's rule: the same entry again is a no-op (a module run twice registers again)
    comm_hooks.register_comm_hook("elementwise_max", plugin.max_hook, plugin.MaxState)
    strategies.register_strategy("signsgd", plugin.ServerSignSGD)
    assert list(comm_hooks.HOOKS)[:5] == ["allreduce", "fp16", "bf16", "powersgd", "hierarchical"]
    assert strategies.BUILTIN == ("fedavg", "fedadagrad", "fedadam", "fedyogi")


def test_a_taken_name_is_refused_naming_both():
    plugin = _plugin()

    def other(state, bucket):
        return plugin.max_hook(state, bucket)
    with pytest.raises(InvalidArgument, match=r"the comm hook 'elementwise_max' cannot be registered with "
                                              r"test_registries\.test_a_taken_name_is_refused_naming_both\.<locals>\.other "
                                              r"\(state pybridge\.algorithms\.contract\.HookContext\) as it is already "
                                              r"registered with pb_user_registry\.max_hook \(state pb_user_registry\.MaxState\)"):
        comm_hooks.register_comm_hook("elementwise_max", other)
    with pytest.raises(InvalidArgument, match="the comm hook 'fp16' cannot be registered .* already registered with the built-in hook PB_HOOK_FP16$"):
        comm_hooks.register_comm_hook("fp16", other)
    class MyAdam(plugin.ServerSignSGD):
        name = "fedadam"
    with pytest.raises(InvalidArgument, match=r"the server strategy 'fedadam' cannot be registered with "
                                              r"test_registries\..*\.MyAdam as it is already registered with "
                                              r"pybridge\.federated\.strategies\.FedAdam"):
        strategies.register_strategy("fedadam", MyAdam)
    for bad in ("", "two words", 3):
        with pytest.raises(InvalidArgument, match="name must be a non-empty string without spaces"):
            comm_hooks.register_comm_hook(bad, other)


def test_registering_checks_the_protocols_naming_what_is_missing():
    class NoSettings:
        def __init__(self, group):
            self.group = group

    with pytest.raises(InvalidArgument, match=r"register_comm_hook\('h1', .*\): the hook must be callable as "
                                              r"hook\(state, bucket\) -> Future \(CommHook\); .* takes \(bucket\)"):
        comm_hooks.register_comm_hook("h1", lambda bucket: None)
    with pytest.raises(InvalidArgument, match=r"the state class .*NoSettings does not provide settings\(\) "
                                              r"\(HookState: settings\(\): what every rank must share"):
        comm_hooks.register_comm_hook("h2", comm_hooks.allreduce_hook, NoSettings)
    with pytest.raises(InvalidArgument, match=r"state must be callable as state\(group\)"):
        comm_hooks.register_comm_hook("h3", comm_hooks.allreduce_hook, object())
    assert not {"h1", "h2", "h3"} & set(comm_hooks.HOOKS)
    # A factory that is not a class is checked when the hook is built, by name.
    comm_hooks.register_comm_hook("h4", comm_hooks.allreduce_hook, functools.partial(NoSettings))
    with pytest.raises(InvalidArgument, match=r"comm hook 'h4': its state .*NoSettings does not provide settings\(\)"):
        comm_hooks.by_name("h4").build(None)

    class NoStep:
        name, SETTINGS = "nostep", ()

        def __init__(self, eta=1.0):
            self.eta = eta

        def settings(self):
            return {}

    class Misnamed(strategies.ServerSGD):
        name = "other"

    class NeedsEta(strategies.ServerOptimizer):
        name = "needseta"
    with pytest.raises(InvalidArgument, match=r"register_strategy\('nostep', .*NoStep\): .*NoStep\(\) does not "
                                              r"provide step\(\) \(Strategy: name, eta, step"):
        strategies.register_strategy("nostep", NoStep)
    with pytest.raises(InvalidArgument, match="its name is 'other', not 'misnamed'"):
        strategies.register_strategy("misnamed", Misnamed)
    with pytest.raises(InvalidArgument, match=r"NeedsEta\(\) must build a strategy with its defaults, but raised "
                                              r"TypeError"):
        strategies.register_strategy("needseta", NeedsEta)
    assert not {"nostep", "misnamed", "needseta"} & set(strategies.STRATEGIES)


def test_an_unknown_name_is_refused_naming_every_choice():
    _plugin()
    with pytest.raises(InvalidArgument, match="unknown comm hook 'nope'; choose one of allreduce, fp16, bf16, "
                                              "powersgd, hierarchical, .*elementwise_max"):
        comm_hooks.by_name("nope")
    with pytest.raises(InvalidArgument, match="unknown server strategy 'nope'; choose one of fedavg, fedadagrad, "
                                              "fedadam, fedyogi, .*signsgd"):
        strategies.build("nope")
    # built-ins by name are the built-ins by code, with their settings
    assert comm_hooks.by_name("powersgd", rank=2).identity() == \
        comm_hooks.BuiltinHook(comm_hooks.HOOK_POWERSGD, rank=2).identity()
    assert type(strategies.build("signsgd", eta=0.1, momentum=0.9)).__name__ == "ServerSignSGD"


def test_register_comm_hooks_docstring_example_runs():
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(comm_hooks.register_comm_hook, "register_comm_hook",
                                             globs={}):
        runner.run(test)
    assert runner.tries >= 3 and runner.failures == 0


# ---- Python, 2 ranks ------------------------------------------------------------------


def python_rank(rank, world):
    import pybridge
    from pybridge.federated import FedAvgRounds, Server, Worker
    _plugin()
    pybridge.init(backend="gloo", timeout=60)
    # a reducer with the registered hook, by name: each gradient becomes its largest value
    red = pybridge.Reducer([(4, "float32"), (2, "float32")], hook="elementwise_max", bucket_cap_mb=1e-6)
    seen = []
    for step in range(3):
        red.set_grad(0, torch.tensor([rank, -rank, 2.0 * step, -2.0 * step]) * (rank + 1))
        red.set_grad(1, torch.tensor([float(rank), float(step)]))
        red.wait()
        seen.append([g.tolist() for g in red.grads()])
    red.close()
    # a rank whose hook differs is refused on every rank, naming both
    try:
        pybridge.Reducer([(4, "float32")], hook="elementwise_max" if rank == 0 else "allreduce")
        mismatch = None
    except InvalidArgument as exc:
        mismatch = str(exc)
    # the registered strategy, by name: rank 0 serves, rank 1 trains
    model = torch.zeros(3)
    if rank == 0:
        rounds = FedAvgRounds(Server(pybridge.current(), timeout=60), strategy=strategies.build("signsgd", eta=0.25))
        for _ in range(2):
            rounds.train_round([0, 1, 2], model)
        history = [h["strategy"] for h in rounds.history]
        rounds.close()
    else:
        Worker(pybridge.current()).serve(lambda m, c: (m + torch.tensor([1.0, -1.0, 0.0]) * (c + 1), c + 1))
        history = None
    pybridge.finalize()
    return seen, mismatch, model.tolist(), history


def test_python_chooses_the_registered_hook_and_strategy_by_name():
    results = run_ranks(python_rank, 2, timeout=120)
    for seen, mismatch, model, history in results:
        for step, (g0, g1) in enumerate(seen):
            assert g0 == [2.0, 0.0, 4.0 * step, -2.0 * step] and g1 == [1.0, float(step)]  # max over the ranks
        assert "elementwise_max" in mismatch and "allreduce_hook" in mismatch, mismatch
    # sign(pseudo-gradient) = sign(model - weights) = (-1, 1, 0): x <- x - 0.25 sign(g), twice
    assert results[0][2] == [0.5, -0.5, 0.0] and results[0][3] == ["signsgd", "signsgd"]


# ---- C: the options' names, converted (one process) -----------------------------------


def c_options_rank(rank, world):
    from capi_loader import load
    _plugin()
    ffi, lib = load()
    assert lib.pb_import_module(b"pb_user_registry") == 0  # starts the library's core here
    from pybridge import abi, capi
    from pybridge.capi import fed_strategies, reducer

    def named(text, **fields):
        return dict(fields, hook_name=capi.ffi.new("char[]", text.encode()))
    hook = reducer._hook(dict(reducer._DEFAULTS, **named("fp16")))
    assert hook.identity() == reducer._hook(dict(reducer._DEFAULTS, hook=abi.PB_HOOK_FP16)).identity()
    hook = reducer._hook(dict(reducer._DEFAULTS, **named("powersgd", hook_rank=2)))
    assert hook.identity() == comm_hooks.BuiltinHook(comm_hooks.HOOK_POWERSGD, rank=2).identity()
    assert isinstance(reducer._hook(dict(reducer._DEFAULTS, **named("elementwise_max"))), comm_hooks.NamedHook)
    errors = []
    for bad in (dict(hook=abi.PB_HOOK_FP16), dict(gossip_topology=abi.PB_GOSSIP_CUBE)):
        try:
            reducer._hook(dict(reducer._DEFAULTS, **named("elementwise_max", **bad)))
        except InvalidArgument as exc:
            errors.append(str(exc))
    fed = dict(fed_strategies._DEFAULTS, strategy_name=capi.ffi.new("char[]", b"fedadam"), beta1=0.8)
    adam = fed_strategies._strategy(fed)
    try:
        fed_strategies._strategy(dict(fed, strategy=abi.PB_FED_STRATEGY_FEDYOGI))
    except InvalidArgument as exc:
        errors.append(str(exc))
    return errors, type(adam).__name__, adam.beta1


@pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")
def test_c_options_choose_built_ins_by_name_too_and_one_way_only():
    [(errors, adam, beta1)] = run_ranks(c_options_rank, 1, timeout=60)
    assert (adam, beta1) == ("FedAdam", 0.8)
    assert errors == ["pb_reducer_options.hook_name is 'elementwise_max' but hook or gossip_topology is set too; "
                      "choose the hook one way"] * 2 + [
        "pb_fed_options.strategy_name is 'fedadam' but strategy is set too; choose the strategy one way"]


# ---- a C program, 2 ranks -------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")
def test_a_c_program_chooses_them_by_name(tmp_path):
    exe = tmp_path / "registries"
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", str(exe), os.path.join(ROOT, "tests", "c", "registries.c"),
                    *pybridge_flags()], check=True)
    for rank, (code, out) in enumerate(run_two_ranks(exe, env={"PYBRIDGE_PYTHONPATH": PLUGINS}, timeout=120)):
        assert code == 0 and "registries: 0 failed checks" in out, f"rank {rank} exited {code}:\n{out}"
