"""Elastic training: a stopped rank is lost after the timeout, and the elastic launcher's
limits (tests/elastic_train.py under pybridge-launch --elastic; checks: elastic_runs.check)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from elastic_runs import check, finish, launch, read_logs, wait_for, who
from ranks import free_port
from resume_train import write_dataset

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elastic runs use /proc")

RECORDS, EPOCHS = 240, 2
RUN_SECONDS = 120


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(str(tmp_path_factory.mktemp("elastic-data")), RECORDS)


def test_a_stopped_rank_is_lost_after_the_timeout(tmp_path, data):
    """SIGSTOP of rank 1 of 3: the peers' collective times out, the stopped rank's heartbeat
    goes stale, and the world goes on without it."""
    log, port = str(tmp_path / "run"), free_port()
    deadline = time.monotonic() + RUN_SECONDS
    proc = launch(port, log, data, "--die-at", "12", "--die-rank", "1", "--stop", "--timeout", "5",
                  nproc=3, epochs=EPOCHS, env={"PYBRIDGE_ELASTIC_LOST_AFTER": "2"})
    try:
        reset = wait_for(log, lambda e: e["ev"] == "reset", deadline)
        assert reset["lost"] == [1] and reset["world"] == 2
        while sum(e["ev"] == "done" for evs in read_logs(log).values() for e in evs) < 2:  # the others finish
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
    events, accepted, done = check(log, data, RECORDS, EPOCHS)
    assert len(done) == 2 and "node0-slot1-0" not in {who(events, e) for e in done}


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
