"""Federated training through the C ABI (cffi ABI mode) on 4 gloo ranks: C workers beside a
Python worker under a Python server, then a C server with Python and C workers; FedAvg's
exact value, evaluation payloads, per-client metrics and their round means, a reported
failure and a NaN update named with worker, client and round, a round left early without
waiting for its straggler, the client sampler, and misuse (NULL, freed and foreign handles,
roles on the wrong rank, calls out of order)."""

import datetime
import os

import numpy as np
import pytest

from capi_loader import LIB_PATH, init_world, last_error, load, np_tensor
from pybridge import abi
from ranks import run_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")

WORLD = 4
CLIENTS = list(range(12))
FAILING = 100  # a client whose training fails on every worker
POISONED = 101  # a client whose training gives NaN weights on every worker
STRAGGLER = 102  # held by its worker until the server says "go"
# Client c trains to model + (c+1) V from c+1 samples; 39 = 78 / 2 keeps FedAvg's mean, and so
# every later float32 operation, exact: each round moves the model by 650/78 V = 325 k (lr 1).
V = 39 * np.arange(1, 6, dtype=np.float32)
STEP = 325 * np.arange(1, 6, dtype=np.float32)


def _metrics(client):
    return {"loss": client / 8, "acc": 1 / (client + 1)}


def _weights(model, client):
    """Client c's trained weights (see V); NaN for POISONED; STRAGGLER waits for "go"."""
    if client == STRAGGLER:
        import pybridge.comm.world
        store = pybridge.comm.world.current().store  # the C ABI's world, seen from this interpreter
        store.wait(["go"], datetime.timedelta(seconds=60))
    if client == POISONED:
        return model * np.float32("nan")
    return model + (client + 1) * V


def _c_worker(ffi, lib, g, rank, out):
    """A worker written against the C ABI; checks misuse on its first task."""
    wp = ffi.new("pb_fed_worker **")
    assert lib.pb_fed_worker_new(g, wp) == 0, last_error(ffi, lib)
    w = wp[0]
    task, has = ffi.new("pb_fed_task *"), ffi.new("int32_t *")
    tasks, first = [], True
    while True:
        assert lib.pb_fed_worker_next_task(w, task, has) == 0, last_error(ffi, lib)
        if not has[0]:
            break
        model = np.empty(task.length, np.float32)
        assert task.dtype == lib.PB_FLOAT32
        if first:  # the model must be fetched into a matching buffer; tasks are answered in turn
            first = False
            small = np.empty(task.length - 1, np.float32)
            assert lib.pb_fed_worker_task_model(w, np_tensor(ffi, lib, small)) == lib.PB_ERR_INVALID_ARGUMENT
            assert "elements" in last_error(ffi, lib)
            assert lib.pb_fed_worker_next_task(w, task, has) == lib.PB_ERR_INVALID_ARGUMENT
            assert "not answered yet: pb_fed_worker_submit or pb_fed_worker_fail it" in last_error(ffi, lib)
            if task.command == lib.PB_FED_TRAIN:
                assert lib.pb_fed_worker_submit(w, np_tensor(ffi, lib, small), 1) == lib.PB_ERR_INVALID_ARGUMENT
            assert lib.pb_fed_worker_submit(w, np_tensor(ffi, lib, model), -1) == lib.PB_ERR_INVALID_ARGUMENT
        assert lib.pb_fed_worker_task_model(w, np_tensor(ffi, lib, model)) == 0, last_error(ffi, lib)
        tasks.append((task.round, task.client, task.command))
        if task.client == FAILING:
            assert lib.pb_fed_worker_fail(w, f"client {FAILING} has no data".encode()) == 0, last_error(ffi, lib)
        elif task.command == lib.PB_FED_EVALUATE:
            metrics = np.array([2.0 * task.client, rank], np.float64)
            assert lib.pb_fed_worker_submit(w, np_tensor(ffi, lib, metrics), 3) == 0, last_error(ffi, lib)
        else:
            weights = _weights(model, task.client)
            m = _metrics(task.client)
            names = [ffi.new("char[]", k.encode()) for k in m]
            assert lib.pb_fed_worker_submit_metrics(w, np_tensor(ffi, lib, weights), task.client + 1, 33, names,
                                                    list(m.values())) == lib.PB_ERR_INVALID_ARGUMENT
            assert lib.pb_fed_worker_submit_metrics(w, np_tensor(ffi, lib, weights), task.client + 1, 2, ffi.NULL,
                                                    ffi.NULL) == lib.PB_ERR_INVALID_ARGUMENT
            assert lib.pb_fed_worker_submit_metrics(w, np_tensor(ffi, lib, weights), task.client + 1, len(m),
                                                    ffi.new("char *[]", names), list(m.values())) == 0, \
                last_error(ffi, lib)
    assert lib.pb_fed_worker_submit(w, np_tensor(ffi, lib, np.zeros(5, np.float32)), 1) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_worker_next_task(w, task, has) == 0 and has[0] == 0  # terminated stays terminated
    assert lib.pb_fed_worker_close(w) == 0
    assert lib.pb_fed_worker_next_task(w, task, has) == lib.PB_ERR_INVALID_ARGUMENT
    assert "freed or foreign" in last_error(ffi, lib)
    out.append(tasks)


def _py_worker(rank, out):
    import torch
    from pybridge.federated import Worker
    w = Worker()  # the world the C ABI joined: one interpreter serves both
    tasks = []

    def train(model, client):
        tasks.append((w.round, client, abi.PB_FED_TRAIN))
        if client == FAILING:
            raise ValueError(f"client {client} has no data")
        return torch.from_numpy(_weights(model.numpy(), client)), client + 1, _metrics(client)

    def evaluate(model, client):
        tasks.append((w.round, client, abi.PB_FED_EVALUATE))
        return torch.tensor([2.0 * client, rank], dtype=torch.float64), 3

    w.serve(train, evaluate)
    out.append(tasks)


def _python_server():
    """Federation A: the core's Server and FedAvg; two rounds of known results."""
    import torch
    from pybridge.federated import FedAvg, Server
    param = torch.nn.Parameter(torch.zeros(5))
    avg = FedAvg([param])
    seen = []
    with Server(timeout=60) as server:
        for _ in range(2):
            for r in server.run_round(CLIENTS, avg.vector()):
                avg.add(r)
                seen.append((r.round, r.client, r.worker, r.samples))
            avg.step()
    return {"model": param.detach().tolist(), "seen": seen}


def _c_server(ffi, lib, g):
    """Federation B: the C ABI server. A training round, an evaluation round, a failure."""
    res = {}
    sp = ffi.new("pb_fed_server **")
    assert lib.pb_fed_server_new(g, lib.PB_FED_ASYNC, 60.0, 0, sp) == 0, last_error(ffi, lib)
    s = sp[0]
    info, has, count = ffi.new("pb_fed_result *"), ffi.new("int32_t *"), ffi.new("int32_t *")
    model = np.full(5, 1.0, np.float32)

    assert lib.pb_fed_server_next_result(s, info, has) == lib.PB_ERR_INVALID_ARGUMENT  # no round yet
    assert "no round" in last_error(ffi, lib)
    dup = ffi.new("int64_t[2]", [4, 4])
    assert lib.pb_fed_server_start_round(s, dup, 2, np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) \
        == lib.PB_ERR_INVALID_ARGUMENT
    assert "more than once" in last_error(ffi, lib)
    assert lib.pb_fed_server_start_round(s, dup, 1, np_tensor(ffi, lib, model), 99) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_server_start_round(s, ffi.NULL, 3, np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) \
        == lib.PB_ERR_INVALID_ARGUMENT

    clients = ffi.new("int64_t[]", CLIENTS)
    assert lib.pb_fed_server_start_round(s, clients, 0, np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) \
        == lib.PB_ERR_INVALID_ARGUMENT  # an empty round
    assert "at least one client" in last_error(ffi, lib)
    value, found = ffi.new("double *"), ffi.new("int32_t *")
    assert lib.pb_fed_server_round_metric(s, b"loss", value, found) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_server_start_round(s, clients, len(CLIENTS), np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) == 0
    seen, grads, metrics = [], {}, {}
    while True:
        assert lib.pb_fed_server_next_result(s, info, has) == 0, last_error(ffi, lib)
        if not has[0]:
            break
        assert info.command == lib.PB_FED_TRAIN and info.length == 5 and info.dtype == lib.PB_FLOAT32
        seen.append((info.round, info.client, info.worker, info.samples))
        got = {}
        for name in (b"loss", b"acc", b"none"):
            assert lib.pb_fed_server_result_metric(s, name, value, found) == 0, last_error(ffi, lib)
            if found[0]:
                got[name.decode()] = value[0]
        metrics[info.client] = got
        grad = np.empty(5, np.float32)
        assert lib.pb_fed_server_result_payload(s, np_tensor(ffi, lib, np.empty(5, np.float64))) \
            == lib.PB_ERR_INVALID_ARGUMENT
        assert lib.pb_fed_server_result_payload(s, np_tensor(ffi, lib, grad)) == 0, last_error(ffi, lib)
        grads[info.client] = grad.tolist()
    assert lib.pb_fed_server_result_payload(s, np_tensor(ffi, lib, np.empty(5, np.float32))) \
        == lib.PB_ERR_INVALID_ARGUMENT  # the round's end carries no payload
    assert lib.pb_fed_server_result_metric(s, b"loss", value, found) == lib.PB_ERR_INVALID_ARGUMENT
    res["result_metrics"] = metrics
    res["round_metrics"] = {}
    for name in (b"loss", b"acc", b"none"):
        assert lib.pb_fed_server_round_metric(s, name, value, found) == 0, last_error(ffi, lib)
        res["round_metrics"][name.decode()] = value[0] if found[0] else None
    assert lib.pb_fed_server_aggregate(s, 1.0, np_tensor(ffi, lib, np.empty(4, np.float32)), count) \
        == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_server_aggregate(s, 0.0, np_tensor(ffi, lib, model), count) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_server_aggregate(s, 1.0, np_tensor(ffi, lib, model), count) == 0, last_error(ffi, lib)
    res["clients_aggregated"] = count[0]
    assert lib.pb_fed_server_aggregate(s, 1.0, np_tensor(ffi, lib, model), count) == lib.PB_ERR_INVALID_ARGUMENT
    res["train"], res["grads"], res["model"] = seen, grads, model.tolist()

    # A second training round at lr 0.5 from the new model; clients 0-3 live on worker 2 only.
    two = ffi.new("int32_t[1]", [2])
    for c in range(4):
        assert lib.pb_fed_server_set_affinity(s, c, two, 1) == 0, last_error(ffi, lib)
    assert lib.pb_fed_server_set_affinity(s, 0, ffi.new("int32_t[1]", [0]), 1) == lib.PB_ERR_INVALID_ARGUMENT
    assert "not worker ranks" in last_error(ffi, lib)
    assert lib.pb_fed_server_set_affinity(s, 0, ffi.NULL, 1) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_server_start_round(s, clients, len(CLIENTS), np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) == 0
    n, res["affinity"] = 0, {}
    while lib.pb_fed_server_next_result(s, info, has) == 0 and has[0]:
        n += 1
        res["affinity"][info.client] = info.worker
    assert n == len(CLIENTS), last_error(ffi, lib)
    for c in range(4):
        assert lib.pb_fed_server_set_affinity(s, c, ffi.NULL, 0) == 0, last_error(ffi, lib)
    assert lib.pb_fed_server_aggregate(s, 0.5, np_tensor(ffi, lib, model), count) == 0, last_error(ffi, lib)
    res["model2"] = model.tolist()

    # Evaluation: the metrics come back as the workers sent them (float64).
    ev = ffi.new("int64_t[]", [0, 1, 2, 3, 4, 5])
    assert lib.pb_fed_server_start_round(s, ev, 6, np_tensor(ffi, lib, model), lib.PB_FED_EVALUATE) == 0
    metrics = {}
    while lib.pb_fed_server_next_result(s, info, has) == 0 and has[0]:
        assert info.command == lib.PB_FED_EVALUATE and info.dtype == lib.PB_FLOAT64 and info.samples == 3
        m = np.empty(info.length, np.float64)
        assert lib.pb_fed_server_result_payload(s, np_tensor(ffi, lib, m)) == 0, last_error(ffi, lib)
        metrics[info.client] = (m.tolist(), info.worker)
    res["metrics"] = metrics
    assert lib.pb_fed_server_aggregate(s, 1.0, np_tensor(ffi, lib, model), count) == lib.PB_ERR_INVALID_ARGUMENT

    # A worker reports a failure: the error names it and the client, and ends the round.
    bad = ffi.new("int64_t[1]", [FAILING])
    assert lib.pb_fed_server_start_round(s, bad, 1, np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) == 0
    rc = lib.pb_fed_server_next_result(s, info, has)
    res["failure"] = (rc, last_error(ffi, lib), info.worker, info.client, has[0])
    assert lib.pb_fed_server_next_result(s, info, has) == 0 and has[0] == 0

    # A NaN update is refused by name (PB_ERR_CORRUPT), and so is a norm past the bound.
    bad_bounds = []
    for bad in (-1.0, float("inf"), float("nan")):
        assert lib.pb_fed_server_set_max_norm(s, bad) == lib.PB_ERR_INVALID_ARGUMENT
        bad_bounds.append((bad, last_error(ffi, lib)))
    res["bad_max_norm"] = bad_bounds
    refused = []
    for client, bound in ((POISONED, 0.0), (0, 1.0)):  # client 0's update has norm |V| > 1
        assert lib.pb_fed_server_set_max_norm(s, bound) == 0, last_error(ffi, lib)
        one = ffi.new("int64_t[1]", [client])
        assert lib.pb_fed_server_start_round(s, one, 1, np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) == 0
        rc = lib.pb_fed_server_next_result(s, info, has)
        refused.append((rc, last_error(ffi, lib), info.worker, info.client, info.round, has[0]))
    res["refused"] = refused
    assert lib.pb_fed_server_set_max_norm(s, 0.0) == 0

    # Over-selection: leave a round before its straggler is back; the next round does not wait
    # for it and its late result is dropped, so the next FedAvg is exact.
    before = model.copy()
    first = ffi.new("int64_t[]", [STRAGGLER, 0, 1, 2, 3, 4, 5])
    assert lib.pb_fed_server_start_round(s, first, 7, np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) == 0
    for _ in range(6):
        assert lib.pb_fed_server_next_result(s, info, has) == 0 and has[0] and info.client != STRAGGLER
    import time
    t0 = time.monotonic()
    assert lib.pb_fed_server_start_round(s, clients, len(CLIENTS), np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) == 0
    rounds = set()
    while lib.pb_fed_server_next_result(s, info, has) == 0 and has[0]:
        rounds.add(info.round)
    assert lib.pb_fed_server_aggregate(s, 1.0, np_tensor(ffi, lib, model), count) == 0, last_error(ffi, lib)
    res["early"] = (time.monotonic() - t0, sorted(rounds), count[0], (model - before).tolist())
    import pybridge.comm.world
    pybridge.comm.world.current().store.set("go", "1")

    # The sampler: the core's draw.
    drawn = ffi.new("int64_t[4]")
    assert lib.pb_fed_sample_clients(20, 4, 1, 1, drawn) == 0, last_error(ffi, lib)
    res["sampled"] = list(drawn)
    assert lib.pb_fed_sample_clients(3, 4, 1, 1, drawn) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_sample_clients(3, 2, 1, 1, ffi.NULL) == lib.PB_ERR_INVALID_ARGUMENT

    # The sample bound (issue 32): refused values, then a worker claiming more is retired by name.
    bad_samples = []
    for bad in (0, -1):
        assert lib.pb_fed_server_set_max_samples(s, bad) == lib.PB_ERR_INVALID_ARGUMENT
        bad_samples.append(last_error(ffi, lib))
    assert lib.pb_fed_server_set_max_samples(s, 3) == 0, last_error(ffi, lib)
    five = ffi.new("int64_t[1]", [5])  # trained from 6 samples
    assert lib.pb_fed_server_start_round(s, five, 1, np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) == 0
    rc = lib.pb_fed_server_next_result(s, info, has)
    res["max_samples"] = (bad_samples, rc, last_error(ffi, lib), info.worker, info.client, info.round)

    # Foreign handles: a server is not a worker, nor the reverse.
    foreign = ffi.cast("pb_fed_worker *", s)
    assert lib.pb_fed_worker_fail(foreign, b"x") == lib.PB_ERR_INVALID_ARGUMENT
    assert "not a live pb_fed_worker handle" in last_error(ffi, lib)
    assert lib.pb_fed_server_close(s) == 0, last_error(ffi, lib)
    assert lib.pb_fed_server_close(s) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_server_next_result(s, info, has) == lib.PB_ERR_INVALID_ARGUMENT
    assert "freed or foreign" in last_error(ffi, lib)
    return res


def federated(rank, world):
    ffi, lib = load()
    g = init_world(ffi, lib, timeout=60.0)
    out = {"misuse": []}
    sp, wp = ffi.new("pb_fed_server **"), ffi.new("pb_fed_worker **")

    # Roles on the wrong rank and NULL arguments fail at once, before any collective.
    if rank == 0:
        assert lib.pb_fed_worker_new(g, wp) == lib.PB_ERR_INVALID_ARGUMENT
        out["misuse"].append(last_error(ffi, lib))
        assert lib.pb_fed_server_new(g, 7, 0, 0, sp) == lib.PB_ERR_INVALID_ARGUMENT
        assert lib.pb_fed_server_new(g, lib.PB_FED_SYNC, 0, 2, sp) == lib.PB_ERR_INVALID_ARGUMENT
        assert lib.pb_fed_server_new(g, lib.PB_FED_ASYNC, float("nan"), 0, sp) == lib.PB_ERR_INVALID_ARGUMENT
        assert lib.pb_fed_server_new(g, lib.PB_FED_ASYNC, 0, 0, ffi.NULL) == lib.PB_ERR_INVALID_ARGUMENT
    else:
        assert lib.pb_fed_server_new(g, lib.PB_FED_ASYNC, 0, 0, sp) == lib.PB_ERR_INVALID_ARGUMENT
        out["misuse"].append(last_error(ffi, lib))
        assert lib.pb_fed_worker_new(g, ffi.NULL) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_worker_new(ffi.NULL, wp) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_worker_next_task(ffi.NULL, ffi.new("pb_fed_task *"), ffi.new("int32_t *")) \
        == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_fed_server_aggregate(ffi.NULL, 1.0, ffi.NULL, ffi.NULL) == lib.PB_ERR_INVALID_ARGUMENT

    # Federation A: a Python server; C workers on ranks 1 and 2, a Python worker on rank 3.
    # Federation B: the C server; a Python worker on rank 1, C workers on ranks 2 and 3.
    tasks = []
    for fed, c_workers in (("A", (1, 2)), ("B", (2, 3))):
        if rank == 0:
            out[fed] = _python_server() if fed == "A" else _c_server(ffi, lib, g)
        elif rank in c_workers:
            _c_worker(ffi, lib, g, rank, tasks)
        else:
            _py_worker(rank, tasks)
    out["tasks"] = tasks
    assert lib.pb_finalize(g) == 0
    return out


@pytest.fixture(scope="module")
def result():
    return run_ranks(federated, WORLD, timeout=180)


def _check_rounds(seen, tasks, fed, rounds):
    """Every client once per round, with its samples, trained by the worker that said so."""
    for r in range(1, rounds + 1):
        got = [(c, w, n) for rr, c, w, n in seen if rr == r]
        assert sorted(c for c, _, _ in got) == CLIENTS
        assert all(n == c + 1 for c, _, n in got)
        done = sorted((c, w) for w in (1, 2, 3) for rr, c, cmd in tasks[w][fed] if rr == r and cmd == abi.PB_FED_TRAIN)
        assert done == sorted((c, w) for c, w, _ in got)


def test_c_workers_under_a_python_server_give_exactly_fedavg(result):
    a = result[0]["A"]
    assert a["model"] == (2 * STEP).tolist()
    tasks = {w: {"A": result[w]["tasks"][0]} for w in (1, 2, 3)}
    _check_rounds(a["seen"], tasks, "A", 2)


def test_the_c_server_aggregates_exactly_fedavg(result):
    b = result[0]["B"]
    assert b["clients_aggregated"] == 12
    assert b["model"] == (1 + STEP).tolist()
    assert b["model2"] == (1 + 1.5 * STEP).tolist()
    assert b["grads"] == {c: (-(c + 1) * V).tolist() for c in CLIENTS}  # pseudo-gradients
    tasks = {w: {"B": result[w]["tasks"][1]} for w in (1, 2, 3)}
    _check_rounds(b["train"], tasks, "B", 1)


def test_evaluation_results_carry_the_workers_metrics(result):
    metrics = result[0]["B"]["metrics"]
    assert sorted(metrics) == [0, 1, 2, 3, 4, 5]
    for client, (values, worker) in metrics.items():
        assert values == [2.0 * client, float(worker)]


def test_a_reported_failure_names_the_worker_and_the_client(result):
    rc, msg, worker, client, has = result[0]["B"]["failure"]
    _, lib = load()
    assert rc == lib.PB_ERR_COMM and has == 0
    assert client == FAILING and worker in (1, 2, 3)
    assert f"rank {worker}" in msg and f"client {FAILING}" in msg and "has no data" in msg


def test_roles_on_the_wrong_rank_are_refused(result):
    assert "server" in result[0]["misuse"][0]
    assert all("rank 0" in result[w]["misuse"][0] for w in (1, 2, 3))


def test_results_carry_the_workers_metrics_and_the_round_averages_them(result):
    b = result[0]["B"]
    assert b["result_metrics"] == {c: _metrics(c) for c in CLIENTS}  # from C and Python workers alike
    n = {c: c + 1 for c in CLIENTS}
    for name in ("loss", "acc"):
        want = sum(n[c] * _metrics(c)[name] for c in CLIENTS) / sum(n.values())
        assert b["round_metrics"][name] == pytest.approx(want, rel=1e-15)
    assert b["round_metrics"]["none"] is None


def test_a_refused_update_names_the_worker_the_client_and_the_round(result):
    _, lib = load()
    (rc, msg, worker, client, rnd, has), (rc2, msg2, _, client2, rnd2, _) = result[0]["B"]["refused"]
    assert (rc, client, has) == (lib.PB_ERR_CORRUPT, POISONED, 0) and worker in (1, 2, 3) and rnd == 5
    assert f"rank {worker}" in msg and f"client {POISONED}" in msg and "round 5" in msg and "NaN or Inf" in msg
    assert (rc2, client2, rnd2) == (lib.PB_ERR_CORRUPT, 0, 6) and "exceeds the server's max_norm 1" in msg2


def test_a_bad_max_norm_gets_the_cores_rule_and_message(result):
    from pybridge.errors import InvalidArgument
    from pybridge.federated.integrity import max_norm_setting
    for bad, msg in result[0]["B"]["bad_max_norm"]:
        with pytest.raises(InvalidArgument) as core:
            max_norm_setting(bad)
        assert msg == f"pb_fed_server_set_max_norm: {core.value}", (bad, msg)  # C names the function


def test_a_round_left_early_does_not_wait_for_its_straggler_and_drops_its_result(result):
    seconds, rounds, count, moved = result[0]["B"]["early"]
    assert seconds < 20 and rounds == [8] and count == len(CLIENTS)  # the straggler waits 60 s for "go"
    assert moved == STEP.tolist()  # exactly this round's FedAvg: nothing of the straggler's


def test_affinity_keeps_clients_on_the_workers_holding_their_data(result):
    workers = result[0]["B"]["affinity"]
    assert sorted(workers) == CLIENTS and all(workers[c] == 2 for c in range(4))


def test_the_sample_bound_is_the_cores_and_retires_a_worker_claiming_more(result):
    bad, rc, text, worker, client, rnd = result[0]["B"]["max_samples"]
    assert all("max_samples must be" in t for t in bad), bad
    assert rc == -5 and client == 5 and worker > 0, (rc, text)
    assert f"federated worker rank {worker} was retired (client 5, round {rnd})" in text, text
    assert "claims 6 samples (at most max_samples = 3)" in text, text


def test_the_sampler_is_the_cores(result):
    from pybridge.federated import sample_clients
    assert result[0]["B"]["sampled"] == sample_clients(20, 4, seed=1, round=1)
