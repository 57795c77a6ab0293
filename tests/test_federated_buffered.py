"""FedBuff and FedAsync on real ranks (gloo, a server and 3 workers, worker 1 slow): the
model steps every K results without waiting for the slow worker, whose results come in
late and weighted by their staleness (the final model checked against a float64 sum
computed here from the order results arrived in), a result past max_staleness refused by
name, a NaN update refused by name, and the workers always trained on the version they
were sent."""

import numpy as np
import pytest
import torch

from ranks import run_ranks

WORLD = 4
V = torch.arange(1, 6, dtype=torch.float32)
POISON = 99  # a client whose update is NaN


def _known(model, client):
    """Client c trains to model + (c+1) V from c+1 samples: its delta is -(c+1) V."""
    return model + (client + 1) * V, client + 1


def _serve(g, rank, slow, out):
    import time

    from pybridge.federated import Worker
    w = Worker(g)
    out["tasks"] = []
    while (task := w.next_task()) is not None:
        out["tasks"].append((task.round, task.client, task.model[0].item()))
        time.sleep(slow if rank == 1 else 0.01)
        weights, n = _known(task.model, task.client)
        w.submit(task, weights * float("nan") if task.client == POISON else weights, n, {"loss": task.client})


def _fedbuff(g, rank, out):
    from pybridge.federated import FedAvgRounds, Server
    if rank != 0:
        return _serve(g, rank, 0.25, out)
    with FedAvgRounds(Server(g, mode="fedbuff", timeout=30), buffer_size=3, staleness="polynomial:0.5") as rounds:
        model = torch.zeros(5)
        out["results"], out["models"] = [], {}
        for clients in (range(0, 12), range(12, 18)):  # two rounds: the second does not wait for the first
            rounds.start(clients, model)
            for r in rounds:
                out["results"].append((r.client, r.worker, r.round))
                out["models"][rounds.version] = rounds.model[0].item()
            out["aggregated"] = out.get("aggregated", 0) + rounds.aggregate(out=model)
            cur = rounds.server.current
            out.setdefault("summaries", []).append((list(cur.clients), cur.samples, cur.metrics))
        out["before_drain"] = len(out["results"])
        out["results"] += [(r.client, r.worker, r.round) for r in rounds.drain()]
        for bad in ([1, 1], [-2], "ab"):
            try:
                rounds.start(bad, model)
            except Exception as exc:  # noqa: BLE001
                out.setdefault("bad", []).append(f"{type(exc).__name__}: {exc}")
        out["left_out"] = len(rounds._buf)
        out["flushed"] = rounds.flush()
        out["history"] = [(h["version"], h["clients"], h["staleness"]) for h in rounds.history]
        out["model"] = rounds.model.tolist()


def _fedasync(g, rank, out):
    from pybridge.federated import FedAvgRounds, Server
    if rank != 0:
        return _serve(g, rank, 0.6, out)
    with FedAvgRounds(Server(g, mode="fedasync", timeout=30), max_staleness=2, staleness="hinge:1:0") as rounds:
        rounds.train_round(range(12), torch.zeros(5))
        list(rounds.drain())
        out["refused"] = [(e.worker, e.client, e.staleness, str(e)) for e in rounds.refused]
        out["history"] = [(h["clients"], h["staleness"], h["weights"], h["samples"]) for h in rounds.history]
        try:
            rounds.server.run_round([0], torch.zeros(5))
        except Exception as exc:  # noqa: BLE001
            out["run_round"] = f"{type(exc).__name__}: {exc}"
        steps = len(rounds.history)
        rounds.start([POISON], rounds.model)
        try:
            list(rounds)  # over at once: the other workers are idle
            list(rounds.drain())
        except Exception as exc:  # noqa: BLE001
            out["poison"] = (type(exc).__name__, exc.worker, exc.client, str(exc), len(rounds.history) - steps)
        out["after_error"] = rounds.next_result()  # the error ended the round


def scenarios(rank, world):
    import pybridge
    g = pybridge.init(backend="gloo", timeout=60)
    out = {"fedbuff": {}, "fedasync": {}}
    _fedbuff(g, rank, out["fedbuff"])
    _fedasync(g, rank, out["fedasync"])
    pybridge.finalize()
    return out


@pytest.fixture(scope="module")
def result():
    return run_ranks(scenarios, WORLD, timeout=90)


def test_fedbuff_steps_every_k_results_and_weights_late_ones_by_staleness(result):
    res = [r["fedbuff"] for r in result]
    s = res[0]
    got = s["results"]
    assert sorted(c for c, _, _ in got) == list(range(18))
    # Every result was added when 1 + (results before it) // 3 steps had been taken.
    taus = [1 + j // 3 - rnd for j, (_, _, rnd) in enumerate(got)]
    assert [t for h in s["history"] for t in h[2]] == taus
    assert [h[1] for h in s["history"]] == [3] * 6  # 18 results, K = 3; nothing left for flush
    assert s["left_out"] == 0 and s["flushed"] == 0 and s["before_drain"] < 18
    assert len(s["bad"]) == 3 and all(b.startswith("InvalidArgument") for b in s["bad"]), s["bad"]
    for clients, samples, metrics in s["summaries"]:  # each round's results: samples and mean loss
        assert samples == sum(c + 1 for c in clients)
        assert metrics["loss"] == pytest.approx(sum((c + 1) * c for c in clients) / samples)
    assert max(t for c, w, _ in zip(taus, got, got) for t in [c] if w[1] == 1) > 0  # worker 1's came in late
    # the second round started before worker 1's last client of the first was back
    first_round_end = max(j for j, (c, _, _) in enumerate(got) if c < 12)
    assert any(c >= 12 for c, _, _ in got[:first_round_end])
    # float64 reference: x -= sum_i s(tau_i) n_i delta_i / sum_i n_i per step of 3
    x = np.zeros(5)
    for k in range(6):
        step = got[3 * k:3 * k + 3]
        n = [c + 1 for c, _, _ in step]
        w = [(1.0 + taus[3 * k + i]) ** -0.5 * n[i] for i in range(3)]
        x = (x - (sum(wi * -ni * V.double().numpy() for wi, ni in zip(w, n)) / sum(n))).astype(np.float32)
    np.testing.assert_allclose(s["model"], x, rtol=1e-6)
    # each worker trained on the version it was sent: the model's first value at that version
    versions = {1: 0.0, **s["models"]}
    for w in (1, 2, 3):
        for rnd, _, first in res[w]["tasks"]:
            assert first == pytest.approx(versions[rnd], rel=1e-6), (w, rnd)


def test_fedasync_steps_at_every_result_and_refuses_what_is_too_stale(result):
    s = result[0]["fedasync"]
    assert all(h[0] == 1 for h in s["history"])
    assert all(w == 1.0 / (t + 1.0) * n for _, [t], [w], n in s["history"]), s["history"]  # s(tau) = hinge(1, 0)
    assert any(t > 0 for _, [t], _, _ in s["history"])
    assert s["refused"] and all(w == 1 and tau > 2 for w, _, tau, _ in s["refused"])
    worker, client, tau, text = s["refused"][0]
    assert f"worker 1's update for client {client}" in text and f"{tau} versions old (max_staleness 2)" in text
    assert len(s["history"]) + len(s["refused"]) == 12
    assert "fedasync hands clients out across model versions" in s["run_round"]
    kind, worker, client, text, stepped = s["poison"]  # refused by name, never applied
    assert kind == "UpdateRefused" and client == POISON and worker in (1, 2, 3) and stepped == 0
    assert s["after_error"] is None
    assert f"client {POISON}'s update" in text and "refused" in text
