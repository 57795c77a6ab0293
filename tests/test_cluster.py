"""Multi-node runs on a simulated cluster (pybridge/testing/cluster.py): network namespaces on one
bridge, each node with its own address, pybridge-launch started in every node with
--nnodes, --node-rank and node 0's address, as on real machines. Needs root; skipped
without it. Every run is bounded: a hang fails at its timeout and the cluster (processes
and namespaces) is torn down whatever happens.

- 4 nodes of 2 ranks (Python): collectives, node_groups() matching the real nodes, the
  reducer, the loader (static and dynamic: every record once), gossip taking its node
  size from the launcher, federated rounds;
- 2 nodes of 2 ranks: the Go MNIST trainer, and a C program;
- a whole node lost: the other node's ranks name the lost ranks and their node, and its
  launcher reports the failure.
"""

import json
import os
import re
import subprocess
import threading
import time

import pytest

from capi_loader import pybridge_flags
from launcher import unprefixed
from pybridge.testing import cluster
from pybridge import recordio as rio
from ranks import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
ok, why = cluster.available()
pytestmark = pytest.mark.skipif(not ok, reason=f"simulated cluster: {why}")

RECORDS = 50


def launch_all(c, target, *args, timeout=150):
    """pybridge-launch TARGET (2 ranks per node) in every node of c; (return codes, outputs)."""
    procs = c.launch([target, *args], nproc_per_node=2, port=free_port())
    try:
        outs = c.communicate(procs, timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the nodes did not finish within {timeout} s")
    return [p.returncode for p in procs], [unprefixed(out) for out in outs]


def results(outs):
    lines = [line for out in outs for line in out.splitlines() if line.startswith("RESULT ")]
    return sorted((json.loads(line[7:]) for line in lines), key=lambda r: r["rank"])


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster-data")
    for k, part in enumerate((range(0, 30), range(30, RECORDS))):
        rio.write_file(str(d / f"part-{k}.recordio"), [str(i).encode() for i in part])
    return str(d)


def test_four_nodes_of_two_ranks(shards):
    with cluster.Cluster(4) as c:
        codes, outs = launch_all(c, os.path.join(TESTS, "cluster_worker.py"), shards, timeout=240)
        assert codes == [0] * 4, "\n".join(outs)
        before = [n.link_bytes() for n in c.nodes]
    res = results(outs)
    assert [r["rank"] for r in res] == list(range(8)), outs
    for r in res:
        node = r["rank"] // 2
        assert r["node"] == node and r["ifname"] == "eth0"  # the launcher chose the node's link
        assert r["sum"] == 28.0 and r["bcast"] == 7.0
        assert r["intra"] == [2 * node, 2 * node + 1]  # node_groups() are the real nodes
        assert r["intra_octets"] == [node + 1, node + 1] and r["octet"] == node + 1
        assert r["cross"] == [r["rank"] % 2 + 2 * k for k in range(4)]
        assert r["reduced"] == [3.5, 3.5]
        assert r["gossip_nodes"] == 4  # the launcher's 2 ranks per node, not 1
        # static: 7 records per rank (the share padded with wrap-around records to 8 x 7)
        assert set(r["static"]) == set(range(RECORDS)) and len(r["static"]) == 56
        assert r["dynamic"] == list(range(RECORDS))  # every record once
    assert res[0]["federated"] == pytest.approx([182 / 21] * 4)
    assert all(sent > 10_000 and got > 10_000 for sent, got in before)  # traffic crossed every link


@pytest.fixture(scope="module")
def c_program(tmp_path_factory):
    lib = os.path.join(ROOT, "build")
    exe = str(tmp_path_factory.mktemp("c") / "cluster")
    flags = pybridge_flags(lib)
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", exe, os.path.join(TESTS, "c", "cluster.c"),
                    *flags], check=True)
    return exe


def test_two_nodes_c_program(c_program):
    with cluster.Cluster(2) as c:
        codes, outs = launch_all(c, c_program)
    assert codes == [0, 0], "\n".join(outs)
    got = sorted(re.findall(r"RESULT rank=(\d) sum=(\S+) intra_first=(\d) intra_size=(\d)", "\n".join(outs)))
    assert got == [("0", "6", "0", "2"), ("1", "6", "0", "2"), ("2", "6", "2", "2"), ("3", "6", "2", "2")]


def test_two_nodes_go_mnist_trainer(tmp_path_factory):
    from gobuild import go_build
    from test_mnist import MNIST, final_accuracy, small_data
    exe = go_build(MNIST, tmp_path_factory.mktemp("gobin") / "mnist")
    data = small_data(tmp_path_factory)
    with cluster.Cluster(2, rate_mbit=1000) as c:
        codes, outs = launch_all(c, exe, "--data", data, "--epochs", "1", "--batch-size", "32")
    assert codes == [0, 0], "\n".join(outs)
    assert final_accuracy(outs[0]) > 0.5, outs[0]
    assert "4 ranks" in outs[0]


def test_a_lost_node_is_named_by_the_others_and_their_launcher():
    with cluster.Cluster(2) as c:
        procs = c.launch([os.path.join(TESTS, "cluster_loss.py")], nproc_per_node=2, port=free_port())
        # Wait until node 1's ranks have reduced once, then lose the whole node.
        seen, ready = [], threading.Event()

        def read():
            for line in procs[1].stdout:
                seen.append(line)
                if sum(unprefixed(x).startswith("READY") for x in seen) == 2:
                    ready.set()
        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(90):  # within pytest's 120 s: say what each node printed
            for n in c.nodes:
                n.kill()
            first = procs[0].communicate(timeout=10)[0]
            pytest.fail(f"node 1's ranks did not reduce within 90 s.\n--- node 0:\n{first}\n--- node 1:\n"
                        + "".join(seen))
        c.nodes[1].kill()
        try:
            out, = c.communicate(procs[:1], 60)
        except subprocess.TimeoutExpired:
            pytest.fail("node 0 did not notice the lost node within 60 s")
    assert procs[0].returncode != 0, out
    # Node 0's launcher names its rank that failed first and shows its error, which names
    # the lost ranks with their address and node.
    assert re.search(r"pybridge-launch: rank [01] \(local rank [01], node 0\) failed with exit code 1", out), out
    lost = [line for line in out.splitlines() if "CommError" in line and "did not answer" in line]
    assert lost, out
    for line in lost:
        assert "rank 2 (host " in line and "198.18.0.2, node 1" in line and "rank 3 (host " in line, line


def test_each_node_has_its_own_cpu_budget():
    """cpus=0.2: a node's processes get 0.2 CPU between them, however busy, and the report
    says what was set and what was used; a node without a budget is not held to one."""
    from pybridge.testing import cpulimit
    ok, why = cpulimit.available()
    if not ok:
        pytest.skip(why)
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.5:\n    pass\n"
    with cluster.Cluster(2, cpus=0.2) as c:
        t0 = time.monotonic()
        runs = [n.popen(["python3", "-c", spin]) for n in c.nodes for _ in range(2)]  # 2 spinners per node
        for p in runs:
            assert p.wait(timeout=60) == 0
        wall = time.monotonic() - t0
        report = c.report()
    for row in report:
        assert row["cpus"] == 0.2 and row["quota_us"] == 20000 and row["period_us"] == 100000, row
        # two spinners that would each use a CPU for 1.5 s share 0.2 CPU: at most 0.2 x the
        # wall time (plus a period's slack), where unlimited they would use up to 3 s
        assert 0.02 < row["used_s"] <= 0.2 * wall + 0.1, (row, wall)
        assert row["throttled_periods"] > 0, row
    with cluster.Cluster(1) as free:
        assert free.report()[0]["cpus"] is None
    with pytest.raises(pybridge_errors().InvalidArgument, match="cpus must be a positive number"):
        cluster.Cluster(1, cpus=0)


def pybridge_errors():
    from pybridge import errors
    return errors
