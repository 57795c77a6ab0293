"""Which CPUs each local rank computes on (pybridge-launch --cpu-bind).

Several ranks on one node each run torch's thread pools; unbound, with the launcher's
OMP_NUM_THREADS=1, a 2-rank job on a 48-core node computes on 2 cores, and with more threads
the ranks' pools fight over the same cores. Binding splits the CPUs this launcher may use
(its affinity: what the scheduler's cgroup or srun's --cpu-bind left it) among the local
ranks and gives each rank as many threads as CPUs, as `mpirun --bind-to core|numa` and
OMP_NUM_THREADS per process do:

  cores  whole physical cores (a core's hyperthreads stay together), in contiguous blocks,
         so that a rank's block lies on one NUMA node where the split allows
  numa   each rank takes the whole NUMA node(s) it falls on (ranks spread evenly over the
         nodes; ranks on the same node share it)
  none   no binding; OMP_NUM_THREADS=1 when several ranks share the node (torchrun's rule)

The default is cores when the CPUs were allocated to this job (a scheduler started the
launcher: SLURM, Open MPI or PMI variables, or its affinity is narrower than the machine, as
a cgroup cpuset leaves it), several ranks share the node and each can have a core of its
own; otherwise none. On a machine shared with other people's processes, pinned ranks
cannot move away from a busy core (measured: 0.42x the unbound speed, docs/launcher.md),
and pinned ranks that share a core run at half speed while the others wait for them. Asked
for explicitly, cores with fewer cores than ranks shares them round-robin (one core each). The map goes
to the worker shim as PYBRIDGE_CPU_MAP ("0-11;12-23": local rank 0's CPUs, then rank 1's).
"""

import os

MODES = ("none", "cores", "numa")


def allowed():
    """The CPUs this process may run on, sorted."""
    return sorted(os.sched_getaffinity(0))


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def parse_list(text):
    """'0-3,8,10-11' (the kernel's cpulist format) -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_list(cpus):
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    parts, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def topology(cpus, sysfs="/sys/devices/system/cpu"):
    """{cpu: (NUMA node, core)}: core is the smallest CPU of its hyperthread siblings.
    Unknown (no sysfs): node 0, each CPU its own core."""
    topo = {}
    for cpu in cpus:
        base = f"{sysfs}/cpu{cpu}"
        siblings = _read(f"{base}/topology/core_cpus_list") or _read(f"{base}/topology/thread_siblings_list")
        core = min(parse_list(siblings)) if siblings else cpu
        try:
            node = next(int(n[4:]) for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit())
        except (OSError, StopIteration):
            node = 0
        topo[cpu] = (node, core)
    return topo


def _groups(cpus, topo, key):
    """CPUs grouped by key(topo[cpu]), the groups in (node, core) order."""
    found = {}
    for cpu in sorted(cpus, key=lambda c: (topo[c], c)):
        found.setdefault(key(topo[cpu]), []).append(cpu)
    return list(found.values())


SCHEDULER_VARS = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def allocated(cpus, env=None, machine_cpus=None):
    """Were these CPUs given to this job (by a scheduler, or a cpuset narrower than the machine)?"""
    env = os.environ if env is None else env
    return any(env.get(v) for v in SCHEDULER_VARS) or len(cpus) < (machine_cpus or os.cpu_count() or 0)


def default_mode(nproc, cpus, topo, env=None, machine_cpus=None):
    """cores when the CPUs are the job's own and 1 < nproc <= their whole cores, else none."""
    cores = len({topo[c] for c in cpus})
    return "cores" if 1 < nproc <= cores and allocated(cpus, env, machine_cpus) else "none"


def plan(mode, nproc, cpus, topo):
    """Each local rank's CPUs (a list of nproc sorted lists), or None for mode 'none'."""
    if mode not in MODES:
        raise ValueError(f"--cpu-bind must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none" or not cpus:
        return None
    groups = _groups(cpus, topo, (lambda t: t) if mode == "cores" else (lambda t: t[0]))
    n = len(groups)
    if mode == "numa" and n < nproc:
        return [sorted(groups[r * n // nproc]) for r in range(nproc)]
    if n < nproc:  # fewer cores than ranks: one core each, shared round-robin
        return [sorted(groups[r % n]) for r in range(nproc)]
    return [sorted(c for g in groups[r * n // nproc:(r + 1) * n // nproc] for c in g) for r in range(nproc)]


def encode(cpu_plan):
    return ";".join(format_list(cpus) for cpus in cpu_plan)


def describe(mode, cpu_plan):
    ranks = ", ".join(f"local rank {r} -> CPUs {format_list(c)}" for r, c in enumerate(cpu_plan))
    return f"CPU binding ({mode}; --cpu-bind none|cores|numa): {ranks}"
