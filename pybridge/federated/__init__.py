"""Federated training with asynchronous client assignment: rank 0 of a group is the server,
the other ranks are workers holding the clients' data (see docs/federated.md)."""

from .aggregate import FedAvg
from .protocol import EVALUATE, TRAIN, Header
from .rounds import FedAvgRounds
from .sampling import sample_clients
from .server import Result, RoundResults, Server
from .worker import Task, Worker

__all__ = ["FedAvg", "FedAvgRounds", "Server", "Result", "RoundResults", "Worker", "Task", "Header", "TRAIN",
           "EVALUATE", "sample_clients"]
