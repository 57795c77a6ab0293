"""Server strategies and buffered aggregation without ranks, against float64 references
written here in numpy: staleness functions, the buffer's weighted sum, central DP's
clipping and noise, FedAvgM / FedAdagrad / FedAdam / FedYogi, FedProx's term, and the
argument checks."""

import json
import math
import os
import re

import numpy as np
import pytest
import torch

from pybridge.errors import InvalidArgument
from pybridge.federated import TRAIN, CentralDP, FedAdagrad, FedAdam, FedAvgRounds, FedYogi, Result, ServerSGD, Staleness, StaleUpdate, add_proximal_grad, proximal_loss
from pybridge.federated import staleness as st
from pybridge.federated.buffered import UpdateBuffer


def test_staleness_functions_match_their_formulas_exactly():
    for tau in range(0, 40):
        assert st.constant()(tau) == 1.0
        assert st.polynomial(0.5)(tau) == (1.0 + tau) ** -0.5
        assert st.polynomial(2)(tau) == 1.0 / ((1.0 + tau) * (1.0 + tau))
        assert st.hinge(10, 4)(tau) == (1.0 if tau <= 4 else 1.0 / (10.0 * (tau - 4) + 1.0))
    assert st.hinge(10, 4)(5) == 1 / 11 and st.polynomial(1)(3) == 0.25
    assert st.parse("hinge:2:1") == Staleness("hinge", 2, 1) and st.parse(None) == st.constant()
    assert str(st.parse("polynomial:0.25")) == "polynomial(a=0.25)"
    for bad in ("poly", "hinge:1:2:3", "polynomial:x", 3):
        with pytest.raises(InvalidArgument, match="staleness"):
            st.parse(bad)
    with pytest.raises(InvalidArgument, match="a must be a finite number >= 0"):
        st.polynomial(-1)
    with pytest.raises(InvalidArgument, match=">= 0"):
        st.constant()(-1)


def _result(client, payload, samples, rnd=1, worker=1):
    return Result(TRAIN, rnd, client, worker, samples, payload, 0.0)


def test_the_buffer_weights_each_delta_by_staleness_and_samples():
    rng = np.random.default_rng(3)
    deltas = [rng.standard_normal(50).astype(np.float32) for _ in range(5)]
    samples, taus = [3, 1, 7, 2, 5], [0, 2, 1, 5, 3]
    buf = UpdateBuffer(50, torch.device("cpu"), st.polynomial(0.5))
    for c in range(5):
        assert buf.add(_result(c, torch.from_numpy(deltas[c]), samples[c]), taus[c]) == \
            (1 + taus[c]) ** -0.5 * samples[c]
    g, record = buf.take()
    want = sum((1 + t) ** -0.5 * n * d.astype(np.float64) for d, n, t in zip(deltas, samples, taus)) / sum(samples)
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-14, atol=1e-15)
    assert record["clients"] == 5 and record["samples"] == 18 and record["staleness"] == taus
    with pytest.raises(InvalidArgument, match="no samples"):
        buf.take()  # emptied
    tight = UpdateBuffer(50, torch.device("cpu"), max_staleness=2)
    with pytest.raises(StaleUpdate, match="worker 4's update for client 9 .* 3 versions old"):
        tight.add(_result(9, torch.zeros(50), 1, worker=4), 3)
    with pytest.raises(InvalidArgument, match="has 3 elements"):
        tight.add(_result(1, torch.zeros(3), 1), 0)


def test_central_dp_clips_each_delta_weights_clients_equally_and_adds_seeded_noise():
    deltas = [torch.tensor(v, dtype=torch.float64) for v in ([3.0, 4.0], [0.3, 0.4], [-6.0, 8.0])]  # norms 5, 0.5, 10
    quiet = UpdateBuffer(2, torch.device("cpu"), dp=CentralDP(clip_norm=1.0, noise_multiplier=0.0))
    for c, d in enumerate(deltas):
        quiet.add(_result(c, d, 100 * (c + 1)), 0)
    g, rec = quiet.take()
    want = (np.array([0.6, 0.8]) + np.array([0.3, 0.4]) + np.array([-0.6, 0.8])) / 3
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-15)
    assert rec["clipped"] == 2 and rec["clip_norm"] == 1.0 and rec["noise_std"] == 0.0
    assert deltas[0].tolist() == [3.0, 4.0]  # the result's payload is not changed

    def noisy(seed):
        buf = UpdateBuffer(20000, torch.device("cpu"), dp=CentralDP(clip_norm=2.0, noise_multiplier=1.5, seed=seed))
        for c in range(4):
            buf.add(_result(c, torch.zeros(20000), 1), 0)
        return buf.take()
    (a, rec), (b, _), (c, _) = noisy(7), noisy(7), noisy(8)
    assert rec["noise_std"] == 1.5 * 2.0 / 4 and rec["noise_multiplier"] == 1.5
    assert torch.equal(a, b) and not torch.equal(a, c)  # seeded
    assert abs(a.std().item() / 0.75 - 1) < 0.03 and abs(a.mean().item()) < 0.03


def _reference(kind, x, grads, eta, beta1=0.9, beta2=0.99, tau=1e-3, momentum=0.0):
    """Reddi et al. 2021, Algorithm 2 (and SGD with momentum), in numpy float64."""
    x = x.astype(np.float64)
    m = np.zeros_like(x)
    v = np.full_like(x, tau * tau)
    for g in grads:
        if kind == "sgd":
            m = momentum * m + g
            x = x - eta * (m if momentum else g)
            continue
        d = -g
        m = beta1 * m + (1 - beta1) * d
        if kind == "adagrad":
            v = v + d * d
        elif kind == "adam":
            v = beta2 * v + (1 - beta2) * d * d
        else:
            v = v - (1 - beta2) * d * d * np.sign(v - d * d)
        x = x + eta * m / (np.sqrt(v) + tau)
    return x


@pytest.mark.parametrize("kind,make", [("adagrad", FedAdagrad), ("adam", FedAdam), ("yogi", FedYogi),
                                       ("sgd", lambda **k: ServerSGD(momentum=0.5, **k))])
def test_server_optimizers_follow_their_update_rules(kind, make):
    rng = np.random.default_rng(11)
    x0 = rng.standard_normal(64)
    grads = [rng.standard_normal(64) * s for s in (1.0, 0.1, 3.0, 0.5)]
    opt = make(eta=0.05)
    model = torch.from_numpy(x0.copy())
    for g in grads:
        opt.step(model, torch.from_numpy(g))
    want = _reference(kind, x0, grads, 0.05, momentum=0.5)
    np.testing.assert_allclose(model.numpy(), want, rtol=1e-13, atol=1e-15)
    assert abs(model.numpy() - x0).max() > 1e-3  # it moved
    assert opt.settings()["eta"] == 0.05


def test_plain_fedavg_keeps_sgds_float32_arithmetic():
    g = torch.randn(100, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a, b = torch.randn(100), None
    b = torch.nn.Parameter(a.clone())
    ServerSGD().step(a, g, 0.3)
    b.grad = g.float()
    torch.optim.SGD([b], lr=0.3).step()
    assert torch.equal(a, b.detach())


@pytest.mark.parametrize("make,words", [
    (lambda: FedAdam(beta1=1.0), "beta1 must be in"), (lambda: FedYogi(tau=0), "tau"),
    (lambda: ServerSGD(eta=-1), "eta"), (lambda: ServerSGD(momentum=1.5), "momentum"),
    (lambda: CentralDP(0, 1.0), "clip_norm"), (lambda: CentralDP(1.0, -1), "noise_multiplier"),
    (lambda: CentralDP(1.0, 1.0, seed=1.5), "seed"),
])
def test_bad_strategy_settings_are_refused_by_name(make, words):
    with pytest.raises(InvalidArgument, match=words):
        make()


class _Round:
    mode, round = "async", 0

    def close(self):
        pass


def test_fedavg_rounds_refuse_buffered_settings_in_round_modes():
    with pytest.raises(InvalidArgument, match="buffer_size, staleness and max_staleness are for"):
        FedAvgRounds(_Round(), buffer_size=4)
    with pytest.raises(InvalidArgument, match=r"strategy <class 'torch.optim.sgd.SGD'> does not provide name, eta, "
                                              r"settings\(\) \(Strategy: name, eta"):
        FedAvgRounds(_Round(), strategy=torch.optim.SGD)
    fa = _Round()
    fa.mode = "fedasync"
    with pytest.raises(InvalidArgument, match="fedasync steps at every result"):
        FedAvgRounds(fa, buffer_size=3)
    assert FedAvgRounds(fa).buffer_size == 1
    fa.mode = "fedbuff"
    assert FedAvgRounds(fa).buffer_size == 10
    with pytest.raises(InvalidArgument, match="buffer_size"):
        FedAvgRounds(fa, buffer_size=0)


def test_fedprox_term_and_its_gradient():
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    glob = [p.detach().clone() for p in net.parameters()]
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p))
    loss = proximal_loss(net.parameters(), glob, 0.2)
    want = 0.1 * sum(float(((p.detach().double() - g.double()) ** 2).sum()) for p, g in zip(net.parameters(), glob))
    assert math.isclose(loss.item(), want, rel_tol=1e-6)
    loss.backward()
    autograd = [p.grad.clone() for p in net.parameters()]
    for p in net.parameters():
        p.grad = None
    add_proximal_grad(net.parameters(), glob, 0.2)
    for p, g, a in zip(net.parameters(), glob, autograd):
        torch.testing.assert_close(p.grad, 0.2 * (p.detach() - g))
        torch.testing.assert_close(p.grad, a)
    with pytest.raises(InvalidArgument, match="mu"):
        proximal_loss(net.parameters(), glob, -1)
    with pytest.raises(InvalidArgument, match="one global tensor per parameter"):
        add_proximal_grad(net.parameters(), glob[:1], 0.1)


FEDPROX_CASES = json.load(open(os.path.join(os.path.dirname(__file__), "data", "fedprox.json")))["cases"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", FEDPROX_CASES, ids=[c["name"] for c in FEDPROX_CASES])
def test_fedprox_gradient_follows_the_table_go_runs_too(case, dtype):
    """tests/data/fedprox.json: go/federated_strategy_test.go runs the same cases on FedProxGrad."""
    p = torch.nn.Parameter(torch.tensor(case["weights"], dtype=dtype))
    p.grad = torch.tensor(case["grad"], dtype=dtype)
    glob = torch.tensor(case["global"], dtype=dtype)
    if "error" in case:
        with pytest.raises(InvalidArgument, match=re.escape(case["error"])):
            add_proximal_grad([p], [glob], float(case["mu"]))
        assert p.grad.tolist() == case["grad"]  # left as it was
    else:
        add_proximal_grad([p], [glob], float(case["mu"]))
        assert p.grad.tolist() == case["want"]
