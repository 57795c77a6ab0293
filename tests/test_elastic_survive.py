"""Elastic training end to end: survivors continue, joiners join (issue 25).

Each run starts `pybridge-launch --elastic` with 4 workers of tests/elastic_train.py and
checks their logs with elastic_runs.check (the accepted history, every record of each
epoch used once, identical replicas equal to a one-process reference).
"""

import os
import signal
import sys
import time

import pytest

from elastic_runs import check, finish, launch, who
from ranks import free_port
from resume_train import write_dataset

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elastic runs use /proc")

RECORDS, EPOCHS = 400, 3
RUN_SECONDS = 120


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(str(tmp_path_factory.mktemp("elastic-data")), RECORDS)


def _check(log, data):
    return check(log, data, RECORDS, EPOCHS)


def test_survivors_continue_and_a_joiner_receives_the_state(tmp_path, data):
    """SIGKILL of rank 2 at step 37: the 3 survivors roll back to the commit of step 35 and go
    on, without a restart; a process started by hand joins at the commit of step 60."""
    log, port = str(tmp_path / "run"), free_port()
    deadline = time.monotonic() + RUN_SECONDS
    main = launch(port, log, data, "--die-at", "37", "--die-rank", "2", "--admit-from", "60",
                  "--await-joiner-at", "60", "--timeout", "30")
    # The joiner starts beside them (its start-up overlaps theirs) but asks to join only once
    # the survivors' world 2 exists, so that it is admitted at a commit, not in that round.
    procs = [main, launch(port, log, data, "--admit-from", "60", "--timeout", "30", "--join-after-gen", "2",
                          nproc=1, node=1)]
    try:
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
        first = min(x["t"] for x in events[who(events, e)] if x["ev"] == "step" and x["gen"] == 2)
        assert first - e["seen"] < 30, first - e["seen"]  # bounded; bench/elastic.py measures it


def test_rank_0_dies_and_a_replacement_joins(tmp_path, data):
    """Rank 0 dies: the store lives in the launcher, so the others go on (the lowest survivor
    becomes rank 0 and sends the rolled-back state); the launcher's replacement joins. The
    model is wrapped in pybridge.DistributedDataParallel (re-bound by State.reset)."""
    log, port = str(tmp_path / "run"), free_port()
    deadline = time.monotonic() + RUN_SECONDS
    proc = launch(port, log, data, "--die-at", "37", "--die-rank", "0", "--await-joiner-at", "45",
                  "--timeout", "30", "--ddp", launcher=["--replace", "1"])
    [(rc, out)] = finish([proc], deadline)
    assert rc == 0, out[-3000:]
    assert "node0-slot0-0 (local rank 0) was killed by signal SIGKILL; the others go on, and node0-slot0-1 " \
           "replaces it" in out
    events, accepted, done = _check(log, data)
    survivors = [e for evs in events.values() for e in evs if e["ev"] == "reset" and e["gen"] == 2]
    assert len(survivors) == 3 and all(e["lost"] == [0] and e["step"] == 35 for e in survivors)
    assert {who(events, e): e["rank"] for e in survivors} == \
        {"node0-slot1-0": 0, "node0-slot2-0": 1, "node0-slot3-0": 2}  # old rank 1 is rank 0 now
    joined = [e for evs in events.values() for e in evs if e["ev"] == "reset" and e["gen"] == 3]
    assert len(joined) == 3 and all(e["joined"] == 1 and e["step"] == 45 for e in joined)
    assert any(e["ev"] == "done" for e in events["node0-slot0-1"]) and len(done) == 4
