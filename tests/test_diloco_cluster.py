"""DiLoCo across the nodes of the simulated cluster (issue 45, item 5): two nodes, each with
its own CPU budget (half a CPU) and a 100 Mbit link, one rank each under pybridge-launch, as
on two machines. Every configuration of tests/diloco_parity.py (plain, Streaming with an
overlapped sync, int4 with error feedback) ends with exactly the weights the Python DiLoCo
computes on one machine (tests/data/diloco_parity.json, which tests/test_capi_diloco.py
keeps true), and the ranks' traffic went over the nodes' links.

Needs root; run by `make test-clusters` (PYBRIDGE_CLUSTER_TESTS=1), not by `make test`.
"""

import json
import os

import pytest

from launcher import unprefixed
from pybridge.testing import cluster, cpulimit
from ranks import free_port

import diloco_parity

TESTS = os.path.dirname(os.path.abspath(__file__))
ok, why = cluster.available()
if ok and not os.environ.get("PYBRIDGE_CLUSTER_TESTS"):
    ok, why = False, "a cluster test: `make test-clusters` runs it (PYBRIDGE_CLUSTER_TESTS=1)"
if ok:
    ok, why = cpulimit.available()
pytestmark = [pytest.mark.skipif(not ok, reason=why), pytest.mark.timeout(300)]

RANK = f"""import json, os, sys
sys.path.insert(0, {TESTS!r})
import diloco_parity
rank = int(os.environ["RANK"])
out = diloco_parity.python_rank(rank, int(os.environ["WORLD_SIZE"]))
print("RESULT " + json.dumps({{"rank": rank, "out": out}}), flush=True)
"""


def test_diloco_on_two_nodes_equals_one_machine(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    want = diloco_parity.load()["results"]["2"]
    with cluster.Cluster(2, rate_mbit=100, cpus=0.5) as c:
        before = [n.link_bytes() for n in c.nodes]
        procs = c.launch(["--no-prefix", str(script)], nproc_per_node=1, port=free_port())
        outs = [unprefixed(o) for o in c.communicate(procs, 240)]
        sent = [n.link_bytes()[0] - b[0] for n, b in zip(c.nodes, before)]
        used = [r["used_s"] for r in c.report()]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    results = [json.loads(line[len("RESULT "):]) for out in outs for line in out.splitlines()
               if line.startswith("RESULT ")]
    assert sorted(r["rank"] for r in results) == [0, 1], outs
    for r in results:
        for name, got in r["out"].items():
            ref = want[r["rank"]][name]
            assert got["synced"] == ref["synced"], (name, r["rank"])
            worst = max(abs(a - b) for a, b in zip(got["weights"], ref["weights"]))
            assert worst <= 1e-6, (name, r["rank"], worst)
    assert all(s > 10_000 for s in sent), sent  # the rendezvous and the syncs crossed each link
    assert all(u > 0 for u in used), used  # each node's ranks ran under its own budget
