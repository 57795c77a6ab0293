"""Who this process is in its job, and where the job meets: the one rule for Python, C and Go.

From the launcher's variables when they are there (pybridge-launch and torchrun set RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), else from the
scheduler that started the process, so that `srun` and `mpirun` need no export lines:

  SLURM (srun)          SLURM_PROCID, SLURM_STEP_NUM_TASKS (the step's, not the job's
                        SLURM_NTASKS, which counts tasks that never start in this step),
                        SLURM_LOCALID, SLURM_GTIDS (this node's ranks, counted; else
                        SLURM_STEP_TASKS_PER_NODE when uniform); the master is the step's
                        first node (SLURM_STEP_NODELIST, expanded from "node[01-04,07]"),
                        its port derived from the job and step ids
                        (within PYBRIDGE_PORTS where set)
  Open MPI (mpirun)     OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
  MPICH, Intel MPI      PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
  (Hydra's PMI)

Under MPI the master is loopback when every rank is on one node; across nodes it needs
MASTER_ADDR (MPI does not say where rank 0 runs), and says so. The port under MPI is
derived from the job's id (PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, or Hydra's PMI_PORT), so
every rank derives the same one. MASTER_ADDR and MASTER_PORT given by hand win everywhere.

A launcher variable beside a scheduler's that disagrees (RANK=1 with SLURM_PROCID=0, say)
is an error naming both, unless the launcher is torchrun's agent (pybridge-launch under
srun runs one launcher per node, whose ranks are not srun's tasks). `detect()` reports
where each value came from (pybridge.env()).
"""

import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Mapping, MutableMapping, Optional, Union

from ..errors import InvalidArgument
from . import netif



# name: (rank, world size, local rank, local world size) variables of each scheduler
_Names = Union[str, tuple[str, ...], None]  # a variable, or the first set of several
_Found = tuple[Optional[int], Optional[str]]  # (value, the variable it came from)
SCHEDULERS: dict[str, tuple[str, _Names, str, Optional[str]]] = {
    "slurm": ("SLURM_PROCID", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), "SLURM_LOCALID", None),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "pmi": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
}


@dataclass
class JobEnv:
    """This process's place in its job; None where nothing says. `sources` names the variable
    (or rule) each value came from; `scheduler` is "launcher", "slurm", "openmpi", "pmi" or
    None (nothing set: a single process, or values passed to init).

    Example::

        >>> import pybridge
        >>> job = pybridge.env()                # what init() will read, and from where
        >>> job.sources.get("rank")             # under pybridge-launch or torchrun
        'RANK'
    """
    rank: Optional[int] = None
    world_size: Optional[int] = None
    local_rank: Optional[int] = None
    local_world_size: Optional[int] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    scheduler: Optional[str] = None
    sources: dict[str, str] = field(default_factory=dict)


def env_int(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """An integer environment variable (of `env`, default os.environ), or None when unset
    or empty; InvalidArgument naming it when it is not an integer."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidArgument(f"environment variable {name}={raw!r} is not an integer") from None


def _first(env: Mapping[str, str], names: _Names) -> _Found:
    """(value, name) of the first of `names` that is set."""
    for name in (names if isinstance(names, tuple) else (names,)):
        if name is not None and env.get(name, "") != "":
            return env_int(name, env), name
    return None, None


def expand_nodelist(text: Optional[str]) -> list[str]:
    """SLURM's compressed host list as a list: "node[01-03,07],gpu5" -> node01, node02,
    node03, node07, gpu5 (zero padding kept)."""
    hosts = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text or ""):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise InvalidArgument(f"SLURM node list {text!r}: cannot read the range {r!r}")
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{n:0{len(lo)}d}{suffix}")
    return hosts


def _derived_port(key: str, env: Mapping[str, str]) -> int:
    """The same port on every rank of a job, from port_range() (PYBRIDGE_PORTS, else 20000-31999)."""
    ports: list[int] = netif.port_range(env)
    return ports[zlib.crc32(key.encode()) % len(ports)]


def _scheduler_values(env: Mapping[str, str]) -> tuple[Optional[str], dict[str, _Found]]:
    """(scheduler, {value: (int, variable)}) of the first scheduler whose rank is set."""
    for name, (rank_v, size_v, local_v, local_size_v) in SCHEDULERS.items():
        rank, rank_name = _first(env, rank_v)
        if rank is None:
            continue
        values = {"rank": (rank, rank_name), "world_size": _first(env, size_v),
                  "local_rank": _first(env, local_v), "local_world_size": _first(env, local_size_v)}
        if name == "slurm":
            values["local_world_size"] = _slurm_local_size(env)
        return name, values
    return None, {}


def _slurm_local_size(env: Mapping[str, str]) -> _Found:
    """(tasks of the step on this node, source): SLURM_GTIDS lists their ranks ("0,1");
    else SLURM_STEP_TASKS_PER_NODE when every node has as many ("2(x4)", "2"); else None."""
    gtids = env.get("SLURM_GTIDS", "")
    if gtids:
        return len(gtids.split(",")), "SLURM_GTIDS (this node's tasks)"
    per = env.get("SLURM_STEP_TASKS_PER_NODE", "")
    m = re.fullmatch(r"(\d+)(?:\(x\d+\))?", per)
    return (int(m[1]), "SLURM_STEP_TASKS_PER_NODE") if m else (None, None)


_Where = tuple[Optional[str], Optional[str]]  # (address, what said so)


def _slurm_master(env: Mapping[str, str]) -> tuple[_Where, _Found]:
    nodes_var = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    nodes = expand_nodelist(env.get(nodes_var, ""))
    job = env.get("SLURM_JOB_ID", "")
    step = env.get("SLURM_STEP_ID", "0")
    addr: _Where = (nodes[0], f"the first node of {nodes_var}") if nodes else (None, None)
    port: _Found = (_derived_port(f"slurm:{job}.{step}", env), "derived from SLURM_JOB_ID and SLURM_STEP_ID") if job \
        else (None, None)
    return addr, port


def _mpi_master(env: Mapping[str, str], scheduler: str, world: Optional[int],
                local_world: Optional[int]) -> tuple[_Where, _Found]:
    key = next((f"{v}={env[v]}" for v in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PMI_PORT",
                                          "OMPI_MCA_orte_hnp_uri") if env.get(v)), None)
    port: _Found = (_derived_port(f"{scheduler}:{key}", env), f"derived from {key.split('=')[0]}") if key else (None, None)
    if world is not None and local_world is not None and local_world == world:
        return ("127.0.0.1", "every rank on this node (loopback)"), port
    return (None, None), port


def detect(environ: Optional[Mapping[str, str]] = None) -> JobEnv:
    """This process's JobEnv, from `environ` (default: os.environ)."""
    env = os.environ if environ is None else environ
    out = JobEnv()
    launcher_rank, launcher_size = env_int("RANK", env), env_int("WORLD_SIZE", env)
    scheduler, values = _scheduler_values(env)
    agent = bool(env.get("TORCHELASTIC_RUN_ID") or env.get("GROUP_RANK"))
    if launcher_rank is not None or launcher_size is not None:
        out.scheduler = "launcher"
        if scheduler and not agent:
            for what, mine in (("rank", (launcher_rank, "RANK")), ("world_size", (launcher_size, "WORLD_SIZE"))):
                theirs = values.get(what, (None, None))
                if mine[0] is not None and theirs[0] is not None and mine[0] != theirs[0]:
                    raise InvalidArgument(f"{mine[1]}={mine[0]} but {theirs[1]}={theirs[0]} ({scheduler}): the "
                                          f"launcher's variable and the scheduler's disagree; unset {mine[1]} to "
                                          f"take {scheduler}'s, or start the ranks with one of them")
        values = {"rank": (launcher_rank, "RANK"), "world_size": (launcher_size, "WORLD_SIZE"),
                  "local_rank": _first(env, "LOCAL_RANK"), "local_world_size": _first(env, "LOCAL_WORLD_SIZE")}
    elif scheduler:
        out.scheduler = scheduler
    for name, (value, source) in values.items():
        if value is not None and source is not None:
            setattr(out, name, value)
            out.sources[name] = source
    addr: _Where = (None, None)
    port: _Found = (None, None)
    if out.scheduler == "slurm":
        addr, port = _slurm_master(env)
    elif out.scheduler in ("openmpi", "pmi"):
        addr, port = _mpi_master(env, out.scheduler, out.world_size, out.local_world_size)
    if env.get("MASTER_ADDR"):
        addr = (env["MASTER_ADDR"], "MASTER_ADDR")
    if env.get("MASTER_PORT"):
        port = (env_int("MASTER_PORT", env), "MASTER_PORT")
    (host, host_src), (number, port_src) = addr, port
    if host is not None and host_src is not None:
        out.master_addr, out.sources["master_addr"] = host, host_src
    if number is not None and port_src is not None:
        out.master_port, out.sources["master_port"] = number, port_src
    return out


UNPLACED = ("rank and world size are unknown: set RANK and WORLD_SIZE (pybridge-launch and torchrun do), "
            "start the ranks with srun or mpirun, or pass them explicitly")


def placed(environ: Optional[Mapping[str, str]] = None) -> JobEnv:
    """detect(), as init() reads it when it is given nothing (pb_job_env, Go's
    FromLaunchEnv): InvalidArgument when rank or world size is unknown, and the local rank
    is the rank when nothing says."""
    job = detect(environ)
    if job.rank is None or job.world_size is None:
        raise InvalidArgument(UNPLACED)
    if job.local_rank is None:
        job.local_rank = job.rank
        job.sources["local_rank"] = "the rank (nothing says)"
    return job


def ranks_per_node(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """This node's ranks in the job: the launcher's LOCAL_WORLD_SIZE, else the scheduler's
    (SLURM_GTIDS, OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS); None when nothing says. The
    default of node_groups(), the hierarchical hook and gossip, which take nodes to be
    consecutive blocks of this many ranks (the launchers' layout, and srun's and mpirun's
    default block distribution)."""
    env = os.environ if environ is None else environ
    return env_int("LOCAL_WORLD_SIZE", env) or detect(env).local_world_size


def env() -> JobEnv:
    """Where this process's rank, world size, local rank and rendezvous come from: a JobEnv
    with each value and its source, as pybridge.init() will read them: the launcher's
    variables, else SLURM's, Open MPI's or PMI's (the module's docstring has the rule).

    Example::

        >>> import pybridge
        >>> job = pybridge.env()
        >>> job.scheduler in (None, "launcher", "slurm", "openmpi", "pmi")
        True
    """
    return detect()


def rendezvous_method(job: JobEnv) -> Optional[str]:
    """tcp://ADDR:PORT for a job a scheduler started (no MASTER_* set by hand), or None when
    the launcher's env:// applies. Raises InvalidArgument saying what to set when a
    scheduler's job has no address (MPI across nodes)."""
    if job.scheduler in (None, "launcher"):
        return None
    if job.master_addr is None:
        raise InvalidArgument(f"started by {job.scheduler} across nodes, with no address for rank 0: set "
                              "MASTER_ADDR to the host of rank 0 (MPI does not say where it runs); on one "
                              "node it is loopback")
    if job.master_port is None:
        raise InvalidArgument(f"started by {job.scheduler} with no job id to derive a port from: set MASTER_PORT")
    return f"tcp://{job.master_addr}:{job.master_port}"


def choose_interface(job: JobEnv, environ: Optional[MutableMapping[str, str]] = None) -> Optional[str]:
    """For a job a scheduler started across nodes: name the interface whose address reaches
    rank 0's host in GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME of `environ` (default
    os.environ), as pybridge-launch does for its workers, unless they are set. gloo
    otherwise listens on the address the hostname resolves to, often a loopback one
    (netif.py), and ranks on other nodes are told an address they cannot reach: under a
    real srun every rank timed out connecting to 127.0.0.1. Returns the interface named, or
    None (a launcher's job, loopback, set by the user, or no interface found)."""
    env = os.environ if environ is None else environ
    if job.scheduler in (None, "launcher") or not job.master_addr:
        return None
    if "GLOO_SOCKET_IFNAME" in env and "NCCL_SOCKET_IFNAME" in env:
        return None
    name: Optional[str] = netif.interface_towards(job.master_addr)[0]
    if name is None or name == "lo":
        return None
    env.setdefault("GLOO_SOCKET_IFNAME", name)
    env.setdefault("NCCL_SOCKET_IFNAME", name)
    return name


@dataclass
class LauncherJob:
    """What pybridge-launch takes from SLURM when srun started it (one launcher per node)."""
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    endpoint: Optional[tuple[str, int]] = None  # (host, port) of the static rendezvous node 0 hosts
    sources: dict[str, str] = field(default_factory=dict)
    warning: Optional[str] = None  # an allocation the launcher was not started in by srun


def launcher_job(environ: Optional[Mapping[str, str]] = None) -> LauncherJob:
    """The node count, node rank and rendezvous of a launcher that srun started once per
    node (`srun --ntasks-per-node=1 pybridge-launch ...`): SLURM_STEP_NUM_NODES,
    SLURM_NODEID, and the step's first node with the port derived as for ranks. Outside
    srun: nothing, and a warning where a multi-node allocation's batch script runs the
    launcher itself (only this node would run). InvalidArgument when the step has several
    tasks per node (each would start a whole node's processes)."""
    env = os.environ if environ is None else environ
    out = LauncherJob()
    if not env.get("SLURM_JOB_ID"):
        return out
    if not env.get("SLURM_STEP_ID"):
        allocated = env_int("SLURM_JOB_NUM_NODES", env) or env_int("SLURM_NNODES", env) or 1
        if allocated > 1:
            out.warning = (f"inside SLURM job {env['SLURM_JOB_ID']} of {allocated} nodes but not started by srun: "
                           "only this node runs; start one launcher per node with `srun --ntasks-per-node=1 "
                           "pybridge-launch ...`")
        return out
    nodes, nodes_var = _first(env, ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"))
    tasks, tasks_var = _first(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    node_rank = env_int("SLURM_NODEID", env)
    if nodes is None or node_rank is None:
        return out
    if tasks is not None and tasks != nodes:
        raise InvalidArgument(f"pybridge-launch under srun starts a whole node's processes, so it runs once per "
                              f"node: this step has {tasks} tasks ({tasks_var}) on {nodes} nodes ({nodes_var}); "
                              "use `srun --ntasks-per-node=1 pybridge-launch --nproc-per-node N ...`")
    (host, host_src), (port, port_src) = _slurm_master(env)
    out.nnodes, out.node_rank = nodes, node_rank
    out.sources.update(nnodes=nodes_var or "", node_rank="SLURM_NODEID")
    if host is not None and port is not None:
        out.endpoint = (host, port)
        out.sources["endpoint"] = f"{host_src}; port {port_src}"
    return out

