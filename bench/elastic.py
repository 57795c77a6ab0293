"""Elastic training (pybridge/runtime/elastic.py) beside restarting the world, in one run.

    python bench/elastic.py [--quick] [--ballast-mb MB]

1. Commit cost: commit() and restore() of a model with its SGD momentum beside one training
   step of the same model, for three model sizes, in one process. A commit every N steps
   costs commit / (N x step) of the training time; the table gives the N for 1%.
2. Recovery, 4 CPU workers on loopback (tests/elastic_train.py under pybridge-launch
   --elastic, a commit every 5 steps, a state of --ballast-mb MB): rank 2 is SIGKILLed in
   step 37. Timed from its last moment: failure seen by the survivors, old world torn
   down, next world agreed, first step done on it (new group, re-bind, rollback and the
   state from the new rank 0 included); then a process started by hand joins at the commit
   of step 60: from that commit to its first step done (the state received over the network).
   Beside it, restart-the-world: pybridge-launch --max-restarts 1 (torchrun's agent) with a
   disk checkpoint every 5 steps (tests/resume_train.py) and rank 1 dying in step 37: from its
   last step to the first step done after every worker restarted and loaded the checkpoint.
   Work lost is the same in both (the steps since the last commit or checkpoint); the time
   to go on is not.
3. The same elastic run with the job's store in etcd (3 members on loopback) beside the
   TCPStore of node 0's launcher: recovery from the worker's death, the median step and
   the median commit that reads the store (one that may admit joiners).
4. Node 0 lost whole (as root, on the simulated cluster: 3 nodes of one worker, an etcd
   member in each): its link taken down, then its launcher, worker and etcd member killed;
   from then to the first step of the survivors' world, with --timeout and
   PYBRIDGE_ELASTIC_LOST_AFTER set to what the table says (a dead node is told only by its
   silence). With the TCPStore node 0's death ends the job: nothing to time.
Writes bench/results/elastic.json.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import progress, save, table  # noqa: E402

from pybridge.runtime.elastic import State  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from elastic_runs import finish, launch, read_logs, wait_for  # noqa: E402
from ranks import free_port  # noqa: E402
from resume_train import write_dataset  # noqa: E402

KILL_AT, COMMIT_EVERY, JOIN_AT = 37, 5, 60

SIZES = {"1M": (1024, 1), "17M": (2048, 4), "67M": (4096, 4)}  # width, layers of width x width


def timed(fn, repeat):
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def case(width, depth, repeat):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = torch.randn(32, width), torch.randn(32, width)

    def step():
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    step()  # momentum buffers exist from here on
    state = State(model=model, optimizer=opt, step=0)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "step_ms": timed(step, repeat) * 1e3, "commit_ms": timed(state.commit, repeat) * 1e3,
            "restore_ms": timed(state.restore, repeat) * 1e3, "committed_mb": state.committed_bytes / 1e6}


def survivors_recovery(logs, since):
    """Per survivor of world 1 (a reset into world 2): seconds from `since` (the loss) until
    it saw the failure, tore the old world down, agreed on world 2 and finished a step on it."""
    rows = []
    for evs in logs.values():
        reset = [e for e in evs if e["ev"] == "reset" and e["gen"] == 2]
        if reset:
            r = reset[0]
            first = min(e["t"] for e in evs if e["ev"] == "step" and e["gen"] == 2)
            rows.append({"seen": r["seen"] - since, "torn_down": r["left"] - since,
                         "agreed": r["agreed"] - since, "first_step": first - since})
    return rows


def elastic_recovery(data, folder, ballast_mb, etcd=None):
    """The elastic run: kill, survivors' recovery, then a joiner. Times in seconds. etcd:
    the members' endpoints (the job's store there), else node 0's TCPStore."""
    log, port = os.path.join(folder, "elastic" + ("-etcd" if etcd else "")), free_port()
    deadline = time.monotonic() + 300
    common = ["--commit-every", str(COMMIT_EVERY), "--ballast-mb", str(ballast_mb), "--timeout", "30"]
    procs = [launch(port, log, data, "--die-at", str(KILL_AT), "--die-rank", "2", "--admit-from", str(JOIN_AT),
                    "--await-joiner-at", str(JOIN_AT), *common, etcd=etcd)]
    wait_for(log, lambda e: e["ev"] == "reset" and e["gen"] == 2, deadline)
    procs.append(launch(port, log, data, "--admit-from", str(JOIN_AT), *common, nproc=1, node=1, etcd=etcd))
    outs = finish(procs, deadline)
    if any(rc for rc, _ in outs):
        raise SystemExit("elastic run failed:\n" + "\n".join(out[-3000:] for _, out in outs))
    logs = read_logs(log)
    died = next(e for evs in logs.values() for e in evs if e["ev"] == "die")
    rows = survivors_recovery(logs, died["t"])
    worst = {k: max(r[k] for r in rows) for k in rows[0]}
    admitted = min(e["seen"] for evs in logs.values() for e in evs if e["ev"] == "reset" and e["gen"] == 3)
    joiner = next(evs for who, evs in logs.items() if who.startswith("node1-"))
    joined = min(e["t"] for e in joiner if e["ev"] == "step") - admitted
    step_s = statistics.median(b["t"] - a["t"] for evs in logs.values()
                               for a, b in zip(evs, evs[1:]) if a["ev"] == b["ev"] == "step" and a["gen"] == b["gen"])
    commit_ms = statistics.median(e["ms"] for evs in logs.values() for e in evs
                                  if e["ev"] == "commit" and "ms" in e and e["step"] > JOIN_AT)
    lost_steps = KILL_AT - 1 - (KILL_AT - 1) // COMMIT_EVERY * COMMIT_EVERY  # done since the commit
    return {**worst, "joiner_first_step": joined, "step_s": step_s, "commit_ms": commit_ms, "lost_steps": lost_steps,
            "survivors": len(rows)}


def commit_read(etcd_endpoints, repeat=200):
    """The store read of a commit that may admit joiners (rank 0's Membership.joiners_waiting),
    median ms, through node 0's TCPStore and through etcd, sealed with a job secret as a job's."""
    import datetime
    import torch.distributed as dist
    from pybridge.base import etcd_store
    from pybridge.runtime import elastic_store
    from pybridge.runtime.membership import Membership, World
    os.environ.setdefault("PYBRIDGE_SECRET", "bench-elastic-secret-0123456789abcdef")
    port = free_port()
    host = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    out = {}
    for name, where in (("tcp", elastic_store.TcpStore("127.0.0.1", port)),
                        ("etcd", elastic_store.EtcdStore(etcd_store.settings(etcd_endpoints), f"bench-{port}"))):
        m = Membership(where, member_id=f"bench-{name}", lost_after=60, timeout=30)
        world = World(1, [m.me], m.id)
        m.joiners_waiting(world)  # connections made
        out[name] = timed(lambda: m.joiners_waiting(world), repeat) * 1e3  # noqa: B023
        m.close()
    del host
    return out


NODE_TIMEOUT, NODE_LOST_AFTER = 5, 3  # seconds: --timeout and PYBRIDGE_ELASTIC_LOST_AFTER for a node's loss


def node0_recovery(folder):
    """Node 0 lost whole on the simulated cluster, the job's store in etcd: seconds from the
    loss to the first step of the survivors' world (the slowest survivor); None without root."""
    from pybridge.testing import cluster
    from pybridge.testing import etcd as etcd_testing
    ok, why = cluster.available()
    if not ok or etcd_testing.binary()[0] is None:
        progress(f"elastic: node 0's loss not measured: {why or etcd_testing.binary()[1]}")
        return None
    data = write_dataset(folder, 400)
    log = tempfile.mkdtemp(dir=folder) + "/node0"  # a run's own: wait_for must not find an earlier run's steps
    env = {"PYBRIDGE_ELASTIC_LOST_AFTER": str(NODE_LOST_AFTER)}
    with cluster.Cluster(3) as c, etcd_testing.EtcdCluster(nodes=c.nodes) as e:
        deadline = time.monotonic() + 300
        procs = [launch(0, log, data, "--timeout", str(NODE_TIMEOUT), "--commit-every", str(COMMIT_EVERY), nproc=1,
                        node=k, nnodes=3, etcd=e.endpoints, env=env, popen=c.nodes[k].popen) for k in range(3)]
        wait_for(log, lambda ev: ev["ev"] == "step" and ev["step"] >= KILL_AT, deadline)
        lost_at = time.time()
        c.nodes[0].unplug()
        c.nodes[0].kill()
        outs = finish(procs[1:], deadline)
    if any(rc for rc, _ in outs):
        raise SystemExit("node 0 run failed:\n" + "\n".join(out[-3000:] for _, out in outs))
    logs = read_logs(log)
    rows = survivors_recovery(logs, lost_at)
    worst = {k: max(r[k] for r in rows) for k in rows[0]}
    return {**worst, "survivors": len(rows), "timeout_s": NODE_TIMEOUT, "lost_after_s": NODE_LOST_AFTER, "each": rows}


def restart_the_world(data, folder):
    """torchrun's agent restarts every worker; they resume from the disk checkpoint."""
    log = os.path.join(folder, "restart")
    cmd = [sys.executable, "-m", "pybridge.launch", "--nproc-per-node", "4", "--max-restarts", "1",
           "--monitor-interval", "0.1", os.path.join(ROOT, "tests", "resume_train.py"), "--data", *data,
           "--ckpt", os.path.join(folder, "ckpt-{rank}"), "--steplog", log, "--epochs", "3",
           "--crash-at", str(KILL_AT), "--save-every", str(COMMIT_EVERY)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": ROOT})
    if run.returncode:
        raise SystemExit("restart-the-world run failed:\n" + (run.stdout + run.stderr)[-3000:])
    lines = [json.loads(x) for path in glob.glob(log + "-rank*.jsonl") for x in open(path)]
    last = max(x["t"] for x in lines if x["attempt"] == 0)
    first = min(x["t"] for x in lines if x["attempt"] == 1)
    resumed = min(x["step"] for x in lines if x["attempt"] == 1) - 1
    return {"first_step": first - last, "lost_steps": KILL_AT - 1 - resumed}


def recovery(ballast_mb):
    from pybridge.testing.etcd import EtcdCluster
    with tempfile.TemporaryDirectory(prefix="pybridge-bench-elastic-") as folder:
        data = write_dataset(folder, 400)
        progress("elastic: 4 workers, rank 2 killed in step 37, a joiner at step 60")
        el = elastic_recovery(data, folder, ballast_mb)
        progress("elastic over etcd (3 members): the same run")
        with EtcdCluster(3, pick_port=free_port) as members:
            ee = elastic_recovery(data, folder, ballast_mb, etcd=members.endpoints)
            progress("elastic: the store read of a commit, TCPStore and etcd")
            reads = commit_read(members.endpoints)
        progress("elastic: restart-the-world, rank 1 dies in step 37")
        rw = restart_the_world(data, folder)
        progress("elastic over etcd: node 0 lost whole on the simulated cluster")
        n0 = node0_recovery(folder)
    ms = lambda s: f"{s * 1e3:.0f}"  # noqa: E731
    print(table(["after the kill (ms)", "failure seen", "world torn down", "next world agreed",
                 "first step on it", "steps lost"],
                [["elastic, node 0's TCPStore (slowest of 3 survivors)", ms(el["seen"]), ms(el["torn_down"]),
                  ms(el["agreed"]), ms(el["first_step"]), str(el["lost_steps"])],
                 ["elastic, etcd (slowest of 3 survivors)", ms(ee["seen"]), ms(ee["torn_down"]), ms(ee["agreed"]),
                  ms(ee["first_step"]), str(ee["lost_steps"])],
                 ["restart the world (torchrun, disk checkpoint)", "-", "-", "-", ms(rw["first_step"]),
                  str(rw["lost_steps"])]]
                + ([[f"node 0 lost whole, etcd (--timeout {n0['timeout_s']} s, lost after {n0['lost_after_s']} s)",
                     ms(n0["seen"]), ms(n0["torn_down"]), ms(n0["agreed"]), ms(n0["first_step"]), "-"]]
                   if n0 else [])))
    print(f"joiner: {ms(el['joiner_first_step'])} ms (etcd: {ms(ee['joiner_first_step'])} ms) from the admitting "
          f"commit to its first step (state of {ballast_mb:g} MB received over the network); one step takes "
          f"{ms(el['step_s'])} ms (etcd: {ms(ee['step_s'])} ms); a commit that reads the store "
          f"{el['commit_ms']:.2f} ms (etcd: {ee['commit_ms']:.2f} ms, {ee['commit_ms'] / el['commit_ms'] - 1:+.0%}), "
          f"of which rank 0's read of the store {reads['tcp']:.3f} ms (etcd: {reads['etcd']:.3f} ms)")
    return {"elastic": el, "elastic_etcd": ee, "restart_the_world": rw, "node0_etcd": n0, "commit_read_ms": reads,
            "ballast_mb": ballast_mb}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the smallest model only, 3 repeats")
    ap.add_argument("--ballast-mb", type=float, default=64.0,
                    help="recovery: the size of the state the joiner receives (default 64 MB)")
    ap.add_argument("--no-recovery", action="store_true", help="the commit cost only")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sizes = {"1M": SIZES["1M"]} if args.quick else SIZES
    rows, results = [], {}
    for name, (width, depth) in sizes.items():
        progress(f"elastic: {name} parameters")
        r = results[name] = case(width, depth, 3 if args.quick else 7)
        every = r["commit_ms"] / (0.01 * r["step_ms"])
        rows.append([name, f"{r['committed_mb']:.0f} MB", f"{r['step_ms']:.1f}", f"{r['commit_ms']:.1f}",
                     f"{r['restore_ms']:.1f}", f"{r['commit_ms'] / r['step_ms']:.2f}", f"{every:.0f}"])
    print(table(["model", "commit size", "step ms (batch 32)", "commit ms", "restore ms",
                 "commit / step", "commit every N steps for 1%"], rows))
    out = {"models": results, "threads": 1}
    if not args.no_recovery:
        out["recovery"] = recovery(args.ballast_mb)
    save("elastic", out)


if __name__ == "__main__":
    main()
