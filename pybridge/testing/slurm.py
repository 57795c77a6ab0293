"""A real SLURM cluster on the simulated one (cluster.py): Debian's slurmctld and slurmd, with
munge, one slurmd per node namespace.

For tests/test_slurm.py and docs/clusters.md: jobs started with the real `srun` and
`sbatch`, so the ranks see the variables a production SLURM sets, not ones a test wrote.

    with Cluster(4) as c, Slurm(c, folder) as s:
        out = s.run(["srun", "-N", "4", "--ntasks-per-node", "2", "python3", "rank.py"], timeout=120)

Layout: one munged in the host's namespace (its socket is a file, reachable from every
node: UNIX sockets on a file system cross network namespaces), slurmctld in node 0 (in a
UTS namespace of its own named node0, since it runs only where its hostname is the
configured SlurmctldHost), and `slurmd -N node<k>` in each node. Clients (srun, sbatch,
scontrol) run in node 0: srun listens for its tasks' output there. Everything lives in
`folder` (slurm.conf, cgroup.conf, the munge key, spool and state folders, daemons' logs);
SLURM_CONF points every command at it, so the machine's /etc/slurm is never read.

What this needs beyond a default configuration, found by running it:
- `ip netns exec` mounts a fresh /sys, without /sys/fs/cgroup, and slurmd 22.05 loads a
  cgroup plugin even with proctrack/pgid and task/none ("No filesystem mounted on
  /sys/fs/cgroup ... slurmd initialization failed"): cgroup.conf names cgroup/v1 with a
  mount point in `folder` and no automount, which slurmd accepts and never uses;
- the per-node spool folders (SlurmdSpoolDir=.../%n) must exist before slurmd starts;
- SlurmdParameters=config_overrides: the nodes are configured with `cpus` each, whatever
  the machine has.

Teardown (the Slurm's close(), then the Cluster's): munged is killed by its process; the
daemons and every job's processes run in the nodes, which the Cluster kills.
"""

import os
import shutil
import signal
import subprocess
import time

from .cluster import ClusterError

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo")
# Variables of an outer job or launcher that must not reach the jobs started here: the
# tests check that the ranks find their place with no export lines.
OUTER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
         "TORCHELASTIC_RUN_ID", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def available():
    """(True, "") when the SLURM and munge programs are installed, else (False, why not)."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return False, (f"{', '.join(missing)} not installed (Debian: apt-get install slurmctld slurmd "
                       "slurm-client munge; `make test-clusters` does)")
    return True, ""


def clean_env(extra=None):
    """os.environ without SLURM's, MPI's or a launcher's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "OMPI_", "PMIX_", "PMI_", "PET_"))
           and k not in OUTER}
    env.update(extra or {})
    return env


class Slurm:
    """slurmctld and one slurmd per node of `cluster` (nodes node0..node<n-1>, `cpus` CPUs
    each, one partition `test`), configured in `folder`; ready (every node idle) when the
    constructor returns, within `timeout` seconds."""

    def __init__(self, cluster, folder, *, cpus=2, timeout=60):
        self.cluster, self.folder = cluster, os.path.abspath(folder)
        self.conf = os.path.join(self.folder, "slurm.conf")
        self.env = clean_env({"SLURM_CONF": self.conf})
        self._munged = None
        self._closed = False
        try:
            self._write_config(cpus)
            self._start(timeout)
        except BaseException:
            self.close()
            raise

    def path(self, *parts):
        return os.path.join(self.folder, *parts)

    def _write_config(self, cpus):
        for d in ("state", "cgroup", "munge", *(os.path.join("spool", f"node{n.index}") for n in self.cluster.nodes)):
            os.makedirs(self.path(d), mode=0o700, exist_ok=True)
        with open(self.path("munge", "key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(self.path("munge", "key"), 0o400)
        nodes = "".join(f"NodeName=node{n.index} NodeAddr={n.address} CPUs={cpus} State=UNKNOWN\n"
                        for n in self.cluster.nodes)
        last = len(self.cluster.nodes) - 1
        with open(self.conf, "w") as f:
            f.write(f"""# written by pybridge/testing/slurm.py
ClusterName=pybridge
SlurmctldHost=node0({self.cluster.nodes[0].address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.path("munge", "socket")},cred_expire=10
CredType=cred/munge
StateSaveLocation={self.path("state")}
SlurmdSpoolDir={self.path("spool", "%n")}
SlurmctldPidFile={self.path("slurmctld.pid")}
SlurmdPidFile={self.path("slurmd.%n.pid")}
SlurmctldLogFile={self.path("slurmctld.log")}
SlurmdLogFile={self.path("slurmd.%n.log")}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
{nodes}PartitionName=test Nodes=node[0-{last}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")
        with open(self.path("cgroup.conf"), "w") as f:
            f.write(f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={self.path('cgroup')}\nCgroupAutomount=no\n")

    def _log(self, name):
        return open(self.path(name), "ab")

    def _start(self, timeout):
        m = self.path("munge")
        with self._log("munged.out") as log:
            self._munged = subprocess.Popen(
                ["munged", "-F", "-f", f"--key-file={m}/key", f"--socket={m}/socket", f"--pid-file={m}/pid",
                 f"--log-file={m}/log", f"--seed-file={m}/seed"], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self._wait("munged", lambda: os.path.exists(os.path.join(m, "socket")), 20)
        node0 = self.cluster.nodes[0]
        with self._log("slurmctld.out") as log:
            node0.popen(["unshare", "--uts", "sh", "-c", "hostname node0 && exec slurmctld -D"], env=self.env,
                        stdout=log, stderr=subprocess.STDOUT)
        for node in self.cluster.nodes:
            with self._log(f"slurmd.node{node.index}.out") as log:
                node.popen(["slurmd", "-D", "-N", f"node{node.index}"], env=self.env, stdout=log,
                           stderr=subprocess.STDOUT)
        want = {f"node{n.index}" for n in self.cluster.nodes}

        def idle():
            try:
                out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10).stdout
            except subprocess.TimeoutExpired:
                return False
            states = dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)
            return all(states.get(n) == "idle" for n in want)
        self._wait("every node idle", idle, timeout)

    def _wait(self, what, ready, timeout):
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise ClusterError(f"SLURM: {what} not within {timeout} s\n{self.logs()}")
            time.sleep(0.5)

    def run(self, argv, *, timeout, node=0, env=None, cwd=None):
        """Run a client command (srun, sbatch, scontrol...) in node `node`; its output
        (stderr into stdout) in the result's stdout. subprocess.TimeoutExpired past
        `timeout` (its process group killed)."""
        return self.cluster.nodes[node].run(argv, timeout=timeout, env={**self.env, **(env or {})}, cwd=cwd)

    def job_state(self, job_id):
        """{field: value} of `scontrol show job` (JobState, Restarts, ExitCode...), {} when gone."""
        out = self.run(["scontrol", "-o", "show", "job", str(job_id)], timeout=20).stdout
        fields = {}
        for word in out.split():
            key, eq, value = word.partition("=")
            if eq:
                fields.setdefault(key, value)
        return fields

    def logs(self, lines=15):
        """The last `lines` lines of each daemon's log, for a failure's message."""
        out = []
        for name in sorted(os.listdir(self.folder)):
            if name.endswith((".log", ".out")):
                with open(self.path(name), errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
                out.append(f"--- {name}\n" + "\n".join(tail))
        return "\n".join(out)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Kill munged; the nodes' processes (daemons, jobs) go with the cluster."""
        if self._closed:
            return
        self._closed = True
        for node in self.cluster.nodes:
            node.kill()
        if self._munged is not None and self._munged.poll() is None:
            try:
                os.killpg(self._munged.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._munged.wait(timeout=10)


__all__ = ["Slurm", "available", "clean_env"]
