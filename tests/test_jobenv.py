"""Rank, world size and rendezvous from the scheduler that started the process
(pybridge/base/jobenv.py): SLURM's srun, Open MPI's mpirun, MPICH's and Intel MPI's PMI, with
the launcher's variables first; and two processes started with only Open MPI's or SLURM's
variables (no launcher, no export lines) that form a world and reduce."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid

import pytest

from launcher import unprefixed
from pybridge.base import jobenv, netif
from pybridge.errors import InvalidArgument

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SLURM = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
         "SLURM_STEP_NODELIST": "gpu[04-07]", "SLURM_JOB_NODELIST": "gpu[01-07]", "SLURM_JOB_ID": "4242",
         "SLURM_STEP_ID": "1"}
OMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "prterun-host-77@1"}
PMI = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3", "PMI_PORT": "host:4711"}


def test_nodelists_expand_as_slurm_writes_them():
    assert jobenv.expand_nodelist("node[01-03,07],gpu5,x[8-10]-ib") == \
        ["node01", "node02", "node03", "node07", "gpu5", "x8-ib", "x9-ib", "x10-ib"]
    assert jobenv.expand_nodelist("localhost") == ["localhost"]
    with pytest.raises(InvalidArgument, match="cannot read the range 'a-b'"):
        jobenv.expand_nodelist("n[a-b]")


def test_slurm_takes_the_steps_counts_and_its_first_node():
    job = jobenv.detect(SLURM)
    assert (job.scheduler, job.rank, job.world_size, job.local_rank) == ("slurm", 3, 8, 1)
    assert job.sources["world_size"] == "SLURM_STEP_NUM_TASKS"  # not the job's 16
    assert job.master_addr == "gpu04" and job.sources["master_addr"] == "the first node of SLURM_STEP_NODELIST"
    assert job.master_port in netif.DEFAULT_PORTS
    assert jobenv.detect({**SLURM, "SLURM_STEP_ID": "2"}).master_port != job.master_port  # each step its own
    assert jobenv.rendezvous_method(job) == f"tcp://gpu04:{job.master_port}"
    narrowed = jobenv.detect({**SLURM, "PYBRIDGE_PORTS": "40000-40009"})  # every rank derives it alike
    assert narrowed.master_port in range(40000, 40010) and narrowed == jobenv.detect({**SLURM, "PYBRIDGE_PORTS": "40000-40009"})
    given = jobenv.detect({**SLURM, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29511"})
    assert (given.master_addr, given.master_port, given.sources["master_port"]) == ("10.0.0.9", 29511, "MASTER_PORT")


def test_mpi_on_one_node_meets_on_loopback_and_across_nodes_asks_for_the_address():
    job = jobenv.detect({**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert (job.scheduler, job.rank, job.world_size, job.local_rank, job.master_addr) == \
        ("openmpi", 1, 4, 1, "127.0.0.1")
    assert job.sources["master_port"] == "derived from PMIX_NAMESPACE"
    across = jobenv.detect(OMPI)  # 2 of 4 ranks on this node
    assert across.master_addr is None
    with pytest.raises(InvalidArgument, match="set MASTER_ADDR to the host of rank 0"):
        jobenv.rendezvous_method(across)
    pmi = jobenv.detect(PMI)
    assert (pmi.scheduler, pmi.rank, pmi.world_size, pmi.master_addr) == ("pmi", 2, 3, "127.0.0.1")
    with pytest.raises(InvalidArgument, match="set MASTER_PORT"):
        jobenv.rendezvous_method(jobenv.detect({k: v for k, v in PMI.items() if k != "PMI_PORT"}))


def test_the_launcher_wins_and_a_disagreement_is_named():
    launcher = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "a", "MASTER_PORT": "1234"}
    job = jobenv.detect(launcher)
    assert (job.scheduler, job.rank, job.world_size, job.sources["rank"]) == ("launcher", 5, 8, "RANK")
    assert jobenv.rendezvous_method(job) is None  # env://, as before
    # pybridge-launch under srun: one launcher per node, its ranks are not srun's tasks
    agent = jobenv.detect({**SLURM, **launcher, "TORCHELASTIC_RUN_ID": "x"})
    assert (agent.scheduler, agent.rank) == ("launcher", 5)
    with pytest.raises(InvalidArgument, match=r"RANK=5 but SLURM_PROCID=3 \(slurm\)"):
        jobenv.detect({**SLURM, **launcher})
    assert jobenv.detect({}).scheduler is None
    with pytest.raises(InvalidArgument, match="OMPI_COMM_WORLD_RANK='x' is not an integer"):
        jobenv.detect({**OMPI, "OMPI_COMM_WORLD_RANK": "x"})


HELLO = """
import torch, pybridge
job = pybridge.env()
g = pybridge.init(backend="gloo", timeout=30)
x = torch.full((3,), float(g.rank + 1))
pybridge.all_reduce(x, "sum")
print("RESULT", job.scheduler, g.rank, g.size, g.local_rank, x.tolist(), flush=True)
pybridge.finalize()
"""


def _free_derived(prefix, make, rank0):
    """The job's scheduler variables (from make(key)) whose derived port is free here."""
    for _ in range(50):
        env = make(f"{prefix}-{uuid.uuid4().hex}")
        # the ranks inherit this worker's PYBRIDGE_PORTS (conftest.py): derive as they will
        port = jobenv.detect({**env, **rank0, "PYBRIDGE_PORTS": os.environ.get("PYBRIDGE_PORTS", "")}).master_port
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return env
            except OSError:
                continue
    raise AssertionError("no free derived port in 50 tries")


def _outputs(procs, timeout):
    """Each process's output; all of them killed if one is not done within `timeout` s."""
    try:
        return [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.mark.parametrize("scheduler", ["openmpi", "slurm"])
def test_ranks_started_by_a_scheduler_form_a_world_with_no_exports(scheduler):
    """Two processes with only the scheduler's variables, as mpirun -np 2 or srun -n 2 on one
    node start them: no RANK, WORLD_SIZE or MASTER_* anywhere."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "OMPI_", "PMI", "TORCHELASTIC"))}
    if scheduler == "openmpi":
        ranks = [{"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": str(r),
                  "OMPI_COMM_WORLD_LOCAL_SIZE": "2"} for r in range(2)]
        job = _free_derived("prterun", lambda ns: {"PMIX_NAMESPACE": ns}, ranks[0])
    else:
        ranks = [{"SLURM_PROCID": str(r), "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": str(r)} for r in range(2)]
        job = _free_derived("job", lambda j: {"SLURM_JOB_ID": j, "SLURM_STEP_ID": "0",
                                              "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "4"}, ranks[0])
    procs = [subprocess.Popen([sys.executable, "-c", HELLO], env={**base, **job, **r}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) for r in ranks]
    outs = _outputs(procs, 90)
    assert all(p.returncode == 0 for p in procs), outs
    for r, out in enumerate(outs):
        assert f"RESULT {scheduler} {r} 2 {r} [3.0, 3.0, 3.0]" in out, out


def test_a_launcher_under_srun_takes_its_node_and_rendezvous_from_slurm():
    step = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "4", "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_STEP_NODELIST": "gpu[02-05]", "SLURM_NODEID": "2", "SLURM_PROCID": "2"}
    job = jobenv.launcher_job(step)
    assert (job.nnodes, job.node_rank, job.endpoint) == (4, 2, ("gpu02", jobenv.detect(step).master_port))
    with pytest.raises(InvalidArgument, match=r"this step has 8 tasks \(SLURM_STEP_NUM_TASKS\) on 4 nodes "
                                              r"\(SLURM_STEP_NUM_NODES\); use `srun --ntasks-per-node=1"):
        jobenv.launcher_job({**step, "SLURM_STEP_NUM_TASKS": "8"})
    batch = jobenv.launcher_job({"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "4"})  # the batch script itself
    assert batch.nnodes is None and "of 4 nodes but not started by srun: only this node runs" in batch.warning
    assert jobenv.launcher_job({"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1"}).warning is None
    assert jobenv.launcher_job({}) == jobenv.LauncherJob()


def test_two_launchers_started_as_srun_would_form_one_world():
    """`srun -N 2 --ntasks-per-node=1 pybridge-launch --nproc-per-node 1 hello.py`, both
    "nodes" on this machine: no --nnodes, --node-rank or endpoint on the command line."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "PET_", "TORCHELASTIC"))}
    job = _free_derived("job", lambda j: {"SLURM_JOB_ID": j, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2",
                                          "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "localhost"},
                        {"SLURM_PROCID": "0"})
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "hello.py")
        with open(script, "w") as f:
            f.write(HELLO)
        procs = [subprocess.Popen([sys.executable, "-m", "pybridge.launch", "--nproc-per-node", "1", script],
                                  env={**base, **job, "SLURM_NODEID": str(n), "SLURM_PROCID": str(n),
                                       "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, start_new_session=True) for n in (0, 1)]
        outs = _outputs(procs, 120)
    assert all(p.returncode == 0 for p in procs), outs
    for n, out in enumerate(outs):
        assert f"from srun: --nnodes 2 (SLURM_STEP_NUM_NODES), --node-rank {n} (SLURM_NODEID), --rdzv-endpoint " \
               f"localhost:" in out, out
        assert f"RESULT launcher {n} 2 0 [3.0, 3.0, 3.0]" in out, out


def test_pet_variables_are_the_launchers_defaults_as_torchrun_reads_them(tmp_path):
    """Kubernetes' PyTorchJob passes torchrun's options as PET_* variables."""
    script = tmp_path / "report"
    script.write_text(f"#!{sys.executable}\n" + "import os\n"  # one write per line: ranks print at once
                      "os.write(1, ('WORKER %s %s\\n' % (os.environ['RANK'], os.environ['WORLD_SIZE'])).encode())\n")
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))}
    p = subprocess.run([sys.executable, "-m", "pybridge.launch", str(script)], capture_output=True, text=True,
                       env={**env, "PET_NPROC_PER_NODE": "3", "PET_NO_PYTHON": "1", "PYTHONPATH": ROOT}, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(line for line in unprefixed(p.stdout).splitlines() if line.startswith("WORKER")) == \
        ["WORKER 0 3", "WORKER 1 3", "WORKER 2 3"]


def test_port_range_is_checked_and_free_port_keeps_to_it(monkeypatch):
    for bad in ("20000", "3000-2000", "80-90", "20000-70000", "a-b"):
        with pytest.raises(InvalidArgument, match=f"PYBRIDGE_PORTS='{bad}': expected LOW-HIGH"):
            netif.port_range({"PYBRIDGE_PORTS": bad})
    monkeypatch.setenv("PYBRIDGE_PORTS", "41000-41003")
    assert {netif.free_port() for _ in range(40)} <= set(range(41000, 41004))


def test_free_port_ignores_the_global_random_seed():
    import random
    picks = []
    for _ in range(3):
        random.seed(1)  # torch's test cases seed it; every pytest worker would then pick alike
        picks.append(netif.free_port())
    assert len(set(picks)) > 1


def test_slurm_ranks_per_node_come_from_the_steps_tasks_on_this_node(monkeypatch):
    # A real srun sets no LOCAL_WORLD_SIZE: node_groups() took the whole world as one node.
    assert jobenv.detect({**SLURM, "SLURM_GTIDS": "2,3"}).local_world_size == 2
    job = jobenv.detect({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "4(x2)"})
    assert (job.local_world_size, job.sources["local_world_size"]) == (4, "SLURM_STEP_TASKS_PER_NODE")
    assert jobenv.detect({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "3,2"}).local_world_size is None  # uneven
    assert jobenv.ranks_per_node({**SLURM, "SLURM_GTIDS": "0,1,2"}) == 3
    assert jobenv.ranks_per_node({**SLURM, "SLURM_GTIDS": "0,1", "RANK": "3", "WORLD_SIZE": "8",
                                  "LOCAL_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"}) == 4  # the launcher's
    assert jobenv.ranks_per_node(OMPI) == 2


def test_a_scheduler_job_across_nodes_names_the_interface_towards_rank_0(monkeypatch):
    # Under a real srun, gloo listened on the address the hostname resolves to (none here:
    # loopback) and every rank timed out connecting to 127.0.0.1; init() now names the
    # interface that reaches rank 0's host, as pybridge-launch does for its workers.
    seen = []
    monkeypatch.setattr(netif, "interface_towards", lambda host: seen.append(host) or ("eth7", "10.9.0.2"))
    env = {}
    assert jobenv.choose_interface(jobenv.detect(SLURM), env) == "eth7"
    assert env == {"GLOO_SOCKET_IFNAME": "eth7", "NCCL_SOCKET_IFNAME": "eth7"} and seen == ["gpu04"]
    env = {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}  # the user's win
    assert jobenv.choose_interface(jobenv.detect(SLURM), env) is None and env["GLOO_SOCKET_IFNAME"] == "ib0"
    launched = jobenv.detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    assert jobenv.choose_interface(launched, {}) is None  # pybridge-launch chose already
    monkeypatch.setattr(netif, "interface_towards", lambda host: ("lo", "127.0.0.1"))
    env = {}
    assert jobenv.choose_interface(jobenv.detect(OMPI), env) is None and env == {}  # one node: loopback
