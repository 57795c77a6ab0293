"""Elastic jobs coordinated through a 3-member etcd on the simulated cluster (issue 44): no
node is special, node 0 included.

Three nodes (network namespaces, pybridge/testing/cluster.py), each with one etcd member
and `pybridge-launch --elastic --rdzv-backend etcd` of one worker. Node 0 is lost whole in
the middle of training: its link taken down (nothing answers its peers, as a machine that
lost power), then every process in it killed, its launcher, its worker and its etcd member
alike. The other two go on; the first of them is the new rank 0.

- Python (tests/elastic_train.py, checked by tests/elastic_runs.py: every step's gradient
  the average over that step's world, every record once per epoch, the replicas equal to a
  one-process reference): node 0 lost, then node 0 back by the same command, admitted at a
  commit; all three finish.
- etcd's members: one killed alone, nothing stops; a second killed (no quorum), the job
  stops within its bounds, every worker naming the store and what it waited for.
- C (tests/c/elastic.c) and Go (the MNIST trainer's --elastic): node 0 lost, the two
  survivors finish with identical state.

Slow (a minute or two each) and needs root: run by `make test-clusters`
(PYBRIDGE_CLUSTER_TESTS=1), not by `make test`.
"""

import os
import re
import subprocess
import sys
import time

import pytest

from capi_loader import pybridge_flags
from elastic_runs import check, launch, read_logs, wait_for
from gobuild import go_build
from launcher import unprefixed
from pybridge import recordio as rio
from pybridge.testing import cluster
from pybridge.testing import etcd as etcd_testing
from resume_train import write_dataset
from test_mnist import MNIST, small_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ok, why = cluster.available()
if ok and not os.environ.get("PYBRIDGE_CLUSTER_TESTS"):
    ok, why = False, "a cluster test: `make test-clusters` runs it (PYBRIDGE_CLUSTER_TESTS=1)"
if ok:
    ok, why = etcd_testing.binary()[0] is not None, etcd_testing.binary()[1]
pytestmark = [pytest.mark.skipif(not ok, reason=why), pytest.mark.timeout(300)]

RECORDS, EPOCHS = 240, 3
RUN_SECONDS = 240
# A lost node is noticed by its silence: its watcher (the previous rank) gives it up once its
# heartbeat stood still for lost_after while the watcher's own went through; 3 s, above what
# a member may take no write here when the lost node held etcd's leader (an election, then a
# 2 s request timeout before the client asks another member). Else a collective's --timeout.
ENV = {"PYBRIDGE_ELASTIC_LOST_AFTER": "3", "PYBRIDGE_SECRET": "etcd-cluster-test-secret-0123456789"}


@pytest.fixture
def nodes():
    with cluster.Cluster(3) as c, etcd_testing.EtcdCluster(nodes=c.nodes) as e:
        yield c, e


def _lose_whole(node):
    """Node lost: its link first (its peers see silence, not a reset), then its processes."""
    node.unplug()
    node.kill()


def _outputs(procs, deadline):
    outs = []
    for p in procs:
        try:
            outs.append((p.wait(timeout=max(deadline - time.monotonic(), 1)), unprefixed(p.stdout.read())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the elastic job did not end in time:\n" + "\n".join(unprefixed(q.stdout.read())[-3000:]
                                                                          for q in procs))
    return outs


def _python_job(c, e, log, data, *extra, node_list=(0, 1, 2), env=None):
    return [launch(0, log, data, "--timeout", "5", *extra, nproc=1, node=k, nnodes=3, etcd=e.endpoints,
                   env={**ENV, **(env or {})}, epochs=EPOCHS, popen=c.nodes[k].popen) for k in node_list]


def test_node_0_lost_whole_and_back_by_the_same_command(nodes, tmp_path):
    c, e = nodes
    data = write_dataset(str(tmp_path), RECORDS)
    log = str(tmp_path / "run")
    deadline = time.monotonic() + RUN_SECONDS
    # The survivors wait at the commit of step 40 of their world for the replacement (its
    # launcher and interpreter take seconds to start on a loaded machine), and admit it there.
    join = ("--admit-from", "40", "--await-joiner-at", "40", "--step-ms", "40")
    procs = _python_job(c, e, log, data, *join)
    wait_for(log, lambda ev: ev["ev"] == "step" and ev["step"] >= 15, deadline)
    lost_at = time.time()
    _lose_whole(c.nodes[0])
    wait_for(log, lambda ev: ev["ev"] == "reset" and ev["gen"] == 2, deadline)
    c.nodes[0].plug()  # a machine in its place (its etcd member stays dead), the same command
    procs[0] = _python_job(c, e, log, data, *join, node_list=(0,))[0]
    outs = _outputs(procs, deadline)
    assert [rc for rc, _ in outs] == [0, 0, 0], "\n".join(out[-3000:] for _, out in outs)
    events, accepted, done = check(log, data, RECORDS, EPOCHS)
    resets = sorted((ev for evs in events.values() for ev in evs if ev["ev"] == "reset"), key=lambda ev: ev["gen"])
    lost = [ev for ev in resets if ev["gen"] == 2]
    assert len(lost) == 2 and all(ev["lost"] == [0] and ev["world"] == 2 for ev in lost), resets
    assert {ev["rank"] for ev in lost} == {0, 1}  # old rank 1 is the new rank 0
    joined = [ev for ev in resets if ev["gen"] == 3]
    assert len(joined) == 2 and all(ev["joined"] == 1 and ev["world"] == 3 for ev in joined), resets  # the joiner enters, not resets
    assert "node0r1-slot0-0" in events and any(ev["ev"] == "done" for ev in events["node0r1-slot0-0"])
    assert len(done) == 3
    first = min(ev["t"] for evs in events.values() for ev in evs if ev["ev"] == "step" and ev["gen"] == 2)
    print(f"node 0 lost -> first step of world 2: {first - lost_at:.2f} s")


def test_one_etcd_member_lost_then_a_majority(nodes, tmp_path):
    """One member of three killed: the job goes on (commits included). A second killed: the
    training still goes on between commits (their reads are served by the member left), but
    when rank 1 dies (step 45) no next world can be agreed: the survivors stop within the
    store's patience, naming the store and what it waited for, after every commit before
    the death was made."""
    c, e = nodes
    data = write_dataset(str(tmp_path), RECORDS)
    log = str(tmp_path / "run")
    deadline = time.monotonic() + RUN_SECONDS
    # The store's patience: a write that no quorum takes fails after 10 s (the join timeout).
    procs = _python_job(c, e, log, data, "--step-ms", "40", "--die-at", "45", "--die-rank", "1",
                        env={"PYBRIDGE_ELASTIC_JOIN_TIMEOUT": "10"})
    wait_for(log, lambda ev: ev["ev"] == "step" and ev["step"] >= 10, deadline)
    e.kill(2)  # one member of three: the others keep a quorum
    wait_for(log, lambda ev: ev["ev"] == "commit" and ev["step"] >= 25, deadline)  # commits went on
    e.kill(1)  # a majority gone: nothing can be written
    outs = _outputs(procs, deadline)
    assert all(rc != 0 for rc, _ in outs), "\n".join(out[-3000:] for _, out in outs)
    text = "\n".join(out for _, out in outs)
    assert re.search(rf"the etcd store at {re.escape(e.endpoints)} did not answer .* within 10 s", text), text[-4000:]
    assert "none had a quorum" in text, text[-4000:]
    events = read_logs(log)
    assert any(ev["ev"] == "die" and ev["step"] == 45 for evs in events.values() for ev in evs)
    last = sorted(max(ev["step"] for ev in evs if ev["ev"] == "commit") for evs in events.values())
    assert last == [40, 40, 40], last  # every commit before the death, on every worker


@pytest.fixture(scope="module")
def c_program(tmp_path_factory):
    d = tmp_path_factory.mktemp("elastic-c")
    exe, data = str(d / "elastic"), str(d / "data.recordio")
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", exe, os.path.join(ROOT, "tests", "c", "elastic.c"),
                    *pybridge_flags(os.path.join(ROOT, "build"))], check=True)
    rio.write_file(data, [bytes([i]) for i in range(120)])
    return exe, data


def _launch_all(c, e, argv, log_dir):
    """pybridge-launch --elastic over etcd of argv, one worker per node; output to files."""
    procs = []
    for n in c.nodes:
        out = open(os.path.join(log_dir, f"node{n.index}.log"), "w")
        procs.append(n.popen([sys.executable, "-m", "pybridge.launch", "--elastic", "--nproc-per-node", "1",
                              "--nnodes", "3", "--node-rank", str(n.index), "--rdzv-backend", "etcd",
                              "--rdzv-endpoint", e.endpoints, "--rdzv-id", "program", *argv],
                             stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **ENV}))
    return procs


def _wait_text(path, pattern, deadline):
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            if re.search(pattern, f.read(), re.M):
                return
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} never appeared in {path}")


def _survivors(c, e, argv, started, tmp_path):
    """Lose node 0 once `started` shows in its output; the two others' outputs."""
    procs = _launch_all(c, e, argv, str(tmp_path))
    deadline = time.monotonic() + RUN_SECONDS
    try:
        _wait_text(str(tmp_path / "node0.log"), started, deadline)
        _lose_whole(c.nodes[0])
        for p in procs[1:]:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for n in c.nodes:
            n.kill()
    outs = [unprefixed((tmp_path / f"node{k}.log").read_text()) for k in (1, 2)]
    assert [p.returncode for p in procs[1:]] == [0, 0], "\n".join(o[-3000:] for o in outs)
    return "\n".join(outs)


def test_c_program_survives_node_0(nodes, c_program, tmp_path):
    c, e = nodes
    exe, data = c_program
    # 3 ranks, 150 epochs of 120 records (3000 steps), a commit every 5 steps, nobody kills
    # itself (step 0): node 0 is lost once its world formed.
    out = _survivors(c, e, [exe, data, "150", "5", "0", "-1"], r"^NORESET rank=0 ", tmp_path)
    resets = re.findall(r"^RESET rank=(\d) lost=0 joined=0 old=3 new=2 gen=2 step=(\d+)", out, re.M)
    assert sorted(r for r, _ in resets) == ["0", "1"] and len({s for _, s in resets}) == 1, out
    results = re.findall(r"^RESULT rank=(\d) (.*)$", out, re.M)
    assert sorted(r for r, _ in results) == ["0", "1"] and len({rest for _, rest in results}) == 1, out


def test_go_trainer_survives_node_0(nodes, tmp_path_factory, tmp_path):
    c, e = nodes
    exe = go_build(MNIST, tmp_path_factory.mktemp("gobin") / "mnist")
    data = small_data(tmp_path_factory)
    out = _survivors(c, e, [exe, "--elastic", "--data", data, "--epochs", "4", "--batch-size", "24"],
                     r"^epoch 1/4 ", tmp_path)
    assert re.search(r"elastic: world 3 -> 2 ranks \(lost ranks \[0\], 0 joined\)", out), out
    done = re.findall(r"^elastic: rank (\d) of (\d) done at step (\d+), epoch (\d+), weights ([0-9a-f]{16})$",
                      out, re.M)
    assert sorted(r for r, *_ in done) == ["0", "1"] and len({tuple(rest) for _, *rest in done}) == 1, out
