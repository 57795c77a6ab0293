"""CPU binding (pybridge-launch --cpu-bind, pybridge/launch/cpubind.py): the split of a
node's CPUs among its ranks on made-up topologies, the kernel's sysfs read from a fake
tree, and a real launch whose ranks report their affinity and thread count."""

import json
import os
import sys

import pytest

from launcher import launch
from pybridge.launch import cpubind

# Two NUMA nodes of 4 cores with 2 hyperthreads each: CPU c and c + 8 share a core;
# cores 0-3 are node 0, 4-7 node 1 (Linux's usual numbering).
TWO_SOCKETS = {c: (0 if c % 8 < 4 else 1, c % 8) for c in range(16)}


def test_cores_keeps_hyperthreads_together_and_blocks_on_one_node():
    cpus = sorted(TWO_SOCKETS)
    assert cpubind.plan("cores", 2, cpus, TWO_SOCKETS) == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    assert cpubind.plan("cores", 3, cpus, TWO_SOCKETS) == [[0, 1, 8, 9], [2, 3, 4, 10, 11, 12], [5, 6, 7, 13, 14, 15]]
    assert cpubind.plan("cores", 8, cpus, TWO_SOCKETS)[5] == [5, 13]


def test_numa_gives_each_rank_its_node_and_few_cores_are_shared_round_robin():
    cpus = sorted(TWO_SOCKETS)
    node0, node1 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    assert cpubind.plan("numa", 4, cpus, TWO_SOCKETS) == [node0, node0, node1, node1]
    assert cpubind.plan("numa", 1, cpus, TWO_SOCKETS) == [sorted(cpus)]
    # a cgroup that left 2 single-thread cores to 3 ranks
    assert cpubind.plan("cores", 3, [2, 5], TWO_SOCKETS) == [[2], [5], [2]]
    assert cpubind.plan("none", 4, cpus, TWO_SOCKETS) is None
    # by default: cores on CPUs a scheduler gave the job, while every rank can have a core
    # (pinned ranks sharing one run at half speed while the others wait); on a machine
    # shared with others' processes, none
    slurm = {"SLURM_JOB_ID": "7"}
    assert [cpubind.default_mode(n, cpus, TWO_SOCKETS, slurm, 16) for n in (1, 2, 8, 9)] == \
        ["none", "cores", "cores", "none"]
    assert cpubind.default_mode(2, cpus, TWO_SOCKETS, {}, 16) == "none"
    assert cpubind.default_mode(2, cpus[:8], TWO_SOCKETS, {}, 16) == "cores"  # a cpuset of 8 of the 16
    with pytest.raises(ValueError, match="--cpu-bind must be one of none, cores, numa, got 'socket'"):
        cpubind.plan("socket", 2, cpus, TWO_SOCKETS)


def test_cpu_lists_round_trip_and_topology_reads_sysfs(tmp_path):
    assert cpubind.parse_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert cpubind.format_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    for cpu, (node, siblings) in {0: (0, "0,2"), 1: (1, "1,3"), 2: (0, "0,2"), 3: (1, "1,3")}.items():
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "core_cpus_list").write_text(siblings + "\n")
        (tmp_path / f"cpu{cpu}" / f"node{node}").mkdir()
    assert cpubind.topology([0, 1, 2, 3], sysfs=str(tmp_path)) == {0: (0, 0), 1: (1, 1), 2: (0, 0), 3: (1, 1)}
    assert cpubind.topology([7], sysfs=str(tmp_path)) == {7: (0, 7)}  # unknown: its own core on node 0


REPORT = """#!{python}
import json, os
os.write(1, (json.dumps({{"rank": int(os.environ["LOCAL_RANK"]), "cpus": sorted(os.sched_getaffinity(0)),
                         "threads": os.environ.get("OMP_NUM_THREADS")}}) + "\\n").encode())  # one write
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_launched_ranks_are_bound_to_disjoint_shares_with_as_many_threads(tmp_path):
    script = tmp_path / "report"
    script.write_text(REPORT.format(python=sys.executable))
    script.chmod(0o755)
    mine = set(os.sched_getaffinity(0))
    code, out, _ = launch(["--nproc-per-node", "2", "--cpu-bind", "cores", "--no-python", str(script)],
                          env={"OMP_NUM_THREADS": ""})
    assert code == 0, out
    rows = {r["rank"]: r for r in map(json.loads, (line for line in out.splitlines() if line.startswith("{")))}
    assert sorted(rows) == [0, 1], out
    a, b = set(rows[0]["cpus"]), set(rows[1]["cpus"])
    assert a and b and not a & b and a | b <= mine, out
    assert [rows[r]["threads"] for r in (0, 1)] == [str(len(a)), str(len(b))], out
    assert f"CPU binding (cores; --cpu-bind none|cores|numa): local rank 0 -> CPUs {cpubind.format_list(a)}" in out
