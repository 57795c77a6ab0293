"""A federated server against hostile workers (issue 32, item 1): workers that speak the raw
protocol (crafted frames on their up stream, hostile_send below) to overrun, underrun or
lie to the server. One launch of 4 ranks (gloo): the server, an honest worker (rank 1) and
two hostile ones (ranks 2 and 3), over several federations in turn, each a round of 6
clients with requeue on a 1000-float model. In every one the server survives, retires each
hostile worker by rank, client and round with what it did wrong, allocates nothing the
model does not need, and the round ends with the honest worker's updates only."""

import math
import socket
import time
import warnings

import pytest
import torch

from ranks import run_ranks

WORLD = 4
NUMEL = 1000
CLIENTS = list(range(6))
HONEST_SAMPLES = 10

# (attack of rank 2, attack of rank 3, server options) per federation, in order
SCENARIOS = [
    ("surplus", "samples_default", {}),
    ("short_eof", "huge_length", {}),
    ("nan_metrics", "garbage_command", {}),
    ("wrong_dtype", "short_stall", {"timeout": 3}),
    ("samples_option", "out_of_turn", {"max_samples": 100}),
]


def hostile_send(worker, fields, payload=b"", metrics=b"", end=True):
    """Send one crafted frame on `worker`'s up stream: 8 int64 header fields, raw payload
    and metrics bytes, the end mark if `end`."""
    from pybridge.federated import uplink
    worker._up.sendall(uplink.HEADER.pack(*fields) + payload + metrics + (uplink.TRAILER if end else b""))


def _attack(worker, task, kind):
    """Answer `task` as `kind` says (TRAIN = 2, float32 = dtype code of the model)."""
    from pybridge.base import dtypes
    f32 = dtypes.FLOAT32
    c, r, s = task.client, task.round, task.seq
    ones = torch.full((NUMEL,), 0.95 / math.sqrt(NUMEL)).numpy().tobytes()  # norm 0.95
    if kind == "surplus":  # finding 1: 4x the bytes announced
        hostile_send(worker, (2, r, c, 5, NUMEL, f32, s, 0), ones * 4)
    elif kind == "samples_default":  # finding 2: outweigh everyone
        hostile_send(worker, (2, r, c, 1 << 62, NUMEL, f32, s, 0), ones)
    elif kind == "samples_option":
        hostile_send(worker, (2, r, c, 101, NUMEL, f32, s, 0), ones)
    elif kind == "short_eof":  # finding 3: 250 of 1000 elements, then the stream ends
        hostile_send(worker, (2, r, c, 5, NUMEL, f32, s, 0), ones[:1000], end=False)
        worker._up.shutdown(socket.SHUT_WR)
    elif kind == "short_stall":  # finding 3: 250 of 1000 elements (and an end mark), then silence
        hostile_send(worker, (2, r, c, 5, NUMEL, f32, s, 0), ones[:1000])
    elif kind == "huge_length":  # finding 4: a header of 2^25 elements for a 1000-element model
        hostile_send(worker, (2, r, c, 5, 1 << 25, f32, s, 0), ones)
    elif kind == "nan_metrics":  # finding 5
        text = b"loss=nan\nacc=inf"
        hostile_send(worker, (2, r, c, 5, NUMEL, f32, s, len(text)), ones, text)
    elif kind == "garbage_command":
        hostile_send(worker, (77, r, c, 5, NUMEL, f32, s, 0), ones)
    elif kind == "wrong_dtype":  # float64 elements for a float32 model
        hostile_send(worker, (2, r, c, 5, NUMEL, dtypes.FLOAT64, s, 0), ones * 2)
    elif kind == "out_of_turn":  # a seq it was never given
        hostile_send(worker, (2, r, c, 5, NUMEL, f32, s + 5, 0), ones)
    else:
        raise AssertionError(kind)


def _ranks(rank, world):
    import pybridge
    from pybridge.federated import FedAvgRounds, Server, Worker
    g = pybridge.init(backend="gloo", timeout=30)
    out = []
    if rank == 0:
        biggest = [0]
        real_empty = torch.empty

        def empty(*size, **kw):  # the largest tensor the server allocates (finding 4)
            if size and all(isinstance(n, int) for n in size):
                biggest[0] = max(biggest[0], math.prod(size))
            return real_empty(*size, **kw)
        torch.empty = empty
    for attack2, attack3, options in SCENARIOS:
        if rank == 0:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                server = Server(g, requeue=True, **{"timeout": 30, **options})
                bound = server.up_address[0]
                rounds = FedAvgRounds(server)
                model = torch.zeros(NUMEL)
                start = time.monotonic()
                biggest[0] = 0
                n = rounds.train_round(CLIENTS, model)
                for _ in range(200):  # a stalled one's retirement may come after the round (10 s at most)
                    server._drain()
                    if sorted(server.current.retired) == [2, 3]:
                        break
                    time.sleep(0.05)
                retired = {w: str(e) for w, e in rounds.server.current.retired.items()}
                rounds.close()
            out.append({"model": sorted(set(model.tolist())), "clients": n, "seconds": time.monotonic() - start,
                        "lost": {w: str(e) for w, e in server.lost.items()}, "retired": retired,
                        "warnings": [str(w.message) for w in caught if "was retired" in str(w.message)],
                        "biggest": biggest[0], "bound": bound})
        elif rank == 1:
            def train(model, client):
                return model - 1.0, HONEST_SAMPLES, {"loss": 0.5}
            Worker(g).serve(train)
        else:
            worker = Worker(g)
            task = worker.next_task()
            _attack(worker, task, attack2 if rank == 2 else attack3)
            worker._task = None  # answered, as far as it is concerned
            out.append(worker.next_task())  # the server's terminate: None
    pybridge.finalize()
    return out


@pytest.fixture(scope="module")
def hostile():
    return run_ranks(_ranks, WORLD, timeout=90)


def _named(hostile, scenario, rank, *words):
    """The server's record of retiring `rank` in scenario `scenario`: in lost, the round's
    retired and a warning, each naming the rank and the words."""
    s = hostile[0][scenario]
    texts = [s["lost"][rank], s["warnings"][[f"rank {rank} " in t for t in s["warnings"]].index(True)]]
    if rank in s["retired"]:
        texts.append(s["retired"][rank])
    for text in texts:
        assert f"federated worker rank {rank} was retired (client " in text and "round 1)" in text, text
        for w in words:
            assert w in text, (w, text)
    return texts


def test_every_round_ends_with_the_honest_updates_only(hostile):
    for i, s in enumerate(hostile[0]):
        assert s["model"] == [-1.0] and s["clients"] == len(CLIENTS), (SCENARIOS[i], s)
        assert sorted(s["lost"]) == [2, 3], (SCENARIOS[i], s["lost"])
    assert hostile[2] == [None] * len(SCENARIOS) and hostile[3] == [None] * len(SCENARIOS)  # terminated


def test_surplus_payload_bytes_retire_the_worker_and_the_server_runs_on(hostile):
    # finding 1: gloo aborted the server (SIGABRT) on 4x the announced bytes
    _named(hostile, 0, 2, "did not end where its header said")


def test_a_sample_count_above_the_bound_is_refused(hostile):
    # finding 2: 2^62 samples outweighed every honest update; now above max_samples (2^31 by default)
    _named(hostile, 0, 3, f"claims {1 << 62} samples (at most max_samples = {1 << 31})")
    _named(hostile, 4, 2, "claims 101 samples (at most max_samples = 100)")


def test_a_short_payload_is_never_taken_as_an_update(hostile):
    # finding 3: 250 of 1000 elements were taken, the rest uninitialized memory
    _named(hostile, 1, 2, "sent 1000 of the 4000 bytes of", "then closed its connection")
    _named(hostile, 3, 3, "sent 1008 of the 4000 bytes of", "then nothing for 3 s")


def test_a_header_is_checked_against_the_model_before_any_allocation(hostile):
    # finding 4: a header of 2^25 elements allocated 256 MiB before the refusal
    _named(hostile, 1, 3, f"announces an update of {1 << 25} elements", f"has {NUMEL} of dtype code")
    assert all(s["biggest"] <= NUMEL for s in hostile[0]), [s["biggest"] for s in hostile[0]]


def test_non_finite_metrics_retire_the_worker(hostile):
    # finding 5: NaN and Inf metrics poisoned the round's means
    _named(hostile, 2, 2, "bad metrics", "must be a finite number", "nan")


def test_garbage_commands_wrong_dtypes_and_out_of_turn_headers_retire_the_worker(hostile):
    _named(hostile, 2, 3, "has an unknown command 77")
    _named(hostile, 3, 2, "announces an update of 1000 elements of dtype code", f"has {NUMEL} of dtype code")
    _named(hostile, 4, 3, "does not answer its task (train client")


def test_the_up_listener_binds_the_jobs_address_not_the_wildcard(hostile):
    assert all(s["bound"] == "127.0.0.1" for s in hostile[0]), [s["bound"] for s in hostile[0]]


def test_metrics_refuse_non_finite_and_huge_values():
    from pybridge.errors import CorruptData, InvalidArgument
    from pybridge.federated import metrics
    for bad in (float("nan"), float("inf"), -float("inf"), 1e201):
        with pytest.raises(InvalidArgument, match="must be a finite number"):
            metrics.check({"loss": bad})
    with pytest.raises(CorruptData, match="must be a finite number"):
        metrics.decode(b"loss=nan")
    assert metrics.check({"loss": -1e200}) == {"loss": -1e200}
