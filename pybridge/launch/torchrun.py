"""pybridge-launch: start one process per GPU (or N CPU processes) on this node.

    pybridge-launch [options] TARGET [ARGS...]
    python -m pybridge.launch [options] TARGET [ARGS...]

TARGET is a Python script (a path ending in .py, run with this interpreter), a module
(with -m), or any executable (a Go binary, a shell script, ...; found on PATH like a shell
would). Everything after TARGET is passed to it unchanged.

This is a thin front end over torch's elastic launcher (torch.distributed.run, i.e. torchrun):
rendezvous, multi-node, restarts and failure handling are torchrun's. pybridge adds
  * defaults that fit pybridge: --nproc-per-node defaults to the number of GPUs, or to 2 CPU
    processes when there is none (env PYBRIDGE_NPROC overrides the default); a single-node job
    uses a private rendezvous on a free loopback port (as torchrun --standalone, but bound to
    127.0.0.1 and sealed with a job secret made for it, see docs/launcher.md);
  * a per-rank device: PYBRIDGE_DEVICE is "cuda:<LOCAL_RANK mod #GPUs>" on GPU machines and
    "cpu" otherwise (with --isolate-gpus, CUDA_VISIBLE_DEVICES is set to that one GPU and
    PYBRIDGE_DEVICE to "cuda:0");
  * a readable failure report: when a rank fails, torchrun stops the others and this launcher
    exits non-zero with a line naming the rank that failed first (exit times are taken to the
    millisecond, see exit_clock.py; ranks that report a lost peer come after it),
        pybridge-launch: rank 1 (local rank 1, node 0) failed with exit code 3
        pybridge-launch: rank 1 (local rank 1) was killed by signal SIGKILL
    followed by the last lines of that rank's stderr. The exit status is the failed rank's
    exit code (128 + N when it was killed by signal N; 1 when unknown).

Environment of every process (set by torchrun unless noted):
  RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (= node rank), MASTER_ADDR,
  MASTER_PORT, TORCHELASTIC_RESTART_COUNT (0 on the first attempt), PYBRIDGE_DEVICE (pybridge),
  OMP_NUM_THREADS=1 when several processes share a node and it is not already set.
  With --cpu-bind cores|numa (cores is the default on CPUs a scheduler allocated, when
  several processes share the node and each can have a core of its own),
  each process is bound to its share of the launcher's CPUs and OMP_NUM_THREADS is the size
  of that share unless set (pybridge/launch/cpubind.py).

Output: each process's stdout and stderr are kept in log files, one pair per rank (under
--log-dir, as <run id>/attempt_<N>/<local rank>/stdout.log and stderr.log, or in a temporary
folder that is removed after a successful run), and copied to the launcher's stdout and
stderr with a prefix on each line, as torchrun --tee 3 does: "[rank<R>]:" on one node,
"[node<N> rank<R>]:" in a multi-node job (N: the node rank; the host's name instead with a
dynamic rendezvous, where a node gets its rank only later). Lines stay whole: a line is
copied once it is complete, so ranks' lines never mix (pybridge/launch/lines.py). A failure
shows the last lines of the failed rank's stderr log. A program linked with libpybridge gets
a line-buffered stdout (PYBRIDGE_LINE_BUFFERED=1), as on a terminal; another C program's stdio
fills a file in 4 KiB blocks before it writes, unless it flushes. --no-prefix (or PYBRIDGE_LOG_PREFIX=0)
copies the lines as the ranks wrote them, for programs whose output is read by another
program; the log files are kept all the same. TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, when
set, is the prefix, as in torchrun (${rank}, ${local_rank}, ${role_name}).

Multi-node: run one launcher per node with the same --nnodes and --rdzv-endpoint HOST:PORT
(reachable by every node; HOST is node 0's address).
  * with --node-rank (0 .. nnodes-1) the rendezvous is static: node 0 hosts it on PORT;
  * without --node-rank it is torchrun's dynamic c10d rendezvous (nodes get ranks in order of
    arrival; every launcher must use the same --rdzv-id). --master-addr/--master-port are
    accepted as another spelling of --rdzv-endpoint.
"""

import argparse
import glob
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from typing import Any, Callable, Optional, Sequence, Union, cast

from .._version import __version__
from ..base import jobenv, netif
from ..base import secret as _secret
from ..errors import InvalidArgument, PyBridgeError
from . import cpubind
from .exits import PROG, REQUEUE, ExitClock, forward_signals, signal_exit

DEFAULT_CPU_NPROC = 2
STDERR_TAIL_LINES = 30

# Run in every worker before its target: sets the per-rank device and CPUs, then runs a Python
# target in this process (runpy) or execs an executable, so the worker keeps torchrun's pid
# (signals, exit codes). Plain `python -c`: no import of pybridge or torch on the way.
# argv: MODE TARGET ARGS...; MODE is "script", "module" or "exec".
_WORKER_SHIM = r"""
import os, sys
mode, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
launcher = int(os.environ.get("PYBRIDGE_LAUNCHER_PID", "0"))
if launcher:
    # End with the launcher: SIGKILL when it dies, however it dies (kill -9, the OOM killer),
    # so that a dead node is dead whole and its GPUs are freed. Kept across the exec of a
    # C or Go target. Set after the fork, so a launcher that died before it is checked too.
    import ctypes, signal
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != launcher:
        sys.stderr.write("pybridge-launch: the launcher (pid %d) is gone; not starting\n" % launcher)
        sys.exit(1)
local_rank = int(os.environ.get("LOCAL_RANK", "0"))
gpus = int(os.environ.get("PYBRIDGE_NUM_GPUS", "0"))
if gpus > 0:
    gpu = local_rank % gpus
    if os.environ.get("PYBRIDGE_ISOLATE_GPUS") == "1":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [v for v in visible.split(",") if v] if visible else [str(i) for i in range(gpus)]
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[gpu % len(ids)]
        gpu = 0
    os.environ["PYBRIDGE_DEVICE"] = "cuda:%d" % gpu
else:
    os.environ["PYBRIDGE_DEVICE"] = "cpu"
cpu_map = os.environ.get("PYBRIDGE_CPU_MAP")  # cpubind.py: "0-11;12-23", a share per local rank
if cpu_map:
    shares = cpu_map.split(";")
    cpus = set()
    for part in shares[local_rank % len(shares)].split(","):  # cpubind.parse_list: no pybridge import here
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        sys.stderr.write("pybridge-launch: local rank %d not bound to CPUs %s: %s\n" % (local_rank, sorted(cpus), exc))
    else:
        if os.environ.get("PYBRIDGE_CPU_THREADS") == "1":
            os.environ["OMP_NUM_THREADS"] = str(len(cpus))
sys.stdout.flush()
if mode != "exec":
    # Python targets run here, as `python [-m] TARGET` would, with line-buffered output:
    # unbuffered (-u), print() writes its text and its newline in two writes, and two ranks'
    # lines interleaved mid-line on the console ("OKOK 0  1"); a line is now one write.
    import runpy
    for stream in (sys.stdout, sys.stderr):  # write_through off: PYTHONUNBUFFERED may have set it
        stream.reconfigure(line_buffering=True, write_through=False)
    sys.argv = [target] + args
    if mode == "script":
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")
    else:
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    sys.exit(0)
try:
    os.execvp(target, [target] + args)
except OSError as exc:
    sys.stderr.write("pybridge-launch: cannot run %s: %s\n" % (target, exc.strerror or exc))
    sys.exit(127)
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Start one process per GPU (or N CPU processes) running TARGET, over torch's "
                    "elastic launcher (torchrun).",
        epilog="Each process gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and "
               "PYBRIDGE_DEVICE. See `python -c 'import pybridge.launch as l; help(l)'`.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", default=None,
                   help="processes on this node: an integer, 'gpu' or 'auto' (default: the number "
                        f"of GPUs, or {DEFAULT_CPU_NPROC} without GPUs; env PYBRIDGE_NPROC)")
    p.add_argument("--nnodes", default=None, help="number of nodes, or MIN:MAX (default 1; under srun, the step's)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=None,
                   help="this node's rank (0..nnodes-1): static rendezvous hosted by node 0")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default=None,
                   help="HOST:PORT of the rendezvous (node 0's address) for multi-node jobs")
    p.add_argument("--master-addr", "--master_addr", default=None,
                   help="same as the HOST of --rdzv-endpoint")
    p.add_argument("--master-port", "--master_port", type=int, default=None,
                   help="same as the PORT of --rdzv-endpoint")
    p.add_argument("--rdzv-id", "--rdzv_id", default=None,
                   help="job id shared by all launchers of a dynamic (c10d) rendezvous (default 'pybridge'), and "
                        "the job's name in etcd with --rdzv-backend etcd (default on one node: a new one)")
    p.add_argument("--rdzv-backend", "--rdzv_backend", default=None, choices=("c10d", "static", "etcd", "etcd-v2"),
                   help="etcd: the ranks (and on several nodes the launchers) meet in etcd, at the members "
                        "--rdzv-endpoint lists (HOST:PORT,HOST:PORT,...), so that no node hosts the store "
                        "(docs/elastic.md); default: node 0 hosts it (c10d, or static with --node-rank)")
    p.add_argument("--rdzv-conf", "--rdzv_conf", default=None, metavar="KEY=VALUE,...",
                   help="etcd's TLS and users: cacert=FILE,cert=FILE,key=FILE,user=NAME (the password in "
                        "PYBRIDGE_ETCD_PASSWORD, never on the command line)")
    p.add_argument("--standalone", action="store_true",
                   help="single node, private rendezvous on a free port (the default for --nnodes 1 "
                        "without an endpoint)")
    p.add_argument("--max-restarts", "--max_restarts", type=int, default=0,
                   help="restart the whole group up to this many times after a failure (default 0)")
    p.add_argument("--monitor-interval", type=float, default=0.1,
                   help="seconds between checks of the processes (default 0.1)")
    p.add_argument("--shutdown-timeout", type=int, default=10,
                   help="seconds the other ranks get after SIGTERM before SIGKILL (default 10)")
    p.add_argument("--log-dir", default=None,
                   help="keep per-rank logs here (default: a temporary folder, removed on success)")
    p.add_argument("--no-prefix", action="store_true",
                   default=os.environ.get("PYBRIDGE_LOG_PREFIX", "1").strip().lower() in ("0", "no", "false", "off"),
                   help="copy the ranks' output lines without the \"[rank<R>]:\" prefix (whole lines all the same; "
                        "env PYBRIDGE_LOG_PREFIX=0)")
    p.add_argument("--cpu-bind", choices=cpubind.MODES, default=None,
                   help="bind each process to its share of this launcher's CPUs, whole cores or "
                        "NUMA nodes, with as many threads (default: cores on CPUs a scheduler "
                        "allocated, when several processes share the node and each can have a "
                        "core of its own, else none; env PYBRIDGE_CPU_BIND)")
    p.add_argument("--isolate-gpus", action="store_true",
                   help="set CUDA_VISIBLE_DEVICES to each process's one GPU")
    p.add_argument("--elastic", action="store_true",
                   help="elastic mode: a worker's death does not stop the others; they go on from their "
                        "last commit (pybridge.runtime.elastic, docs/elastic.md). The launcher of node 0 hosts "
                        "the store, or with --rdzv-backend etcd etcd does (no node is special)")
    p.add_argument("--min-world", type=int, default=1,
                   help="elastic: the smallest world the job may continue with (default 1)")
    p.add_argument("--max-world", type=int, default=None,
                   help="elastic: the largest world (joiners beyond it wait; default: no limit)")
    p.add_argument("--replace", type=int, default=0,
                   help="elastic: start up to this many replacements of dead workers (default 0)")
    p.add_argument("--trace", metavar="DIR", default=None,
                   help="record every rank: traces, metrics (JSON lines, TensorBoard) into DIR, merged into "
                        "DIR/trace.json when the ranks end (docs/observability.md; `pybridge report DIR`)")
    p.add_argument("--trace-steps", type=int, default=None, metavar="N",
                   help="with --trace: each rank's trace keeps the latest N steps' events (default 2000; "
                        "0: every step); the metrics count every step")
    p.add_argument("--trace-torch", action="store_true",
                   help="with --trace: also libtorch's operations on every thread of each rank (torch.profiler; "
                        "a Go or C++ program's forward and backward), for short runs")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="a Prometheus endpoint per rank at PORT + its local rank, on the address the job "
                        "talks on (loopback on one node; --metrics-addr to choose)")
    p.add_argument("--metrics-addr", default=None, metavar="ADDR",
                   help="the address the metrics endpoints listen on (default: as the job's stores)")
    p.add_argument("--otel", action="store_true",
                   help="export each rank's metrics through OpenTelemetry (OTLP/HTTP to "
                        "OTEL_EXPORTER_OTLP_ENDPOINT; docs/observability.md)")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("-m", "--module", action="store_true", help="TARGET is a Python module")
    p.add_argument("--no-python", action="store_true",
                   help="run TARGET as an executable even if it ends in .py")
    p.add_argument("target", help="a .py script, a module (-m) or an executable")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for TARGET")
    for action in p._actions:  # torchrun's rule: PET_<OPTION> is the option's default
        given = os.environ.get(f"PET_{action.dest.upper()}") if action.dest in PET_OPTIONS else None
        if given is not None:
            action.default = given if action.nargs != 0 else given.lower() in ("1", "true", "yes")
    return p


# The options torchrun also reads from PET_* variables (Kubernetes' PyTorchJob sets them).
PET_OPTIONS = {"nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "master_addr", "master_port",
               "rdzv_id", "rdzv_backend", "rdzv_conf", "standalone", "max_restarts", "monitor_interval", "log_dir",
               "no_python", "module"}


def _from_slurm(opts: argparse.Namespace) -> None:
    """Under srun (one launcher per node), the node count, node rank and rendezvous that
    the flags (and PET_* variables) leave unsaid; a warning in an allocation without srun."""
    job = jobenv.launcher_job()
    if job.warning:
        print(f"{PROG}: warning: {job.warning}", file=sys.stderr, flush=True)
    taken = []
    if opts.nnodes is None and job.nnodes is not None:
        opts.nnodes = str(job.nnodes)
        taken.append(f"--nnodes {job.nnodes} ({job.sources['nnodes']})")
    opts.nnodes = opts.nnodes or "1"
    if job.nnodes is None or _max_nodes(opts) == 1:
        return
    if opts.node_rank is None:
        opts.node_rank = job.node_rank
        taken.append(f"--node-rank {job.node_rank} (SLURM_NODEID)")
    if _endpoint(opts) is None and job.endpoint is not None and not _etcd(opts):
        opts.rdzv_endpoint = "%s:%d" % job.endpoint
        taken.append(f"--rdzv-endpoint {opts.rdzv_endpoint} ({job.sources['endpoint']})")
    if taken:
        print(f"{PROG}: from srun: {', '.join(taken)}", file=sys.stderr, flush=True)


def _gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken CUDA setup means: no GPUs
        return 0


def _nproc(value: str, gpus: int) -> int:
    value = value or os.environ.get("PYBRIDGE_NPROC") or "auto"
    if value == "auto":
        return gpus or DEFAULT_CPU_NPROC
    if value == "gpu":
        if not gpus:
            raise SystemExit(f"{PROG}: --nproc-per-node gpu, but no GPU is available")
        return gpus
    try:
        n = int(value)
    except ValueError:
        raise SystemExit(f"{PROG}: --nproc-per-node must be an integer, 'gpu' or 'auto', "
                         f"got {value!r}") from None
    if n < 1:
        raise SystemExit(f"{PROG}: --nproc-per-node must be at least 1, got {n}")
    return n


def _etcd(opts: argparse.Namespace) -> bool:
    """--rdzv-backend etcd (or etcd-v2, torchrun's other name)."""
    return opts.rdzv_backend in ("etcd", "etcd-v2")


def etcd_settings(opts: argparse.Namespace) -> str:
    """--rdzv-backend etcd: check the members and settings, and hand them to the workers (and
    this launcher's own rendezvous) as PYBRIDGE_RDZV_* and PYBRIDGE_ETCD_*, which init reads."""
    from ..base import etcd_store
    if opts.master_addr or opts.master_port:
        raise SystemExit(f"{PROG}: --rdzv-backend etcd takes the members in --rdzv-endpoint, "
                         "not --master-addr/--master-port")
    try:
        conf = etcd_store.conf(opts.rdzv_conf)
        if "password" in conf:
            raise InvalidArgument(f"--rdzv-conf password=: put the password in {etcd_store.CONF_ENV['password']} "
                                  "(a command line is readable by every user of the machine)")
        conf = {k: os.path.abspath(v) if k in ("cacert", "cert", "key") else v for k, v in conf.items()}
        etcd_store.settings(opts.rdzv_endpoint or "", conf)  # the checks, with the environment's password
    except InvalidArgument as exc:
        raise SystemExit(f"{PROG}: --rdzv-endpoint/--rdzv-conf: {exc}") from None
    job = opts.rdzv_id or jobenv_id()
    if job is None:
        if _max_nodes(opts) > 1:
            raise SystemExit(f"{PROG}: --rdzv-backend etcd on several nodes needs --rdzv-id, the same on every "
                             "node and another for every job (it names the job in etcd)")
        job = f"pybridge-{secrets.token_hex(8)}"
    os.environ.update({etcd_store.ENV_BACKEND: "etcd", etcd_store.ENV_ENDPOINT: opts.rdzv_endpoint,
                       etcd_store.ENV_ID: job})
    os.environ.update({etcd_store.CONF_ENV[k]: v for k, v in conf.items()})
    return job


def jobenv_id() -> Optional[str]:
    """The job's id from SLURM (the same on every node of a step), or None."""
    from ..base import etcd_store
    try:
        job: Optional[str] = etcd_store.job_id(None, {k: v for k, v in os.environ.items() if k.startswith("SLURM_")})
        return job
    except InvalidArgument:
        return None


def _endpoint(opts: argparse.Namespace) -> Optional[tuple[str, int]]:
    """HOST:PORT from --rdzv-endpoint or --master-addr/--master-port, or None (also with etcd,
    where no node hosts the rendezvous)."""
    if _etcd(opts):
        return None
    if opts.rdzv_endpoint:
        if opts.master_addr or opts.master_port:
            raise SystemExit(f"{PROG}: give --rdzv-endpoint or --master-addr/--master-port, not both")
        host, sep, port = opts.rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise SystemExit(f"{PROG}: --rdzv-endpoint must be HOST:PORT, got {opts.rdzv_endpoint!r}")
        return host, int(port)
    if opts.master_addr or opts.master_port:
        if not opts.master_port:
            raise SystemExit(f"{PROG}: --master-addr needs --master-port")
        return opts.master_addr or "127.0.0.1", opts.master_port
    return None


def _check_port_free(host: str, port: int) -> None:
    """Refuse a rendezvous port that another program holds on this machine, before torchrun
    connects to that program and waits for ever (c10d) or fails seconds later (static)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            return  # not an address of this machine: another node hosts the rendezvous
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's server
        try:
            probe.bind(("", port))
        except OSError as exc:
            raise SystemExit(f"{PROG}: rendezvous port {port} is already in use on this machine "
                             f"({exc.strerror or exc}): another job or program holds it; choose "
                             "another --master-port / --rdzv-endpoint port (a single-node job "
                             "without one gets a free port)") from None


def _max_nodes(opts: argparse.Namespace) -> int:
    """The most nodes the job may have: --nnodes N, or MAX of --nnodes MIN:MAX."""
    return int(str(opts.nnodes).split(":")[-1])


def torchrun_args(opts: argparse.Namespace, log_dir: str, gpus: Callable[[], int]) -> tuple[list[str], int]:
    """The torchrun argument list equivalent to our options (worker command included), and the
    number of processes on this node. gpus: a function returning the number of GPUs (it imports
    torch, so it is called after the cheap checks)."""
    max_nodes = _max_nodes(opts)
    endpoint = _endpoint(opts)
    args = ["--nnodes", str(opts.nnodes),
            "--max-restarts", str(opts.max_restarts),
            "--monitor-interval", str(opts.monitor_interval),
            "--shutdown-timeout", str(opts.shutdown_timeout),
            "--log-dir", log_dir, "--tee", "3", "--no-python"]
    if _etcd(opts) and max_nodes > 1:
        # The launchers meet in etcd too: torch's dynamic rendezvous over the sealed store
        # there (launch/rdzv.py), so that no node hosts it. Its state is a pickle: sealed.
        if _secret.job_secret() is None:
            raise SystemExit(f"{PROG}: --rdzv-backend etcd on several nodes needs the job secret: set {_secret.ENV} "
                             f"(or {_secret.ENV_FILE}) to the same value on every node (docs/launcher.md)")
        args += ["--rdzv-backend", "pybridge-etcd", "--rdzv-endpoint", opts.rdzv_endpoint,
                 "--rdzv-id", _secret.run_id(_secret.job_secret(), os.environ["PYBRIDGE_RDZV_ID"] + "-launch")]
    elif opts.standalone or (endpoint is None and max_nodes == 1):
        if opts.node_rank not in (None, 0):
            raise SystemExit(f"{PROG}: --node-rank {opts.node_rank} needs a multi-node job "
                             "(--nnodes and --rdzv-endpoint)")
        # torchrun's --standalone hosts its store on every interface: ours listens on
        # loopback only, and so does rank 0's store (--local-addr is the workers' MASTER_ADDR).
        args += ["--rdzv-backend", "pybridge-c10d", "--rdzv-endpoint", "127.0.0.1:0",
                 "--rdzv-id", f"pybridge-{secrets.token_hex(16)}", "--local-addr", "127.0.0.1"]
    elif endpoint is None:
        raise SystemExit(f"{PROG}: a multi-node job (--nnodes {opts.nnodes}) needs "
                         "--rdzv-endpoint HOST:PORT (or --master-addr/--master-port)")
    elif opts.node_rank is not None:
        if ":" in str(opts.nnodes):
            raise SystemExit(f"{PROG}: --node-rank needs a fixed --nnodes, not a range")
        if not 0 <= opts.node_rank < max_nodes:
            raise SystemExit(f"{PROG}: --node-rank {opts.node_rank} is not in 0..{max_nodes - 1}")
        if opts.node_rank == 0:
            _check_port_free(*endpoint)
        args += ["--rdzv-backend", "pybridge-static", "--rdzv-endpoint", f"{endpoint[0]}:{endpoint[1]}",
                 "--rdzv-conf", f"rank={opts.node_rank}", *_local_addr(endpoint[0])]
    else:
        if max_nodes == 1:  # this launcher hosts the rendezvous
            _check_port_free(*endpoint)
        key = _secret.job_secret()
        if key is None:
            # torch's c10d rendezvous unpickles what its store holds: without a secret any
            # process that reaches the port could make this launcher run its code.
            raise SystemExit(f"{PROG}: a dynamic multi-node rendezvous (no --node-rank) needs the job secret: "
                             f"set {_secret.ENV} (or {_secret.ENV_FILE}) to the same value on every node, or "
                             "give --node-rank (docs/launcher.md, 'The job secret')")
        args += ["--rdzv-backend", "pybridge-c10d", "--rdzv-endpoint", f"{endpoint[0]}:{endpoint[1]}",
                 "--rdzv-id", _secret.run_id(key, opts.rdzv_id or "pybridge"), *_local_addr(endpoint[0])]
    command = worker_command(opts)  # checks the target before gpus() imports torch
    nproc = _nproc(opts.nproc_per_node, gpus())
    args = ["--nproc-per-node", str(nproc), *args, *command]
    return args, nproc


def _local_addr(host: str) -> list[str]:
    """--local-addr: this node's address towards the rendezvous host, which the workers get
    as MASTER_ADDR where rank 0 hosts their store (and binds it), instead of the hostname."""
    try:
        return ["--local-addr", netif.local_address_towards(host)]
    except OSError:
        return []


def job_secret(multi_node: bool) -> None:
    """The job secret for this launcher's workers, in the environment they inherit: the one
    given (PYBRIDGE_SECRET or PYBRIDGE_SECRET_FILE), else a new one for a single-node job.
    A multi-node job without one is told what it risks (the launchers of the nodes cannot
    agree on a generated one)."""
    try:
        key = _secret.job_secret()
    except Exception as exc:  # noqa: BLE001 - InvalidArgument: a short secret, an unreadable file
        raise SystemExit(f"{PROG}: {exc}") from None
    if key is None and not multi_node:
        os.environ[_secret.ENV] = _secret.generate()
    elif key is None:
        print(f"{PROG}: warning: no job secret ({_secret.ENV} or {_secret.ENV_FILE}): any process that reaches "
              "the rendezvous port can read and change this job's store; give every node the same secret "
              "(docs/launcher.md, 'The job secret')", file=sys.stderr, flush=True)


def worker_command(opts: argparse.Namespace) -> list[str]:
    """The command each worker runs: the shim (per-rank device), then TARGET and its args."""
    if opts.module:
        mode = "module"
    elif opts.target.endswith(".py") and not opts.no_python:
        mode = "script"
    else:
        mode = "exec"
    target = opts.target
    if mode == "script":
        if not os.path.isfile(target):
            raise SystemExit(f"{PROG}: no such script: {target}")
    elif mode == "exec":
        found = shutil.which(target) if os.sep not in target else (target if os.access(target, os.X_OK) else None)
        if not found:
            raise SystemExit(f"{PROG}: {target}: not found or not executable")
    return [sys.executable, "-c", _WORKER_SHIM, mode, target, *opts.args]


def elastic_main(opts: argparse.Namespace) -> int:
    """--elastic: this launcher supervises its workers itself (launch_elastic.py)."""
    if ":" in str(opts.nnodes):
        raise SystemExit(f"{PROG}: --elastic takes a fixed --nnodes (the first world); the world then "
                         "shrinks and grows between --min-world and --max-world")
    nnodes = int(opts.nnodes)
    if opts.min_world < 1 or (opts.max_world is not None and opts.max_world < opts.min_world):
        raise SystemExit(f"{PROG}: --min-world must be >= 1 and <= --max-world")
    if opts.replace < 0:
        raise SystemExit(f"{PROG}: --replace must be >= 0")
    # torch.distributed only now: a refused command line answers without importing torch
    from .elastic import Supervisor
    from ..runtime import elastic_store
    node_rank: Optional[int] = opts.node_rank or 0
    endpoint: Optional[tuple[str, int]] = None
    where: Union[elastic_store.TcpStore, elastic_store.EtcdStore]
    if _etcd(opts):  # no launcher hosts anything; without --node-rank, nodes are numbered in etcd
        node_rank = opts.node_rank if nnodes > 1 else 0
        where = elastic_store.from_environment()
    else:
        endpoint = _endpoint(opts)
        if nnodes > 1 and (endpoint is None or opts.node_rank is None):
            raise SystemExit(f"{PROG}: an elastic multi-node job needs --rdzv-endpoint HOST:PORT (node 0's "
                             "address, where its launcher hosts the store) and --node-rank, or --rdzv-backend etcd")
        if endpoint is None:
            endpoint = ("127.0.0.1", netif.free_port())
        elif node_rank == 0:
            _check_port_free(*endpoint)
        where = elastic_store.TcpStore(*endpoint)
    command = worker_command(opts)
    gpus = _gpu_count()
    nproc = _nproc(opts.nproc_per_node, gpus)
    _worker_settings(opts, gpus, nproc)
    _observe_settings(opts)
    try:
        sup = Supervisor(command, nproc=nproc, node_rank=node_rank, nnodes=nnodes, where=where,
                         min_world=opts.min_world, max_world=opts.max_world, replace=opts.replace,
                         monitor_interval=opts.monitor_interval, shutdown_timeout=opts.shutdown_timeout,
                         hosting=node_rank == 0 and not _etcd(opts))
    except OSError as exc:
        at = f"{endpoint[0]}:{endpoint[1]}" if endpoint else "?"
        raise SystemExit(f"{PROG}: cannot host the elastic store at {at}: "
                         f"{exc.strerror or exc} (--rdzv-endpoint must name an address of node 0)") from None
    except PyBridgeError as exc:  # etcd unreachable, or the id of a job that already finished
        raise SystemExit(f"{PROG}: elastic: {exc}") from None
    try:
        status: int = sup.run()
        if nnodes == 1 and isinstance(where, elastic_store.EtcdStore):
            where.remove()  # the job's keys: nobody else will read them (on several nodes, docs/elastic.md)
        return status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
        sup.stop()
        return 130
    finally:
        _merge_trace(opts)


def _tail(path: str, lines: int = STDERR_TAIL_LINES) -> Optional[str]:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _stderr_log(log_dir: str, local_rank: int) -> Optional[str]:
    """The newest attempt's stderr log of a local rank under torchrun's log folder."""
    found = glob.glob(os.path.join(log_dir, "*", "attempt_*", str(local_rank), "stderr.log"))
    if not found:
        return None
    return max(found, key=lambda p: int(p.split(os.sep)[-3].split("_")[-1]))


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "PB_ERR_COMM", "CommError",
              "remote worker crashing")


def _lost_a_peer(stderr_tail: Optional[str]) -> bool:
    return stderr_tail is not None and any(words in stderr_tail for words in _PEER_LOST)


def _stopped_by_us(failure: Any) -> bool:
    stopped: bool = failure.exitcode == -signal.SIGTERM
    return stopped


def format_failure(exc: Any, log_dir: str, node_rank: Optional[int],
                   exit_time: Optional[Callable[[Optional[int]], Optional[float]]] = None) -> tuple[str, int]:
    """A report of a torchrun ChildFailedError, and the exit status to leave with.

    The first rank that failed on its own is reported with its stderr tail; ranks that torchrun
    stopped afterwards (SIGTERM) are listed in one line. exit_time(pid): when that worker
    exited (an ExitClock's), or None where unknown.
    """
    failures = exc.failures
    own = [r for r, f in failures.items() if not _stopped_by_us(f)] or list(failures)
    if all(failures[r].exitcode == REQUEUE for r in own):  # the others were stopped while they exited
        saved = sorted(r for r, f in failures.items() if f.exitcode == REQUEUE)
        return (f"{PROG}: preempted: rank(s) {', '.join(map(str, saved))} saved and exited with {REQUEUE} "
                f"(requeue); run the job again to resume (SLURM: `scontrol requeue $SLURM_JOB_ID`)", REQUEUE)
    logs = {r: _stderr_log(log_dir, failures[r].local_rank) for r in own}
    tails = {r: _tail(path) if path else None for r, path in logs.items()}
    # A peer's death makes the survivors fail too, often in the same monitoring pass, where
    # torchrun's whole-second timestamps are equal: the exit times of the ExitClock order
    # them (when known for every rank), ranks that report a lost peer go last, and of ranks
    # that exited at the same time, one killed by a signal goes first (nothing made it exit).
    times = {r: exit_time(getattr(failures[r], "pid", None)) if exit_time else None for r in own}
    precise = all(t is not None for t in times.values())
    own.sort(key=lambda r: (_lost_a_peer(tails[r]), times[r] if precise else failures[r].timestamp,
                            failures[r].exitcode >= 0, r))
    stopped = sorted(r for r in failures if r not in own)
    out, status = [], 1
    for i, rank in enumerate(own):
        f = failures[rank]
        where = f"local rank {f.local_rank}" + (f", node {node_rank}" if node_rank is not None else "")
        how = f"failed with exit code {f.exitcode}" if f.exitcode >= 0 else signal_exit(f.exitcode)
        when = f" ({cast(float, times[rank]) - cast(float, times[own[0]]):.3f} s after rank {own[0]})" \
            if precise and i else ""
        out.append(f"{PROG}: rank {rank} ({where}) {how}{when}")
        if i == 0:
            status = f.exitcode if 0 < f.exitcode < 256 else (128 - f.exitcode if f.exitcode < 0 else 1)
        msg = (f.error_file_data or {}).get("message")
        if isinstance(msg, dict):
            msg = msg.get("message")
        if msg and msg != "<NONE>":
            out.append(f"--- rank {rank} error:\n{msg}")
        path, tail = logs[rank], tails[rank]
        if tail:
            out.append(f"--- last lines of rank {rank}'s stderr ({path}):\n{tail}")
        elif path:
            out.append(f"--- rank {rank} wrote nothing to stderr")
    if stopped:
        out.append(f"{PROG}: stopped the other rank(s) on this node: {', '.join(map(str, stopped))}")
    return "\n".join(out), min(max(status, 1), 255)


def _kept(log_dir: str) -> bool:
    """Keep our temporary log folder after a failure, and say so, if any file in it holds
    something; ranks that wrote nothing leave only empty logs, not worth keeping."""
    for path in glob.glob(os.path.join(log_dir, "**"), recursive=True):
        try:
            if os.path.isfile(path) and os.path.getsize(path) > 0:
                print(f"{PROG}: logs kept in {log_dir}", file=sys.stderr, flush=True)
                return True
        except OSError:
            pass
    return False


def _worker_settings(opts: argparse.Namespace, gpus: int, nproc: int) -> None:
    """What the workers inherit from this launcher, with torchrun's agent or the elastic one:
    the GPU count and isolation the worker shim picks its device by, the CPUs it binds
    each process to, the network interface of a multi-node job, and this launcher's pid
    (the shim ends the worker when the launcher dies)."""
    os.environ["PYBRIDGE_NUM_GPUS"] = str(gpus)
    os.environ["PYBRIDGE_ISOLATE_GPUS"] = "1" if opts.isolate_gpus else "0"
    os.environ["PYBRIDGE_LAUNCHER_PID"] = str(os.getpid())  # the shim's parent: it dies with us
    _bind_cpus(opts, nproc)
    _choose_interface(opts)


def _observe_settings(opts: argparse.Namespace) -> None:
    """--trace, --metrics-port and --otel as the variables each worker's observe/ reads at init."""
    if opts.otel:
        os.environ["PYBRIDGE_OTEL"] = "1"
    if opts.trace:
        path = os.path.abspath(opts.trace)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise SystemExit(f"{PROG}: --trace {opts.trace}: {exc.strerror or exc}") from None
        os.environ["PYBRIDGE_TRACE"] = path
        if opts.trace_torch:
            os.environ["PYBRIDGE_TRACE_TORCH"] = "1"
        if opts.trace_steps is not None:
            if opts.trace_steps < 0:
                raise SystemExit(f"{PROG}: --trace-steps must be >= 0 (0: every step), got {opts.trace_steps}")
            os.environ["PYBRIDGE_TRACE_STEPS"] = str(opts.trace_steps)
    elif opts.trace_torch or opts.trace_steps is not None:
        raise SystemExit(f"{PROG}: --trace-torch and --trace-steps need --trace DIR")
    if opts.metrics_port is not None:
        if not 0 < opts.metrics_port < 65536:
            raise SystemExit(f"{PROG}: --metrics-port must be 1..65535, got {opts.metrics_port}")
        os.environ["PYBRIDGE_METRICS_PORT"] = str(opts.metrics_port)
        addr = opts.metrics_addr
        endpoint = _towards(opts)
        if addr is None and endpoint is not None and _max_nodes(opts) > 1:
            try:  # the address this node talks to the rendezvous host on, as _local_addr gives the stores
                addr = netif.local_address_towards(endpoint[0])
            except OSError:
                addr = None
        os.environ["PYBRIDGE_METRICS_ADDR"] = addr or "127.0.0.1"
        print(f"{PROG}: metrics of local rank L at http://{os.environ['PYBRIDGE_METRICS_ADDR']}:"
              f"{opts.metrics_port}+L/metrics", file=sys.stderr, flush=True)


def _merge_trace(opts: argparse.Namespace) -> None:
    """Merge the rank files this node can see into DIR/trace.json and say where it is. On
    several nodes each launcher merges the files in its DIR (all ranks' on shared storage)."""
    if not opts.trace:
        return
    from ..observe import merge
    try:
        summary = merge.merge(os.path.abspath(opts.trace))
    except InvalidArgument as exc:
        print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
        return
    print(f"{PROG}: {merge.describe(summary)}; `pybridge report {opts.trace}` reads it", file=sys.stderr,
          flush=True)


def _bind_cpus(opts: argparse.Namespace, nproc: int) -> None:
    """Split this launcher's CPUs among its nproc processes (cpubind.py); the shim binds each."""
    cpus = cpubind.allowed()
    topo = cpubind.topology(cpus)
    mode = opts.cpu_bind or os.environ.get("PYBRIDGE_CPU_BIND") or cpubind.default_mode(nproc, cpus, topo)
    if mode not in cpubind.MODES:
        raise SystemExit(f"{PROG}: PYBRIDGE_CPU_BIND must be one of {', '.join(cpubind.MODES)}, got {mode!r}")
    cpu_plan = cpubind.plan(mode, nproc, cpus, topo)
    os.environ.pop("PYBRIDGE_CPU_MAP", None)  # not an outer launcher's
    if cpu_plan is None:
        return
    os.environ["PYBRIDGE_CPU_MAP"] = cpubind.encode(cpu_plan)
    os.environ["PYBRIDGE_CPU_THREADS"] = "0" if os.environ.get("OMP_NUM_THREADS") else "1"  # the user's wins
    print(f"{PROG}: {cpubind.describe(mode, cpu_plan)}", file=sys.stderr, flush=True)


def _towards(opts: argparse.Namespace) -> Optional[tuple[str, int]]:
    """(host, port) the job's traffic is told apart by: node 0's rendezvous, or with etcd
    (which no node hosts) its first member."""
    if _etcd(opts):
        from ..base import etcd_store
        first: tuple[str, int] = etcd_store.parse_endpoints(opts.rdzv_endpoint)[1][0]
        return first
    return _endpoint(opts)


def _prefix_node(opts: argparse.Namespace) -> Union[int, str, None]:
    """The node in the ranks' line prefix: None on one node, else the node rank, or this
    host's name when a dynamic rendezvous gives the node its rank later."""
    if _max_nodes(opts) == 1:
        return None
    return opts.node_rank if opts.node_rank is not None else socket.gethostname()


def _choose_interface(opts: argparse.Namespace) -> None:
    """Multi-node: name the interface that reaches the rendezvous host for gloo and NCCL
    (pybridge/base/netif.py says why), unless the user named one."""
    endpoint = _towards(opts)
    if endpoint is None or _max_nodes(opts) == 1:
        return
    if "GLOO_SOCKET_IFNAME" in os.environ and "NCCL_SOCKET_IFNAME" in os.environ:
        return
    name, address = netif.interface_towards(endpoint[0])
    if name is None:
        print(f"{PROG}: could not tell which interface reaches {endpoint[0]}; set GLOO_SOCKET_IFNAME "
              "(and NCCL_SOCKET_IFNAME) if the ranks cannot connect", file=sys.stderr, flush=True)
        return
    os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", name)
    print(f"{PROG}: node {opts.node_rank if opts.node_rank is not None else '?'} talks on {name} "
          f"({address}) towards {endpoint[0]} (GLOO_SOCKET_IFNAME={os.environ['GLOO_SOCKET_IFNAME']})",
          file=sys.stderr, flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """pybridge-launch: start this node's workers (one per GPU, or --nproc-per-node) running
    a Python script, a module (-m) or any program (--no-python), restart them, and say which
    rank failed and why. `argv`: the command line without the program name (default
    sys.argv[1:]). Returns the exit status (0 when every rank finished). docs/launcher.md.

    Example::

        >>> from pybridge.launch import main
        >>> main(["--nproc-per-node", "2", "train.py", "--epochs", "3"])  # doctest: +SKIP
        0
    """
    forward_signals()  # first: a scheduler's warning may come while the launcher starts
    opts = _parser().parse_args(argv)
    try:
        _from_slurm(opts)
    except InvalidArgument as exc:
        raise SystemExit(f"{PROG}: {exc}") from None
    if opts.max_restarts < 0:
        raise SystemExit(f"{PROG}: --max-restarts must be >= 0")
    job_secret(_max_nodes(opts) > 1)
    if _etcd(opts):
        etcd_settings(opts)
    elif opts.rdzv_conf:
        raise SystemExit(f"{PROG}: --rdzv-conf is for --rdzv-backend etcd")
    if opts.elastic:
        return elastic_main(opts)
    own_log_dir = opts.log_dir is None
    log_dir = tempfile.mkdtemp(prefix="pybridge-launch-") if own_log_dir else opts.log_dir
    try:
        os.makedirs(log_dir, exist_ok=True)
        targs, nproc = torchrun_args(opts, log_dir, _gpu_count)
    except BaseException:
        if own_log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)
        raise
    gpus = _gpu_count()

    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from . import lines, rdzv
    rdzv.register()
    lines.install(prefix=not opts.no_prefix)

    _worker_settings(opts, gpus, nproc)
    _observe_settings(opts)
    if not opts.no_prefix:
        os.environ.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", lines.template(_prefix_node(opts)))
    # A rank's stdout is a log file, which C's stdio fills in 4 KiB blocks: libpybridge
    # sets a C or C++ rank's stdout line-buffered when it sees this, as on a terminal.
    os.environ.setdefault("PYBRIDGE_LINE_BUFFERED", "1")
    # The c10d rendezvous otherwise hands the workers of every restart the same store: keys of
    # the failed attempt (gloo peer addresses) are still there and a restarted rank can read a
    # dead peer's address before the live one overwrites it. Opting out gives each attempt a
    # fresh store (rank 0 of the attempt hosts it on a new MASTER_PORT).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if nproc > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun does, without its banner
    # torchrun's parser takes abbreviations: a target argument such as --log would be
    # read as an ambiguous prefix of --log-dir. Ours has already split its own options off.
    parser = torchrun.get_args_parser()
    parser.allow_abbrev = False
    args = parser.parse_args(targs)
    clock = ExitClock().start()
    try:
        torchrun.run(args)
    except ChildFailedError as exc:
        text, status = format_failure(exc, log_dir, opts.node_rank, clock.exit_time)
        sys.stdout.flush()
        print(text, file=sys.stderr, flush=True)
        own_log_dir = own_log_dir and not _kept(log_dir)
        return status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
        own_log_dir = own_log_dir and not _kept(log_dir)
        return 130
    except Exception as exc:  # noqa: BLE001 - rendezvous and setup failures: one clear line
        print(f"{PROG}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        clock.stop()
        if own_log_dir:  # a success, or nothing worth keeping
            shutil.rmtree(log_dir, ignore_errors=True)
        _merge_trace(opts)
    print(f"{PROG}: all {nproc} rank(s) on this node finished successfully", file=sys.stderr, flush=True)
    return 0
