"""Jobs under a real SLURM (Debian's slurmctld, slurmd and munge) on the simulated cluster:
4 network namespaces, one `slurmd -N node<k>` in each (pybridge/testing/slurm.py). Nothing
exports a rank, a world size or an address: the programs find them in what srun sets.

- `srun -N 4 --ntasks-per-node 2` runs a Python script (init, allreduce, a few steps of
  pybridge.DistributedDataParallel, node_groups), a C program (pb_init, pb_all_reduce,
  pb_group_nodes) and the Go MNIST trainer;
- `srun -N 2 --ntasks-per-node=1 pybridge-launch --nproc-per-node 2` (the launcher takes
  its node count, node rank and rendezvous from the step);
- the sbatch script docs/clusters.md shows, verbatim: `--signal=USR1@60` before a 2-minute
  limit, the ranks save and exit with 75, the script requeues, and the requeued job
  resumes from the saved step and finishes with the weights of an uninterrupted run.

Opt-in: these take minutes, beyond `make test`'s budget, and need the packages, so they run
with `make test-clusters` (which installs them and sets PYBRIDGE_CLUSTER_TESTS=1); they skip
without root, without the packages, or without the variable. Everything is bounded, and the
daemons, jobs and namespaces are removed whatever happens.
"""

import json
import os
import re
import subprocess
import sys
import sysconfig
import time

import pytest

from launcher import unprefixed
from pybridge.testing import cluster, slurm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
SCRIPTS = sysconfig.get_path("scripts")  # pybridge-launch
PY = sys.executable
STEPS, W_FINAL = 240, -0.01 * sum(range(1, 241))  # tests/slurm_train.py


def _skip_reason():
    if os.environ.get("PYBRIDGE_CLUSTER_TESTS") != "1":
        return "real SLURM jobs take minutes: run with `make test-clusters` (PYBRIDGE_CLUSTER_TESTS=1)"
    ok, why = cluster.available()
    if not ok:
        return f"simulated cluster: {why}"
    ok, why = slurm.available()
    return None if ok else f"SLURM: {why}"


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@pytest.fixture(scope="module")
def sl(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    with cluster.Cluster(4) as c, slurm.Slurm(c, folder) as s:
        yield s


# What srun and sbatch pass on to the jobs (their default --export=ALL): pybridge's scripts on
# PATH, and this checkout first on PYTHONPATH (an editable install may point at another).
# Nothing about ranks or addresses.
JOB_ENV = {"PATH": f"{SCRIPTS}:{os.environ['PATH']}", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def srun(s, argv, *, timeout, cwd=None):
    """Run a command (srun, sbatch...) in node 0 with JOB_ENV; its output."""
    try:
        r = s.run(argv, timeout=timeout, cwd=cwd, env=JOB_ENV)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(argv)} did not finish within {timeout} s:\n{exc.output}\n{s.logs()}")
    return r


def results(out):
    return sorted((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")),
                  key=lambda r: r["rank"])


def test_srun_python_ddp_with_no_exports(sl):
    r = srun(sl, ["srun", "-N", "4", "--ntasks-per-node", "2", PY, os.path.join(TESTS, "sched_rank.py")],
             timeout=150)
    assert r.returncode == 0, r.stdout
    res = results(r.stdout)
    assert [x["rank"] for x in res] == list(range(8)), r.stdout
    for x in res:
        node = x["rank"] // 2
        assert (x["scheduler"], x["world"], x["local_rank"]) == ("slurm", 8, x["rank"] % 2)
        assert x["sources"]["rank"] == "SLURM_PROCID" and x["sources"]["world_size"] == "SLURM_STEP_NUM_TASKS"
        assert x["master"][0] == "node0" and x["sources"]["master_addr"] == "the first node of SLURM_STEP_NODELIST"
        assert x["node"] == str(node) and x["address"] == f"198.18.0.{node + 1}"  # really on its node
        assert x["ifname"] == "eth0"  # init named the link towards node0 for gloo
        assert x["sum"] == 28.0 and x["replicas_equal"]
        assert x["intra"] == [2 * node, 2 * node + 1]  # node_groups(): srun's ranks per node
        assert x["cross"] == [x["rank"] % 2 + 2 * k for k in range(4)]
    assert len({tuple(x["master"]) for x in res}) == 1  # one port, derived alike by all



def test_srun_c_program(sl, cluster_c_program):
    r = srun(sl, ["srun", "-N", "4", "--ntasks-per-node", "2", cluster_c_program], timeout=150)
    assert r.returncode == 0, r.stdout
    got = sorted(re.findall(r"RESULT rank=(\d) sum=(\S+) intra_first=(\d) intra_size=(\d)", r.stdout))
    assert got == [(str(k), "28", str(k - k % 2), "2") for k in range(8)], r.stdout


def test_srun_go_mnist_trainer(sl, tmp_path_factory):
    from gobuild import go_build
    from test_mnist import MNIST, final_accuracy, small_data
    exe = go_build(MNIST, tmp_path_factory.mktemp("gobin") / "mnist")
    data = small_data(tmp_path_factory)
    r = srun(sl, ["srun", "-N", "4", "--ntasks-per-node", "2", exe, "--data", data, "--epochs", "1",
                  "--batch-size", "64"], timeout=240)
    assert r.returncode == 0, r.stdout
    assert "(rank 0 of 8)" in r.stdout, r.stdout
    assert final_accuracy(r.stdout) > 0.3, r.stdout


def test_srun_one_launcher_per_node(sl):
    r = srun(sl, ["srun", "-N", "2", "--ntasks-per-node=1", "pybridge-launch", "--nproc-per-node", "2",
                  os.path.join(TESTS, "sched_rank.py")], timeout=150)
    assert r.returncode == 0, r.stdout
    for node in (0, 1):
        assert re.search(rf"pybridge-launch: from srun: --nnodes 2 \(SLURM_STEP_NUM_NODES\), --node-rank {node} "
                         r"\(SLURM_NODEID\), --rdzv-endpoint node0:\d+ ", r.stdout), r.stdout
    res = results(unprefixed(r.stdout))  # the launchers' lines: "[node1 rank3]:RESULT ..."
    assert [x["rank"] for x in res] == [0, 1, 2, 3], r.stdout
    for x in res:
        node = x["rank"] // 2
        assert (x["scheduler"], x["world"], x["sum"]) == ("launcher", 4, 6.0) and x["replicas_equal"]
        assert x["address"] == f"198.18.0.{node + 1}" and x["intra"] == [2 * node, 2 * node + 1]


def sbatch_script():
    """The sbatch script of docs/clusters.md (the block with --signal), verbatim."""
    text = open(os.path.join(ROOT, "docs", "clusters.md")).read()
    blocks = re.findall(r"^```sh no_run\n(#!/bin/bash\n.*?)^```$", text, re.M | re.S)
    found = [b for b in blocks if "--signal=USR1@" in b]
    assert len(found) == 1, "docs/clusters.md: expected one sbatch script with --signal"
    return found[0]


@pytest.mark.timeout(420)
def test_sbatch_preempted_job_requeues_and_resumes(sl, tmp_path):
    with open(tmp_path / "job.sh", "w") as f:
        f.write(sbatch_script())
    with open(os.path.join(TESTS, "slurm_train.py")) as src, open(tmp_path / "train.py", "w") as f:
        f.write(src.read())
    r = srun(sl, ["sbatch", "--parsable", "job.sh"], timeout=30, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout
    job = r.stdout.strip().split(";")[0]
    deadline, state = time.monotonic() + 360, {}
    while time.monotonic() < deadline:
        state = sl.job_state(job)
        if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            break
        time.sleep(2)
    out_path = tmp_path / f"train-{job}.out"
    out = out_path.read_text() if out_path.exists() else "(no output file)"
    assert state.get("JobState") == "COMPLETED", f"job {job}: {state}\n{out}\n{sl.logs()}"
    assert int(state["Restarts"]) >= 1, state  # requeued at least once
    # Each run starts where the one before saved; the last one finishes.
    events = re.findall(r"start at step (\d+) of \d+ \((fresh|resumed)\)|preempted: saved step (\d+)|"
                        r"done: (\d+) steps, w = (\S+)", out)
    assert events and events[0][:2] == ("0", "fresh"), out
    saved = None
    for start, how, preempted, done, w in events:
        if start:
            assert (int(start), how) == ((saved, "resumed") if saved is not None else (0, "fresh")), out
        elif preempted:
            saved = int(preempted)
            assert 0 < saved < STEPS, out
    assert saved is not None, f"never preempted:\n{out}"
    assert events[-1][3:] == (str(STEPS), f"{W_FINAL:.2f}"), out
    assert out.count("preempted: saved step") == int(state["Restarts"]), (state, out)
    assert "exited with 75 (requeue)" in out, out  # pybridge-launch's report
