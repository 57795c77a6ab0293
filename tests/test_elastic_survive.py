"""Elastic training end to end: survivors continue, joiners join (issue 25).

Each run starts `pybridge-launch --elastic` with 4 workers of tests/elastic_train.py and
reads their JSON logs afterwards. What every run checks (_check):
  * the accepted history: the steps of each world up to the step the next world rolled
    back to; every step number from 1 to the end is in it once, run by a whole world;
  * every record of each epoch was used, exactly once apart from the wrap-around padding of
    the epoch's final pass (the static partition's DistributedSampler padding), whose size
    the test computes;
  * every replica ended with the same weights, equal to a reference computed here in one
    process: the same model and optimizer fed, step by step, the accepted history's
    batches (rank by rank, gradients averaged over the world of that step).
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from pybridge.recordio import Loader, decode_fixed
from elastic_runs import finish, launch, read_logs, wait_for
from ranks import free_port
from resume_train import FEATURES, write_dataset
import elastic_train

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elastic runs use /proc")

RECORDS, BATCH, EPOCHS = 400, 4, 3
RUN_SECONDS = 120


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(str(tmp_path_factory.mktemp("elastic-data")), RECORDS)


def _history(events):
    """{step: (gen, [ids of rank 0, rank 1, ...], epoch)} of the accepted steps."""
    steps, starts = {}, {}
    for evs in events.values():
        for e in evs:
            if e["ev"] == "step":
                steps.setdefault((e["gen"], e["step"]), {})[e["rank"]] = (e["ids"], e["world"], e["epoch"])
            elif e["ev"] == "reset":
                starts.setdefault(e["gen"], set()).add(e["step"])
    assert all(len(s) == 1 for s in starts.values()), f"ranks of one world rolled back to different steps: {starts}"
    start = {g: s.pop() for g, s in starts.items()}  # world g started from this committed step
    accepted = {}
    for (gen, step), ranks in sorted(steps.items()):
        later = [start[g] for g in start if g > gen]
        if later and step > min(later):
            continue  # rolled back by a later world
        world = next(iter(ranks.values()))[1]
        assert sorted(ranks) == list(range(world)), f"step {step} of world {gen}: ranks {sorted(ranks)} logged"
        assert step not in accepted, f"step {step} accepted twice"
        accepted[step] = (gen, [ranks[r][0] for r in range(world)], ranks[0][2])
    assert sorted(accepted) == list(range(1, len(accepted) + 1)), "the accepted steps have a gap"
    return accepted


def _check_records(accepted):
    by_epoch = {}
    for step in sorted(accepted):
        gen, ids, epoch = accepted[step]
        by_epoch.setdefault(epoch, []).append((gen, ids))
    assert sorted(by_epoch) == list(range(EPOCHS))
    for epoch, steps in by_epoch.items():
        used = [i for _, ids in steps for rank in ids for i in rank]
        assert set(used) == set(range(RECORDS)), f"epoch {epoch}: records never used"
        last_gen = steps[-1][0]
        before = sum(len(i) for gen, ids in steps if gen != last_gen for i in ids)
        world = len(steps[-1][1])
        left = RECORDS - before
        padding = world * -(-left // world) - left
        assert len(used) == RECORDS + padding, (epoch, len(used), padding)


def _reference(accepted):
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=elastic_train.LR, momentum=elastic_train.MOMENTUM)
    rows = {}
    with Loader(_reference.data, RECORDS, num_replicas=1, rank=0, prefetch=0) as loader:
        for batch in loader:
            rec = decode_fixed(batch.data, batch.offsets, elastic_train.LAYOUT, as_torch=True)
            for i, x, y in zip(rec["id"].tolist(), rec["x"], rec["y"]):
                rows[i] = (x.double(), y.double())
    for step in sorted(accepted):
        _, ids, _ = accepted[step]
        grads = None
        for rank_ids in ids:
            x = torch.stack([rows[i][0] for i in rank_ids])
            y = torch.stack([rows[i][1] for i in rank_ids])
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x).squeeze(1), y).backward()
            g = [p.grad.clone() for p in model.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip(model.parameters(), grads):
            p.grad = g / len(ids)
        opt.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def _check(log, data):
    events = read_logs(log)
    accepted = _history(events)
    _check_records(accepted)
    done = [e for evs in events.values() for e in evs if e["ev"] == "done"]
    assert done and all(e["weights"] == done[0]["weights"] for e in done), "the replicas differ"
    _reference.data = data
    want = _reference(accepted)
    got = done[0]["weights"]
    for a, b in zip(want, got):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-9, atol=1e-12), (a, b)
    return events, accepted, done


def test_survivors_continue_and_a_joiner_receives_the_state(tmp_path, data):
    """SIGKILL of rank 2 at step 37: the 3 survivors roll back to the commit of step 35 and go
    on, without a restart; a process started by hand joins at the commit of step 60."""
    log, port = str(tmp_path / "run"), free_port()
    deadline = time.monotonic() + RUN_SECONDS
    main = launch(port, log, data, "--die-at", "37", "--die-rank", "2", "--admit-from", "60",
                   "--await-joiner-at", "60", "--timeout", "30")
    procs = [main]
    try:
        wait_for(log, lambda e: e["ev"] == "reset" and e["gen"] == 2, deadline)
        procs.append(launch(port, log, data, "--admit-from", "60", "--timeout", "30", nproc=1, node=1))
        (rc, out), (jrc, jout) = finish(procs, deadline)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert rc == 0 and jrc == 0, out[-3000:] + jout[-3000:]
    assert "worker node0-slot2-0 (local rank 2) was killed by signal SIGKILL; the others go on" in out
    events, accepted, done = _check(log, data)
    resets = [e for evs in events.values() for e in evs if e["ev"] == "reset"]
    survivors = [e for e in resets if e["gen"] == 2]
    assert len(survivors) == 3 and all(e["lost"] == [2] and e["world"] == 3 and e["step"] == 35 for e in survivors)
    assert {w for w, evs in events.items() if any(e in survivors for e in evs)} == \
        {"node0-slot0-0", "node0-slot1-0", "node0-slot3-0"}  # the same processes: nothing restarted
    joined = [e for e in resets if e["gen"] == 3]
    assert len(joined) == 3 and all(e["joined"] == 1 and e["world"] == 4 and e["step"] == 60 for e in joined)
    assert accepted[61][0] == 3 and len(accepted[61][1]) == 4  # the joiner trained from step 61 on
    # State bytes went to the joiner only; the survivors rolled back to their own commits.
    entries = {(w, e["gen"]): e for w, evs in events.items() for e in evs if e["ev"] == "enter"}
    assert entries[("node1-slot0-0", 3)]["received"] and entries[("node0-slot0-0", 3)]["sent_to"] == [3]
    assert all(e["received"] == (gen == 1 and e["rank"] != 0) for (w, gen), e in entries.items()
               if w != "node1-slot0-0")  # the first world starts from rank 0's state
    assert len(done) == 4 and all(e["step"] == max(accepted) for e in done)
    # Recovery: from the failure seen to the first step of the new world, on every survivor.
    for e in survivors:
        first = min(x["t"] for x in events[_who(events, e)] if x["ev"] == "step" and x["gen"] == 2)
        assert first - e["seen"] < 30, first - e["seen"]  # bounded; bench/elastic.py measures it


def _who(events, event):
    return next(w for w, evs in events.items() if event in evs)


def test_rank_0_dies_and_a_replacement_joins(tmp_path, data):
    """Rank 0 dies: the store lives in the launcher, so the others go on (the lowest survivor
    becomes rank 0 and sends the rolled-back state); the launcher's replacement joins."""
    log, port = str(tmp_path / "run"), free_port()
    deadline = time.monotonic() + RUN_SECONDS
    proc = launch(port, log, data, "--die-at", "37", "--die-rank", "0", "--await-joiner-at", "45",
                   "--timeout", "30", launcher=["--replace", "1"])
    [(rc, out)] = finish([proc], deadline)
    assert rc == 0, out[-3000:]
    assert "node0-slot0-0 (local rank 0) was killed by signal SIGKILL; the others go on, and node0-slot0-1 " \
           "replaces it" in out
    events, accepted, done = _check(log, data)
    survivors = [e for evs in events.values() for e in evs if e["ev"] == "reset" and e["gen"] == 2]
    assert len(survivors) == 3 and all(e["lost"] == [0] and e["step"] == 35 for e in survivors)
    assert {_who(events, e): e["rank"] for e in survivors} == \
        {"node0-slot1-0": 0, "node0-slot2-0": 1, "node0-slot3-0": 2}  # old rank 1 is rank 0 now
    joined = [e for evs in events.values() for e in evs if e["ev"] == "reset" and e["gen"] == 3]
    assert len(joined) == 3 and all(e["joined"] == 1 and e["step"] == 45 for e in joined)
    assert any(e["ev"] == "done" for e in events["node0-slot0-1"]) and len(done) == 4


def test_a_stopped_rank_is_lost_after_the_timeout(tmp_path, data):
    """SIGSTOP: the peers' collective times out, the stopped rank's heartbeat goes stale, and
    the world goes on without it."""
    log, port = str(tmp_path / "run"), free_port()
    deadline = time.monotonic() + RUN_SECONDS
    proc = launch(port, log, data, "--die-at", "12", "--die-rank", "1", "--stop", "--timeout", "3",
                   env={"PYBRIDGE_ELASTIC_LOST_AFTER": "2"})
    try:
        reset = wait_for(log, lambda e: e["ev"] == "reset", deadline)
        assert reset["lost"] == [1] and reset["world"] == 3
        for _ in range(3):  # the three others finish
            wait_for(log, lambda e: e["ev"] == "done", deadline)
        while sum(e["ev"] == "done" for evs in read_logs(log).values() for e in evs) < 3:
            assert time.monotonic() < deadline, "the survivors did not finish"
            time.sleep(0.05)
        stopped = wait_for(log, lambda e: e["ev"] == "start" and e["gen"] == 1 and
                            e in read_logs(log).get("node0-slot1-0", []), deadline)
        os.kill(stopped["pid"], signal.SIGKILL)  # still stopped: the test ends it
        [(rc, out)] = finish([proc], deadline)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # It had been left out of the world, so its death at the end is no failure of the job.
    assert rc == 0, out[-3000:]
    assert "node0-slot1-0 (local rank 1) was killed by signal SIGKILL" in out
    events, accepted, done = _check(log, data)
    assert len(done) == 3 and "node0-slot1-0" not in {_who(events, e) for e in done}


def test_the_launcher_stops_the_job_below_the_minimum_world(tmp_path):
    """--min-world 2 on one node: one of two workers dies and no replacement comes, so the
    launcher says the world fell below the minimum and stops the other (which would wait)."""
    worker = tmp_path / "worker.py"
    worker.write_text("import os, sys, time\n"
                      "if os.environ['LOCAL_RANK'] == '1': sys.exit(3)\n"
                      "time.sleep(60)\n")
    run = subprocess.run([sys.executable, "-m", "pybridge.launch", "--elastic", "--nproc-per-node", "2",
                          "--min-world", "2", str(worker)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr
    assert "worker node0-slot1-0 (local rank 1) exited with code 3; the others go on without it" in run.stderr
    assert "the world fell below the minimum size: 1 worker(s) left, --min-world 2; stopping the job" in run.stderr


def test_elastic_launcher_refuses_bad_sizes(tmp_path):
    run = subprocess.run([sys.executable, "-m", "pybridge.launch", "--elastic", "--min-world", "3",
                          "--max-world", "2", "x.py"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "--min-world must be >= 1 and <= --max-world" in run.stderr
