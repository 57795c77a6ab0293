"""FedAvg rounds over a flat model, run by the server: the one implementation behind the C
ABI's and Go's federated server, usable from Python too.

The caller's model buffer is read when a round starts and written only by `aggregate`, so
it may change (or, from C, go away) in between: the rounds keep their own copy of the
round's model, which FedAvg updates. Each round gets a fresh FedAvg with plain SGD, whose
learning rate is the one given to `aggregate`.
"""

import torch

from ..checks import positive_finite
from ..errors import InvalidArgument
from .aggregate import FedAvg
from .protocol import TRAIN, flat


class FedAvgRounds:
    """FedAvg rounds driven through `server` (a Server, which this object then owns: close()
    closes it).

        rounds = FedAvgRounds(Server(g, requeue=True))
        for r in range(100):
            rounds.start(clients, model)           # copies model
            for result in rounds:                  # completion order; TRAIN ones are summed
                log(result)
            rounds.aggregate(lr=1.0, out=model)    # the new model, written into `model`

    or `rounds.train_round(clients, model, lr=1.0)` for all three steps. Use it from one thread.
    """

    def __init__(self, server):
        self.server = server
        self.model = None  # the server's flat copy of the current round's model (FedAvg's parameter)
        self._results = None  # the current round's iterator
        self._avg = None  # the current round's FedAvg

    @property
    def started(self):
        """Whether a round was started (its results may all be taken)."""
        return self._avg is not None

    def start(self, clients, model, *, evaluate=False):
        """Start a round on a copy of `model` (a floating-point tensor, flattened): train
        `clients` (or evaluate them, `evaluate=True`). An unfinished round is dropped."""
        m = flat(model, "model")
        if not m.dtype.is_floating_point:
            raise InvalidArgument(f"the model must have a floating-point dtype, got {m.dtype}")
        if self.model is None or self.model.numel() != m.numel() or self.model.dtype != m.dtype \
                or self.model.device != m.device:
            self.model = torch.empty(m.numel(), dtype=m.dtype, device=m.device)
        self.model.copy_(m)
        self._results = self._avg = None  # an earlier round's are of no use now, even if this start fails
        self._results = self.server.run_round(clients, self.model, evaluate=evaluate)
        self._avg = FedAvg([self.model], torch.optim.SGD([self.model], lr=1.0))

    def next_result(self):
        """The round's next Result in completion order (a TRAIN one is added to the round's
        FedAvg sum), or None once the round is over. A worker's failure raises and ends the round."""
        if self._results is None:
            raise InvalidArgument("no round was started: call start first")
        r = next(self._results, None)
        if r is not None and r.command == TRAIN:
            self._avg.add(r)
        return r

    def __iter__(self):
        return iter(self.next_result, None)

    def aggregate(self, lr=1.0, out=None):
        """FedAvg over the TRAIN results taken this round, applied by SGD at `lr` (1.0: plain
        FedAvg) to the server's model, which is then copied into `out` (a tensor of the
        model's size and dtype) if given. Returns the number of clients aggregated. Refused
        when no training result was taken since the round started (or since the last call)."""
        if self._avg is None:
            raise InvalidArgument("no round was started: call start first")
        lr = positive_finite("lr", lr)
        if out is not None and not isinstance(out, torch.Tensor):
            raise InvalidArgument(f"out must be a torch tensor, got {type(out).__name__}")
        if out is not None and (out.numel() != self.model.numel() or out.dtype != self.model.dtype):
            raise InvalidArgument(f"the model to write must match the round's model ({self.model.numel()} x "
                                  f"{self.model.dtype}); got {out.numel()} x {out.dtype}")
        self._avg.optimizer.param_groups[0]["lr"] = lr
        count = self._avg.step()
        if out is not None:
            out.detach().copy_(self.model.view(out.shape))
        return count

    def train_round(self, clients, model, lr=1.0):
        """One whole training round: start, take every result, aggregate into `model` (in
        place). Returns the number of clients aggregated."""
        self.start(clients, model)
        for _ in self:
            pass
        return self.aggregate(lr, out=model)

    def close(self):
        """Drop the round and close the server (terminating the workers)."""
        self._results = self._avg = None
        self.server.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
