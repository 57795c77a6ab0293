"""Federated faults through the C ABI (cffi ABI mode), a C server over three C workers on 4
gloo ranks: worker 2 dies or stalls while holding its second client. Without requeue
pb_fed_server_next_result fails naming the worker and the client (PB_ERR_COMM for a death,
PB_ERR_TIMEOUT past the server's timeout) in pb_last_error and in the result struct; with
requeue the round completes with every client answered once and FedAvg's exact value, and
the lost worker gets no more clients. pb_fed_server_close after a loss returns PB_OK and
leaves no listener thread. When the server dies, a C worker's pb_fed_worker_next_task
fails with PB_ERR_COMM naming rank 0 instead of waiting."""

import datetime
import json
import os
import time

import numpy as np
import pytest

from capi_loader import LIB_PATH, init_world, last_error, load, np_tensor
from listening import listener_threads
from ranks import run_ranks
from test_capi_federated import CLIENTS, STEP, V

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")

WORLD = 4
FAULTY = 2  # the worker rank that dies or stalls on its second client
WAIT = datetime.timedelta(seconds=60)  # bounds every store wait


def _store():
    # The C ABI's world, seen from this interpreter (cffi embedding shares it).
    import pybridge.comm.world
    return pybridge.comm.world.current().store


def _c_server(ffi, lib, g, key, requeue, timeout, rounds):
    """Up to `rounds` rounds of CLIENTS from a zero model; stops at the first error."""
    out = {"rounds": [], "error": None}
    sp = ffi.new("pb_fed_server **")
    assert lib.pb_fed_server_new(g, lib.PB_FED_ASYNC, timeout, requeue, sp) == 0, last_error(ffi, lib)
    s = sp[0]
    info, has, count = ffi.new("pb_fed_result *"), ffi.new("int32_t *"), ffi.new("int32_t *")
    model = np.zeros(5, np.float32)
    clients = ffi.new("int64_t[]", CLIENTS)
    for _ in range(rounds):
        assert lib.pb_fed_server_start_round(s, clients, len(CLIENTS), np_tensor(ffi, lib, model),
                                             lib.PB_FED_TRAIN) == 0, last_error(ffi, lib)
        got = []
        while True:
            rc = lib.pb_fed_server_next_result(s, info, has)
            if rc != 0:
                out["error"] = (rc, last_error(ffi, lib), info.worker, info.client, info.command, has[0])
                # the error ended the round
                out["after"] = (lib.pb_fed_server_next_result(s, info, has), has[0])
                break
            if not has[0]:
                break
            got.append((info.client, info.worker, info.samples))
            out.setdefault("round_ids", {})[len(out["rounds"])] = info.round
        out["rounds"].append(got)
        if out["error"]:
            break
        assert lib.pb_fed_server_aggregate(s, 1.0, np_tensor(ffi, lib, model), count) == 0, last_error(ffi, lib)
    store = _store()
    store.set(f"release-{key}", "1")
    out["faulty_client"] = int(store.get(f"client-{key}"))
    out["faulty_round"] = int(store.get(f"round-{key}"))  # the round it died (or stalled) in
    out["model"] = model.tolist()
    return s, out


def _close(ffi, lib, s, out):
    out["close"] = (lib.pb_fed_server_close(s), last_error(ffi, lib))
    out["threads"] = listener_threads()


def _c_worker(ffi, lib, g, rank, key, fault):
    """Answers tasks with the known update; the faulty rank dies or stalls on its second.
    Returns the (round, client) of its tasks and how its loop ended."""
    wp = ffi.new("pb_fed_worker **")
    assert lib.pb_fed_worker_new(g, wp) == 0, last_error(ffi, lib)
    w = wp[0]
    task, has = ffi.new("pb_fed_task *"), ffi.new("int32_t *")
    tasks = []
    while True:
        rc = lib.pb_fed_worker_next_task(w, task, has)
        if rc != 0:
            end = (rc, last_error(ffi, lib))
            break
        if not has[0]:
            end = (0, "terminated")
            break
        model = np.empty(task.length, np.float32)
        assert lib.pb_fed_worker_task_model(w, np_tensor(ffi, lib, model)) == 0, last_error(ffi, lib)
        tasks.append((task.round, task.client))
        if rank == FAULTY and len(tasks) == 2:
            _store().set(f"round-{key}", str(task.round))
            _store().set(f"client-{key}", str(task.client))
            if fault == "kill":
                os._exit(3)
            _store().wait([f"release-{key}"], WAIT)  # until the server has seen the timeout
        weights = model + (task.client + 1) * V
        assert lib.pb_fed_worker_submit(w, np_tensor(ffi, lib, weights), task.client + 1) == 0, last_error(ffi, lib)
        if rank == FAULTY and len(tasks) == 2:
            _store().set(f"late-{key}", "1")  # its late answer is with the server
    if end[0] == 0 and rank == FAULTY:
        _store().set(f"done-{key}", "1")
    assert lib.pb_fed_worker_free(w) == 0, last_error(ffi, lib)  # the deprecated name of pb_fed_worker_close
    return {"tasks": tasks, "end": end}


def stall(rank, world):
    """Worker 2 stalls past a 3 s timeout: once without requeue, then with it."""
    ffi, lib = load()
    g = init_world(ffi, lib, timeout=60.0)
    out = {}
    for requeue in (0, 1):
        key = f"stall-{requeue}"
        if rank == 0:
            s, out[requeue] = _c_server(ffi, lib, g, key, requeue, 3.0, 2)
            # The stalled worker is taken back once its late answer is in, and then
            # terminated by close (which would cut it off, past its deadline, before that).
            _store().wait([f"late-{key}"], WAIT)
            time.sleep(0.3)
            _close(ffi, lib, s, out[requeue])
            _store().wait([f"done-{key}"], WAIT)
        else:
            out[requeue] = _c_worker(ffi, lib, g, rank, key, "stall")
    assert lib.pb_finalize(g) == 0, last_error(ffi, lib)
    return out


def kill(rank, world, requeue, report):
    """Worker 2 dies holding its second client. Without requeue the server reports it and
    closes; with requeue three rounds complete, then the server writes its results to
    `report` and dies (os._exit) while the workers wait for their next task."""
    ffi, lib = load()
    g = init_world(ffi, lib, timeout=60.0)
    key = f"kill-{requeue}"
    if rank == 0:
        s, out = _c_server(ffi, lib, g, key, requeue, 30.0, 3)
        if requeue:
            with open(report, "w") as f:
                json.dump(out, f)
            os._exit(4)
        _close(ffi, lib, s, out)
    else:
        out = _c_worker(ffi, lib, g, rank, key, "kill")
        if requeue:  # the server, the store's host, is gone: leave without finalizing
            return out
    assert lib.pb_finalize(g) == 0, last_error(ffi, lib)
    return out


def _check_rounds(rounds, n):
    """n complete rounds: every client answered once, with its own samples."""
    assert [sorted(c for c, _, _ in r) for r in rounds] == [CLIENTS] * n
    assert all(samples == c + 1 for r in rounds for c, _, samples in r)


def test_a_dead_worker_is_named_with_its_client_and_the_server_closes_cleanly():
    _, lib = load()
    res = run_ranks(kill, WORLD, 0, None, timeout=120, expect_fail={FAULTY})
    server = res[0]
    rc, text, worker, client, command, has = server["error"]
    assert (rc, worker, client, command, has) == (lib.PB_ERR_COMM, FAULTY, server["faulty_client"], 0, 0)
    assert f"rank {FAULTY}" in text and f"client {client}" in text, text
    assert server["after"] == (0, 0)  # the error ended the round
    _check_rounds(server["rounds"][:-1], len(server["rounds"]) - 1)  # the rounds before the loss
    answered = [c for c, _, _ in server["rounds"][-1]]
    assert client not in answered and len(answered) == len(set(answered))
    assert server["close"][0] == 0, server["close"]
    assert server["threads"] == []
    for w in (1, 3):  # the others answered their clients and were terminated
        assert res[w]["end"] == (0, "terminated")


def test_requeue_completes_the_rounds_and_the_workers_see_the_server_die(tmp_path):
    _, lib = load()
    report = str(tmp_path / "server.json")
    res = run_ranks(kill, WORLD, 1, report, timeout=120, expect_fail={0, FAULTY})
    with open(report) as f:
        server = json.load(f)
    assert server["error"] is None, server["error"]
    _check_rounds(server["rounds"], 3)
    assert server["model"] == (3 * STEP).tolist()  # FedAvg of the answers: none lost, none twice
    dead = server["faulty_client"]
    # The round it died in: its second task may come in the first round or, on a loaded
    # machine where the others took the first round's clients, in the second.
    at = [i for i, rid in server["round_ids"].items() if rid == server["faulty_round"]]
    assert len(at) == 1, server
    died, *later = server["rounds"][int(at[0]):]
    assert [w for c, w, _ in died if c == dead] in ([1], [3])  # requeued to a live worker
    assert {w for r in later for _, w, _ in r} <= {1, 3}  # the dead worker got no more clients
    for w in (1, 3):  # a worker waiting for a task hears of the server's death: no hang
        rc, text = res[w]["end"]
        assert rc == lib.PB_ERR_COMM and "rank 0" in text, res[w]["end"]


def test_a_stalled_worker_times_out_named_with_its_client_or_is_requeued():
    _, lib = load()
    res = run_ranks(stall, WORLD, timeout=150)
    server = res[0][0]
    rc, text, worker, client, command, has = server["error"]
    assert (rc, worker, client, command, has) == (lib.PB_ERR_TIMEOUT, FAULTY, server["faulty_client"], 0, 0)
    assert f"rank {FAULTY}" in text and f"client {client}" in text and "within 3 s" in text, text
    assert server["after"] == (0, 0)
    server = res[0][1]
    assert server["error"] is None, server["error"]
    _check_rounds(server["rounds"], 2)
    assert server["model"] == (2 * STEP).tolist()
    late_round, late = res[FAULTY][1]["tasks"][1]
    assert [w for c, w, _ in server["rounds"][late_round - 1] if c == late] in ([1], [3])  # requeued
    for requeue in (0, 1):
        assert res[0][requeue]["close"][0] == 0 and res[0][requeue]["threads"] == []
        # the stalled worker got no client after the one it stalled on (the rounds were
        # over when it answered), and was taken back and terminated by close
        assert res[FAULTY][requeue]["tasks"][1][1] == res[0][requeue]["faulty_client"]
        assert len(res[FAULTY][requeue]["tasks"]) == 2
        assert all(res[w][requeue]["end"] == (0, "terminated") for w in (1, 2, 3))
