"""The federated pieces that need no ranks: the header's encoding and its checks, and
FedAvg's arithmetic (weights, order independence, misuse)."""

import pytest
import torch

from pybridge.errors import CorruptData, InvalidArgument
from pybridge.federated import EVALUATE, TRAIN, FedAvg, Header, Result
from pybridge.federated.protocol import HEADER_LEN, UPDATE


def test_a_header_round_trips_through_its_tensor():
    h = Header(TRAIN, round=7, client=42, samples=600, length=1 << 33, dtype=0, seq=9, metrics=25)
    t = h.tensor()
    assert t.dtype == torch.int64 and t.tolist() == [TRAIN, 7, 42, 600, 1 << 33, 0, 9, 25] and len(t) == HEADER_LEN
    assert Header.parse(t) == h and Header.parse(t).name == "train"


@pytest.mark.parametrize("fields,words", [
    ([99, 1, 0, 0, 0, 0, 0, 0], "unknown command 99"),
    ([UPDATE, 1, -1, 0, -5, 0, 0, 0], "bad payload"),
    ([UPDATE, 1, -1, 0, 4, 77, 0, 0], "dtype code 77"),
    ([TRAIN, 1, 3, -2, 4, 0, 1, 0], "negative sample count"),
    ([TRAIN, 1, 3, 2, 4, 0, 1, 1 << 20], "bytes of metrics"),
])
def test_a_corrupt_header_is_refused(fields, words):
    with pytest.raises(CorruptData, match=words):
        Header.parse(torch.tensor(fields, dtype=torch.int64))


def _result(client, payload, samples, command=TRAIN, round=1):
    return Result(command, round, client, 1, samples, payload, 0.0)


def test_fedavg_is_the_sample_weighted_mean_and_ignores_arrival_order():
    gen = torch.Generator().manual_seed(5)
    deltas = [torch.randn(1000, generator=gen) for _ in range(12)]
    models = []
    for order in (range(12), reversed(range(12)), [5, 0, 11, 3, 8, 1, 10, 2, 7, 4, 9, 6]):
        w = torch.nn.Parameter(torch.ones(10, 100))
        avg = FedAvg([w])
        for c in order:
            avg.add(_result(c, deltas[c], c + 1))
        assert avg.step() == 12
        models.append(w.detach().clone())
    want = 1 - (sum((c + 1) * deltas[c].double() for c in range(12)) / 78).float().view(10, 100)
    torch.testing.assert_close(models[0], want, rtol=0, atol=1e-6)
    # float64 sums: every order rounds to the same float32 model (for this seed, bit for bit)
    assert torch.equal(models[0], models[1]) and torch.equal(models[0], models[2])


def test_fedavg_splits_the_flat_update_over_parameters_and_uses_the_optimizer():
    a, b = torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))
    avg = FedAvg([a, b], torch.optim.SGD([a, b], lr=0.5))
    assert avg.numel == 10 and avg.vector().tolist() == [0.0] * 10
    avg.add(_result(0, -torch.arange(10.0), 2))
    avg.step()
    assert a.tolist() == [[0.0, 0.5, 1.0], [1.5, 2.0, 2.5]] and b.tolist() == [3.0, 3.5, 4.0, 4.5]
    assert avg.vector().tolist() == [i / 2 for i in range(10)]


def test_fedavg_misuse_is_refused():
    w = torch.nn.Parameter(torch.zeros(3))
    avg = FedAvg([w])
    with pytest.raises(InvalidArgument, match="no samples"):
        avg.step()
    avg.add(_result(4, torch.ones(3), 1))
    with pytest.raises(InvalidArgument, match="client 4 was already added"):
        avg.add(_result(4, torch.ones(3), 1))
    with pytest.raises(InvalidArgument, match="has 2 elements"):
        avg.add(_result(5, torch.ones(2), 1))
    with pytest.raises(InvalidArgument, match="evaluated"):
        avg.add(_result(6, torch.ones(3), 1, EVALUATE))
    with pytest.raises(InvalidArgument, match="at least one"):
        FedAvg([])
    with pytest.raises(InvalidArgument, match="one floating-point dtype"):
        FedAvg([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])


def test_fedavg_refuses_stale_results_and_drops_an_unfinished_round():
    w = torch.nn.Parameter(torch.zeros(2))
    avg = FedAvg([w])
    avg.add(_result(0, torch.ones(2), 1, round=3))  # round 3 fails after this client
    avg.add(_result(1, torch.ones(2), 1, round=4))  # round 4 starts: round 3's sum is dropped
    assert avg.round == 4 and avg.clients == {1}
    avg.add(_result(0, -torch.ones(2), 3, round=4))  # re-adding the client of the failed round works
    with pytest.raises(InvalidArgument, match="client 7's result is stale: it is from round 3, and this "
                                              "FedAvg is summing round 4"):
        avg.add(_result(7, torch.ones(2), 1, round=3))
    assert avg.step() == 2 and w.tolist() == [0.5, 0.5]  # -(1 - 3) / 4: round 3's +1 is not in it
    with pytest.raises(InvalidArgument, match="stale: it is from round 4, and round 4 was already aggregated"):
        avg.add(_result(2, torch.ones(2), 1, round=4))
    avg.add(_result(2, torch.ones(2), 1, round=5))
    avg.reset()
    with pytest.raises(InvalidArgument, match="no samples"):
        avg.step()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fedavg_applies_no_sum_with_nan_or_inf(bad):
    w = torch.nn.Parameter(torch.zeros(3))
    avg = FedAvg([w])
    avg.add(_result(0, torch.tensor([1.0, bad, 0.0]), 1))
    with pytest.raises(InvalidArgument, match=r"NaN or Inf \(an update of clients \[0\]"):
        avg.step()
    assert w.tolist() == [0.0] * 3 and avg.clients == set()  # reset: the client may be added again
    avg.add(_result(0, torch.ones(3), 1))
    avg.step()
    assert w.tolist() == [-1.0] * 3


@pytest.mark.parametrize("values,why", [
    ([1.0, float("nan"), 2.0], "1 of 3 elements are NaN or Inf"),
    ([float("inf"), float("-inf"), 2.0], "2 of 3 elements are NaN or Inf"),
    ([3.0, 4.0], "its L2 norm 5 exceeds the server's max_norm 4.5"),
])
def test_integrity_refuses_non_finite_and_too_large_updates(values, why):
    from pybridge.federated.integrity import refusal
    assert refusal(torch.tensor(values), max_norm=4.5) == why
    assert refusal(torch.tensor([3.0, 4.0]), max_norm=5.0) is None
    assert refusal(torch.tensor([3.0, 4.0])) is None
    # a float16 update whose norm overflows float16 but is finite
    assert refusal(torch.full((4,), 60000.0, dtype=torch.float16)) is None
    assert "overflows" in refusal(torch.full((4,), 1e300, dtype=torch.float64))


@pytest.mark.parametrize("given,kept", [(None, None), (0, None), (0.0, None), (2, 2.0), (1e-3, 1e-3)])
def test_max_norm_zero_or_none_is_no_bound(given, kept):
    from pybridge.federated.integrity import max_norm_setting
    assert max_norm_setting(given) == kept


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), True, "3"])
def test_a_bad_max_norm_is_refused_with_one_message(bad):
    """The message C's pb_fed_server_set_max_norm and Go's WithMaxNorm give too
    (tests/test_capi_federated.py compares them)."""
    from pybridge.federated.integrity import max_norm_setting
    with pytest.raises(InvalidArgument) as err:
        max_norm_setting(bad)
    assert str(err.value) == f"max_norm must be a finite number >= 0 (0 or None: no bound), got {bad!r}"


def test_metrics_round_trip_exactly_and_average_by_samples():
    from pybridge.federated import metrics
    m = metrics.check({"loss": 0.1, "accuracy": 1 / 3, "n/top-5": 7})
    assert metrics.decode(metrics.encode(m)) == m == {"loss": 0.1, "accuracy": 1 / 3, "n/top-5": 7.0}
    assert metrics.decode(b"") == {} and metrics.check(None) == {}
    rm = metrics.RoundMetrics()
    rm.add(1, {"loss": 0.5, "accuracy": 0.25})
    rm.add(3, {"loss": 0.1})
    rm.add(0, {"zero": 4.0})
    rm.add(0, {"zero": 2.0})
    assert rm.means() == {"loss": (0.5 + 3 * 0.1) / 4, "accuracy": 0.25, "zero": 3.0}
    for bad, words in [({"a b": 1.0}, "not an identifier"), ({"x" * 65: 1}, "not an identifier"),
                       ({"loss": "high"}, "must be a number"), ({"ok": True}, "must be a number"),
                       ({f"m{i}": 0 for i in range(33)}, "at most 32"), ([1.0], "must be a dict")]:
        with pytest.raises(InvalidArgument, match=words):
            metrics.check(bad)
    with pytest.raises(CorruptData, match="name=value"):
        metrics.decode(b"loss")


def test_client_sampler_is_reproducible_by_seed_and_round():
    from pybridge.federated import sample_clients
    a = sample_clients(100, 10, seed=7, round=3)
    assert a == sample_clients(100, 10, seed=7, round=3) and len(set(a)) == 10 and a == sorted(a)
    assert all(0 <= c < 100 for c in a)
    assert a != sample_clients(100, 10, seed=7, round=4) and a != sample_clients(100, 10, seed=8, round=3)
    # a pinned draw: the same on every machine and version (C and Go call this function)
    assert sample_clients(20, 4, seed=1, round=1) == [0, 3, 11, 13]
    assert sample_clients(5, 5, seed=0, round=0) == [0, 1, 2, 3, 4]
    for args, words in [((0, 1, 0, 0), "num_clients"), ((5, 6, 0, 0), "per_round"), ((5, 0, 0, 0), "per_round"),
                        ((5, 2, 0, -1), "round"), ((5, 2, 1.5, 0), "seed")]:
        with pytest.raises(InvalidArgument, match=words):
            sample_clients(*args)


class _FakeServer:
    """Stands in for a Server: each run_round yields the Results queued for it."""

    def __init__(self, rounds):
        self.rounds, self.round, self.sent, self.closed = list(rounds), 0, [], False

    def run_round(self, clients, model, *, evaluate=False):
        if len(set(clients)) != len(clients):
            raise InvalidArgument("listed more than once")
        self.round += 1
        self.sent.append((list(clients), model.clone(), evaluate))
        return self._results(self.rounds.pop(0))

    @staticmethod
    def _results(queued):
        for r in queued:
            if isinstance(r, Exception):
                raise r  # a worker failed: the round ends here
            yield r

    def close(self):
        self.closed = True


def test_fedavg_rounds_keep_their_model_copy_and_step_at_the_round_lr():
    from pybridge.federated import FedAvgRounds
    server = _FakeServer([
        [_result(0, torch.full((4,), 2.0), 1), _result(1, torch.full((4,), 4.0), 3)],
        [_result(0, torch.ones(4), 1), _result(2, torch.zeros(2), 5, EVALUATE)],
    ])
    rounds = FedAvgRounds(server)
    assert not rounds.started
    with pytest.raises(InvalidArgument, match="no round"):
        rounds.next_result()
    model = torch.full((2, 2), 10.0)
    rounds.start([0, 1], model)
    model.fill_(-1.0)  # the caller's buffer may change: the round has its own copy
    assert rounds.started and server.sent[0][1].tolist() == [10.0] * 4
    assert [r.client for r in rounds] == [0, 1] and rounds.next_result() is None
    with pytest.raises(InvalidArgument, match="must match the round's model"):
        rounds.aggregate(1.0, out=torch.zeros(3))
    with pytest.raises(InvalidArgument, match="lr"):
        rounds.aggregate(0.0, out=model)
    assert rounds.aggregate(0.5, out=model) == 2  # the mean update is (2*1 + 4*3) / 4 = 3.5
    assert model.tolist() == [[10 - 0.5 * 3.5] * 2] * 2 and rounds.model.tolist() == [8.25] * 4
    with pytest.raises(InvalidArgument, match="no samples"):  # the round was applied
        rounds.aggregate(1.0, out=model)
    # train_round: start, every result (evaluations are not summed), aggregate into model
    assert rounds.train_round([0, 2], model, lr=1.0) == 1
    assert model.tolist() == [[7.25] * 2] * 2 and server.sent[1][0] == [0, 2]
    with pytest.raises(InvalidArgument, match="floating-point"):
        rounds.start([0], torch.zeros(3, dtype=torch.int32))
    with pytest.raises(InvalidArgument, match="more than once"):
        rounds.start([1, 1], model)
    assert not rounds.started  # a start the server refused leaves no round to aggregate
    with pytest.raises(InvalidArgument, match="no round"):
        rounds.aggregate(1.0)
    with rounds:
        pass
    assert server.closed


def test_a_failed_round_is_not_aggregated():
    """A round that raised (a worker failed) must not apply the clients it had summed; the
    next round starts clean (the issue: a partial sum reached a later step)."""
    from pybridge.errors import WorkerFailed
    from pybridge.federated import FedAvgRounds
    failure = WorkerFailed("worker 2 failed client 1", worker=2, client=1)
    server = _FakeServer([[_result(0, torch.full((4,), 2.0), 1), failure],
                          [_result(1, torch.full((4,), 4.0), 1)]])
    rounds = FedAvgRounds(server)
    model = torch.zeros(4)
    rounds.start([0, 1], model)
    with pytest.raises(WorkerFailed):
        list(rounds)
    with pytest.raises(InvalidArgument, match="round failed .* partial sum is not applied"):
        rounds.aggregate(1.0, out=model)
    assert rounds.model.tolist() == [0.0] * 4
    rounds.start([1], model)
    assert [r.client for r in rounds] == [1]
    assert rounds.aggregate(1.0, out=model) == 1 and model.tolist() == [-4.0] * 4  # model - lr x update


def test_buffered_stream_is_the_moved_stream_with_a_warning():
    from pybridge.federated import buffered, stream
    with pytest.warns(DeprecationWarning, match="buffered.Stream moved to pybridge.federated.stream.Stream"):
        assert buffered.Stream is stream.Stream
    with pytest.raises(AttributeError):
        buffered.NoSuchThing
