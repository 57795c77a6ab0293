"""The federated server's failure model on real ranks (gloo, a server and 3 workers, one
launch): NaN, Inf and too-large updates refused by name (and requeued once), an empty
round refused, per-client metrics and their round means, the round passed to the train
function, leaving a round early without waiting for its straggler, a stalled worker taken
back once it answers, close() cutting off a hung worker at once; and (a second launch) a
worker whose server dies while it trains."""

import datetime
import threading
import time

import pytest
import torch

from listening import listener_threads
from ranks import run_ranks

WORLD = 4
NAN, INF, HUGE, NAN_ONCE = 5, 6, 7, 8  # clients whose training goes wrong (see _train)


def _metrics(client):
    return {"loss": client / 10, "accuracy": 1 / (client + 1)}


def _train(g, rank, waits):
    """Client c trains to model - (c + 1) from c + 1 samples (pseudo-gradient c + 1), with
    _metrics(c); the NAN.. clients go wrong. `waits(rank, client, round)` may hold a client."""
    def train(model, client, round):
        waits(rank, client, round)
        if client == NAN or (client == NAN_ONCE and g.store.add(f"nan-once-{round}", 1) == 1):
            return model * float("nan"), 1
        if client == INF:
            model = model.clone()
            model[1] = float("inf")
            return model, 1
        if client == HUGE:
            return model + 1e6, 1
        return model - (client + 1), client + 1, _metrics(client)
    return train


def _fedavg(clients):
    """The FedAvg step of _train's updates: the model moves by -sum (c+1)^2 / sum (c+1)."""
    return -sum((c + 1) ** 2 for c in clients) / sum(c + 1 for c in clients)


def _refused(server, clients, out, param):
    from pybridge.errors import UpdateRefused
    from pybridge.federated import FedAvg
    avg = FedAvg([param])
    try:
        for r in server.run_round(clients, param.detach()):
            avg.add(r)
    except UpdateRefused as exc:
        return exc.worker, exc.client, exc.round, str(exc), exc.code
    finally:
        avg.reset()
    out.setdefault("accepted", []).append(clients)
    return None


def _integrity(g, rank, out):
    """Requeue off: each bad update ends its round with UpdateRefused; an empty round is refused."""
    from pybridge.errors import InvalidArgument
    from pybridge.federated import Server, Worker
    if rank != 0:
        Worker(g).serve(_train(g, rank, lambda *a: time.sleep(0.01)))
        return
    param = torch.nn.Parameter(torch.zeros(4))
    with Server(g, timeout=30, max_norm=1000.0) as server:
        try:
            server.run_round([], param.detach())
        except InvalidArgument as exc:
            out["empty"] = (str(exc), server.round)
        for bad in (NAN, INF, HUGE):
            out[bad] = _refused(server, [0, 1, bad], out, param)
        # affinity: clients 50 and 51 live on worker 1 only, 52 on worker 3
        for client, workers in ((50, [1]), (51, (1,)), (52, [3]), (53, [2, 3]), (53, None)):
            server.set_affinity(client, workers)
        out["affinity"] = sorted((r.client, r.worker) for r in server.run_round(range(50, 56), param.detach()))
        out["affinity_errors"] = []
        for client, workers in ((54, [0]), (54, [4]), (-1, [1]), (54, 1)):
            try:
                server.set_affinity(client, workers)
            except InvalidArgument as exc:
                out["affinity_errors"].append(str(exc))
    out["param"] = param.tolist()


def _requeue_and_early_exit(g, rank, out):
    """Requeue on: a client refused once is trained again; metrics; then over-selection."""
    from pybridge.federated import FedAvg, Server, Worker
    if rank != 0:
        def waits(rank, client, round):
            if rank == 1 and round == 2 and not g.store.check(["straggled"]):
                g.store.set("straggled", str(client))
                g.store.wait(["go"], datetime.timedelta(seconds=60))  # until round 3 is done
                g.store.set("late", "1")  # its late round-2 result follows
            time.sleep(0.02)
        seen = []
        train = _train(g, rank, waits)
        Worker(g).serve(lambda model, client, round: (seen.append(round), train(model, client, round))[1])
        out["rounds_seen"] = sorted(set(seen))
        return
    param = torch.nn.Parameter(torch.zeros(3))
    avg = FedAvg([param])
    with Server(g, timeout=30, requeue=True) as server:
        rr = server.run_round([0, 1, 2, 3, NAN_ONCE], avg.vector())
        got = [(r.client, r.round, r.metrics) for r in rr]
        out["requeued"] = (sorted(c for c, _, _ in got), sorted(rr.refused), rr.clients, rr.samples, rr.metrics)
        out["refused_text"] = str(rr.refused[NAN_ONCE])
        out["result_metrics"] = {c: m for c, _, m in got}
        # over-selection: keep 5 of 6 results, leave the straggler of worker 1 behind
        taken = []
        for r in server.run_round(range(10, 16), avg.vector()):
            avg.add(r)
            taken.append(r.client)
            if len(taken) == 5:
                break
        avg.step()
        t0 = time.monotonic()
        next_round = [(r.client, r.round) for r in server.run_round(range(20, 26), avg.vector())]
        out["next_round"] = (time.monotonic() - t0, next_round)
        g.store.set("go", "1")
        g.store.wait(["late"], datetime.timedelta(seconds=60))
        time.sleep(0.3)
        last = [(r.client, r.round, r.worker) for r in server.run_round(range(30, 39), avg.vector())]
        out["after"] = (last, server.round, sorted(server.lost))
        out["straggled"] = int(g.store.get("straggled"))
        out["taken"] = taken


def _stall_and_close(g, rank, out):
    """timeout 3 s, requeue: worker 2 stalls 4 s and is taken back; then worker 3 hangs and
    close() cuts it off without waiting."""
    from pybridge.errors import WorkerFailed
    from pybridge.federated import Server, Worker
    if rank != 0:
        def waits(rank, client, round):
            if rank == 2 and round == 1 and not g.store.check(["stalled"]):
                g.store.set("stalled", str(client))
                time.sleep(4.0)
                g.store.set("back", "1")
            if rank == 3 and round == 3 and not g.store.check(["hung"]):
                g.store.set("hung", str(client))
                g.store.wait(["closed"], datetime.timedelta(seconds=60))
            time.sleep(0.05)
        worker = Worker(g)
        try:
            worker.serve(_train(g, rank, waits))
        except Exception as exc:  # noqa: BLE001 - worker 3, cut off by close()
            out["error"] = (type(exc).__name__, str(exc))
        return
    with Server(g, timeout=3, requeue=True) as server:
        first = [(r.client, r.worker) for r in server.run_round(range(40, 46), torch.zeros(2))]
        out["stalled"] = (first, sorted(server.lost), int(g.store.get("stalled")))
        g.store.wait(["back"], datetime.timedelta(seconds=60))
        time.sleep(0.3)
        second = [(r.client, r.worker) for r in server.run_round(range(10, 19), torch.zeros(2))]
        out["back"] = (second, sorted(server.lost))
        third = [r.client for r in server.run_round(range(20, 26), torch.zeros(2))]
        out["hung"] = (sorted(third), sorted(server.lost))
        server.set_affinity(60, [3])  # only the hung worker holds client 60's data
        try:
            list(server.run_round([60, 61], torch.zeros(2)))
        except WorkerFailed as exc:
            out["stuck"] = str(exc)
        t0 = time.monotonic()
        server.close()
        out["close"] = (time.monotonic() - t0, listener_threads())
    g.store.set("closed", "1")


def integrity(rank, world):
    import pybridge
    g = pybridge.init(backend="gloo", timeout=60)
    out = {}
    for name, scenario in (("integrity", _integrity), ("requeue", _requeue_and_early_exit),
                           ("stall", _stall_and_close)):
        scenario(g, rank, out.setdefault(name, {}))
    pybridge.finalize()
    return out


@pytest.fixture(scope="module")
def integrity_result():
    return run_ranks(integrity, WORLD, timeout=150)


def test_an_empty_round_is_refused_before_anything_is_sent(integrity_result):
    text, rounds = integrity_result[0]["integrity"]["empty"]
    assert "at least one client" in text and rounds == 0


@pytest.mark.parametrize("bad,words", [(NAN, "4 of 4 elements are NaN or Inf"), (INF, "1 of 4 elements are NaN or Inf"),
                                       (HUGE, "exceeds the server's max_norm 1000")])
def test_a_poisoned_update_is_refused_naming_worker_client_and_round(integrity_result, bad, words):
    from pybridge.errors import CORRUPT
    out = integrity_result[0]["integrity"]
    worker, client, rnd, text, code = out[bad]
    assert client == bad and worker in (1, 2, 3) and code == CORRUPT
    assert rnd == [NAN, INF, HUGE].index(bad) + 1
    assert f"rank {worker}" in text and f"client {bad}" in text and f"round {rnd}" in text and words in text, text
    assert "accepted" not in out and out["param"] == [0.0] * 4  # no bad round got through


def test_with_requeue_a_refused_client_is_trained_again_and_metrics_are_averaged(integrity_result):
    out = integrity_result[0]["requeue"]
    clients, refused, order, samples, means = out["requeued"]
    assert clients == [0, 1, 2, 3, NAN_ONCE] and refused == [NAN_ONCE] and sorted(order) == clients
    assert "NaN or Inf" in out["refused_text"] and f"client {NAN_ONCE}" in out["refused_text"]
    assert samples == sum(c + 1 for c in clients)
    assert out["result_metrics"][2] == _metrics(2)
    n = {c: c + 1 for c in clients}
    for name in ("loss", "accuracy"):
        want = sum(n[c] * _metrics(c)[name] for c in clients) / sum(n.values())
        assert means[name] == pytest.approx(want, rel=1e-15)
    # the round reached the train function: every worker saw rounds among 1..4
    assert all(set(integrity_result[w]["requeue"]["rounds_seen"]) <= {1, 2, 3, 4} for w in (1, 2, 3))


def test_leaving_a_round_early_does_not_wait_for_its_straggler(integrity_result):
    out = integrity_result[0]["requeue"]
    assert out["straggled"] not in out["taken"] and len(out["taken"]) == 5
    seconds, next_round = out["next_round"]
    assert seconds < 5.0, seconds  # the straggler holds its client until after this round
    assert sorted(c for c, _ in next_round) == list(range(20, 26)) and {r for _, r in next_round} == {3}
    last, rounds, lost = out["after"]
    # its late round-2 result was dropped; it is back for round 4 with the new model
    assert sorted(c for c, _, _ in last) == list(range(30, 39)) and {r for _, r, _ in last} == {4}
    assert 1 in {w for _, _, w in last} and rounds == 4 and lost == []


def test_a_stalled_worker_is_taken_back_once_it_answers(integrity_result):
    out = integrity_result[0]["stall"]
    first, lost, stalled_client = out["stalled"]
    assert lost == [2] and sorted(c for c, _ in first) == list(range(40, 46))
    assert (stalled_client, 2) not in first  # requeued to another worker
    second, lost = out["back"]
    assert lost == [] and 2 in {w for _, w in second} and sorted(c for c, _ in second) == list(range(10, 19))


def test_affinity_hands_a_client_only_to_the_workers_holding_its_data(integrity_result):
    out = integrity_result[0]["integrity"]
    got = dict(out["affinity"])
    assert sorted(got) == list(range(50, 56)) and got[50] == 1 and got[51] == 1 and got[52] == 3
    errors = out["affinity_errors"]
    assert len(errors) == 4 and "[0] are not worker ranks" in errors[0] and "[4] are not" in errors[1]
    assert "client must be" in errors[2] and "list of worker ranks" in errors[3]
    stuck = integrity_result[0]["stall"]["stuck"]
    assert "clients [60] of round 4 can go only to workers that are lost (client 60: workers [3]" in stuck, stuck


def test_close_cuts_off_a_hung_worker_at_once_and_leaves_no_thread(integrity_result):
    out = integrity_result[0]["stall"]
    assert out["hung"] == (list(range(20, 26)), [3])
    seconds, threads = out["close"]
    assert seconds < 1.5 and threads == [], (seconds, threads)  # its deadline (3 s) had passed
    name, text = integrity_result[3]["stall"]["error"]
    assert name == "CommError" and "lost the server (rank 0) while sending client" in text, text


def _server_dies(rank, world):
    import os

    import pybridge
    from pybridge.federated import Server, Worker
    g = pybridge.init(backend="gloo", timeout=30)
    if rank == 0:
        server = Server(g, timeout=30)
        rr = server.run_round([7], torch.zeros(3))
        threading.Thread(target=lambda: next(rr, None), daemon=True).start()
        g.store.wait(["training"], datetime.timedelta(seconds=30))
        os._exit(3)

    def train(model, client):
        g.store.set("training", "1")
        time.sleep(1.0)  # the server dies meanwhile
        return model, 1
    try:
        Worker(g).serve(train)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return None


def test_a_worker_whose_server_dies_while_it_trains_gets_a_clear_error():
    _, (name, text) = run_ranks(_server_dies, 2, timeout=60, expect_fail={0})
    assert name == "CommError" and "lost the server (rank 0) while sending client 7's result (round 1)" in text, text
