"""The federated server's modes, named once (the C codes map to these: capi/federated.py).

async and sync hand clients out in rounds (server.py); fedbuff and fedasync hand them out
across model versions, buffered (buffered.py)."""

ROUNDS = ("async", "sync")
BUFFERED = ("fedbuff", "fedasync")
MODES = ROUNDS + BUFFERED

__all__ = ["ROUNDS", "BUFFERED", "MODES"]
