"""Ranks started by Debian's Open MPI (openmpi-bin's `mpirun`) with no export lines:
pybridge.init() and pb_init take rank, world size and local rank from OMPI_COMM_WORLD_*,
meet on loopback on one node (the port derived from the job's PMIX_NAMESPACE), and node
groups follow OMPI_COMM_WORLD_LOCAL_SIZE.

- `mpirun -np 4 python3 tests/sched_rank.py` on this machine (init, allreduce, a few
  steps of pybridge.DistributedDataParallel);
- the C program (tests/c/cluster.c) under `mpirun -np 2`;
- across the simulated cluster's namespaces: mpirun in node 0 starts its daemons (orted)
  in node 1 through an rsh agent that is `ip netns exec` (Open MPI's plm_rsh_agent), as
  ssh would on real machines; MPI does not say where rank 0 runs, so MASTER_ADDR is given
  on mpirun's command line (`-x MASTER_ADDR=node0`).

Opt-in like tests/test_slurm.py: `make test-clusters` (PYBRIDGE_CLUSTER_TESTS=1) installs
openmpi-bin and runs them; they skip without it or without the variable (the namespace test
also without root).
"""

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from pybridge.testing import cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]

if os.environ.get("PYBRIDGE_CLUSTER_TESTS") != "1":
    pytestmark = pytest.mark.skip(reason="real mpirun jobs: run with `make test-clusters` (PYBRIDGE_CLUSTER_TESTS=1)")
elif shutil.which("mpirun") is None:
    pytestmark = pytest.mark.skip(reason="mpirun not installed (Debian: apt-get install openmpi-bin; "
                                         "`make test-clusters` does)")


def clean_env():
    """This environment without a launcher's or an outer job's variables, this checkout first
    on PYTHONPATH (an editable install may point at another)."""
    from pybridge.testing.slurm import clean_env as clean
    return clean({"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})


def run(argv, *, timeout, env=None):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or clean_env(),
                              start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(argv)} did not finish within {timeout} s:\n{exc.stdout}\n{exc.stderr}")


def results(out):
    return sorted((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")),
                  key=lambda r: r["rank"])


def test_mpirun_python_on_one_node_with_no_exports():
    r = run([*MPIRUN, "-np", "4", sys.executable, os.path.join(TESTS, "sched_rank.py")], timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    res = results(r.stdout)
    assert [x["rank"] for x in res] == [0, 1, 2, 3], r.stdout + r.stderr
    for x in res:
        assert (x["scheduler"], x["world"], x["local_rank"]) == ("openmpi", 4, x["rank"])
        assert x["sources"]["rank"] == "OMPI_COMM_WORLD_RANK" and x["sources"]["world_size"] == "OMPI_COMM_WORLD_SIZE"
        assert x["master"][0] == "127.0.0.1" and x["sources"]["master_port"] == "derived from PMIX_NAMESPACE"
        assert x["sum"] == 6.0 and x["replicas_equal"] and x["intra"] == [0, 1, 2, 3]
    assert len({tuple(x["master"]) for x in res}) == 1



def test_mpirun_c_program(cluster_c_program):
    r = run([*MPIRUN, "-np", "2", cluster_c_program], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.split("\n")[:2]) == ["RESULT rank=0 sum=1 intra_first=0 intra_size=2",
                                               "RESULT rank=1 sum=1 intra_first=0 intra_size=2"], r.stdout


AGENT = """#!/bin/sh
# Open MPI's rsh agent for the simulated cluster: "agent HOST COMMAND..." runs COMMAND in
# HOST's network namespace, as ssh would run it on HOST.
host="$1"; shift
case "$host" in
{cases}
  *) echo "no node $host" >&2; exit 1;;
esac
exec ip netns exec "$ns" sh -c "$*"
"""


@pytest.mark.skipif(not cluster.available()[0], reason=f"simulated cluster: {cluster.available()[1]}")
def test_mpirun_across_namespaces(tmp_path):
    with cluster.Cluster(2) as c:
        agent = tmp_path / "netns-rsh"
        agent.write_text(AGENT.format(cases="\n".join(f'  node{n.index}) ns={n.ns};;' for n in c.nodes)))
        agent.chmod(agent.stat().st_mode | stat.S_IEXEC)
        hosts = tmp_path / "hosts"
        hosts.write_text("".join(f"node{n.index} slots=2\n" for n in c.nodes))
        argv = [*MPIRUN, "-np", "4", "--hostfile", str(hosts), "--mca", "plm_rsh_agent", str(agent),
                "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
                "-x", "MASTER_ADDR=node0", "-x", "PATH", "-x", "PYTHONPATH",
                sys.executable, os.path.join(TESTS, "sched_rank.py")]
        try:
            r = c.nodes[0].run(argv, timeout=150, env=clean_env())
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"mpirun across namespaces did not finish within 150 s:\n{exc.output}")
    assert r.returncode == 0, r.stdout
    res = results(r.stdout)
    assert [x["rank"] for x in res] == [0, 1, 2, 3], r.stdout
    for x in res:
        node = x["rank"] // 2
        assert (x["scheduler"], x["world"], x["local_rank"], x["sum"]) == ("openmpi", 4, x["rank"] % 2, 6.0)
        assert x["sources"]["master_addr"] == "MASTER_ADDR" and x["address"] == f"198.18.0.{node + 1}"
        assert x["ifname"] == "eth0" and x["intra"] == [2 * node, 2 * node + 1] and x["replicas_equal"]
