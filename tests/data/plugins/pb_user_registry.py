"""A user's module, outside the pybridge package: it registers a comm hook and a server
strategy by name, as a program's own module would. Python imports it; C and Go programs
load it into the library's interpreter (pb_import_module, ImportModule) and choose both by
name. tests/test_registries.py and go/registry_test.go use it."""

import torch

import pybridge
from pybridge.federated import register_strategy
from pybridge.federated.strategies import ServerOptimizer


class MaxState:
    """The hook's state: its group. It provides settings() (HookState): nothing to share."""

    def __init__(self, group):
        self.group = group

    def settings(self):
        return {"op": "max"}


def max_hook(state, bucket):
    """Each gradient becomes its largest value over the ranks (no averaging)."""
    return pybridge.all_reduce_future(bucket.buffer(), pybridge.MAX, group=state.group)


class ServerSignSGD(ServerOptimizer):
    """x <- x - eta * sign(g): signSGD at the server."""

    name = "signsgd"

    def __init__(self, eta=0.5, eta_l=None):
        super().__init__(eta, eta_l)

    def step(self, model, g, lr=None):
        model.sub_(torch.sign(g).to(model.dtype), alpha=self.eta if lr is None else lr)


pybridge.register_comm_hook("elementwise_max", max_hook, MaxState)
register_strategy("signsgd", ServerSignSGD)
