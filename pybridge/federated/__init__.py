"""Federated training with asynchronous client assignment: rank 0 of a group is the server,
the other ranks are workers holding the clients' data (see docs/federated.md)."""

from .aggregate import FedAvg
from .buffered import StaleUpdate
from .fedprox import add_proximal_grad, proximal_loss
from .protocol import EVALUATE, TRAIN, Header
from .rounds import FedAvgRounds
from .sampling import sample_clients
from .results import Result, RoundResults
from .server import Server
from .staleness import Staleness
from .strategies import CentralDP, FedAdagrad, FedAdam, FedYogi, ServerSGD, Strategy, register_strategy
from .worker import Task, Worker

__all__ = ["FedAvg", "FedAvgRounds", "Server", "Result", "RoundResults", "Worker", "Task", "Header", "TRAIN",
           "EVALUATE", "sample_clients", "ServerSGD", "FedAdam", "FedYogi", "FedAdagrad", "CentralDP", "Staleness",
           "Strategy", "register_strategy", "StaleUpdate", "proximal_loss", "add_proximal_grad"]
