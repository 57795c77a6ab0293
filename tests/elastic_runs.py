"""Running tests/elastic_train.py under pybridge-launch --elastic, reading its logs and
checking them: for tests/test_elastic_survive.py, tests/test_elastic_lost.py and
bench/elastic.py.

What check() asserts of a run:
  * the accepted history: the steps of each world up to the step the next world rolled
    back to; every step number from 1 to the end is in it once, run by a whole world;
  * every record of each epoch was used, exactly once apart from the wrap-around padding of
    the epoch's final pass (the static partition's DistributedSampler padding), whose size
    is computed here;
  * every replica ended with the same weights, equal to a reference computed here in one
    process: the same model and optimizer fed, step by step, the accepted history's
    batches (rank by rank, gradients averaged over the world of that step).
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import torch

import elastic_train
from pybridge.recordio import Loader, decode_fixed
from resume_train import FEATURES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The launchers of one job share its secret (a joiner's launcher is "node 1" of the job)
SECRET = "elastic-runs-test-secret-0123456789"


def launch(port, log, data, *extra, nproc=4, node=None, launcher=(), env=None, epochs=3, batch=4, etcd=None,
           nnodes=2, popen=subprocess.Popen):
    """pybridge-launch --elastic running tests/elastic_train.py (its output piped); node: start
    it as that node of an `nnodes`-node job (a launcher that joins the running job's store).
    Every launcher gets the same job secret, as the nodes of a real job would. etcd: the
    members' endpoints; the job then meets there (its id: `port`), not in a TCPStore at
    127.0.0.1:port. popen: how the launcher is started (a cluster node's popen)."""
    where = ["--nnodes", str(nnodes), "--node-rank", str(node)] if node is not None else []
    store = ["--rdzv-backend", "etcd", "--rdzv-endpoint", etcd, "--rdzv-id", f"elastic-{port}"] if etcd else \
        ["--rdzv-endpoint", f"127.0.0.1:{port}"]
    cmd = [sys.executable, "-m", "pybridge.launch", "--elastic", "--nproc-per-node", str(nproc),
           *store, *where, *launcher,
           os.path.join(ROOT, "tests", "elastic_train.py"), "--data", *data, "--log", log,
           "--epochs", str(epochs), "--batch", str(batch), *extra]
    return popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT, "PYBRIDGE_SECRET": SECRET, **(env or {})},
                            start_new_session=True)


def read_logs(log):
    out = {}
    for path in glob.glob(f"{log}-*.jsonl"):
        who = path[len(log) + 1:-len(".jsonl")]
        with open(path) as f:
            # a line without its newline is still being written (seen in CI: half a step event)
            out[who] = [json.loads(line) for line in f if line.endswith("\n") and line.strip()]
    return out


def wait_for(log, what, deadline):
    while time.monotonic() < deadline:
        for evs in read_logs(log).values():
            found = [e for e in evs if what(e)]
            if found:
                return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no event {what} in the logs in time")


def finish(procs, deadline):
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for q in procs:
                os.killpg(q.pid, signal.SIGKILL)
            raise AssertionError("the elastic run did not finish in time:\n"
                                 + "\n".join((q.communicate()[0] or "")[-3000:] for q in procs)) from None
        outs.append((p.returncode, out))
    return outs


def history(events):
    """{step: (gen, [ids of rank 0, rank 1, ...], epoch)} of the accepted steps."""
    steps, starts = {}, {}
    for evs in events.values():
        for e in evs:
            if e["ev"] == "step":
                steps.setdefault((e["gen"], e["step"]), {})[e["rank"]] = (e["ids"], e["world"], e["epoch"])
            elif e["ev"] == "reset":
                starts.setdefault(e["gen"], set()).add(e["step"])
    assert all(len(s) == 1 for s in starts.values()), f"ranks of one world rolled back to different steps: {starts}"
    start = {g: s.pop() for g, s in starts.items()}  # world g started from this committed step
    accepted = {}
    for (gen, step), ranks in sorted(steps.items()):
        later = [start[g] for g in start if g > gen]
        if later and step > min(later):
            continue  # rolled back by a later world
        world = next(iter(ranks.values()))[1]
        assert sorted(ranks) == list(range(world)), f"step {step} of world {gen}: ranks {sorted(ranks)} logged"
        assert step not in accepted, f"step {step} accepted twice"
        accepted[step] = (gen, [ranks[r][0] for r in range(world)], ranks[0][2])
    assert sorted(accepted) == list(range(1, len(accepted) + 1)), "the accepted steps have a gap"
    return accepted


def check_records(accepted, records, epochs):
    by_epoch = {}
    for step in sorted(accepted):
        gen, ids, epoch = accepted[step]
        by_epoch.setdefault(epoch, []).append((gen, ids))
    assert sorted(by_epoch) == list(range(epochs))
    for epoch, steps in by_epoch.items():
        used = [i for _, ids in steps for rank in ids for i in rank]
        assert set(used) == set(range(records)), f"epoch {epoch}: records never used"
        last_gen = steps[-1][0]
        before = sum(len(i) for gen, ids in steps if gen != last_gen for i in ids)
        world = len(steps[-1][1])
        left = records - before
        padding = world * -(-left // world) - left
        assert len(used) == records + padding, (epoch, len(used), padding)


def reference(accepted, data, records):
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=elastic_train.LR, momentum=elastic_train.MOMENTUM)
    rows = {}
    with Loader(data, records, num_replicas=1, rank=0, prefetch=0) as loader:
        for batch in loader:
            rec = decode_fixed(batch.data, batch.offsets, elastic_train.LAYOUT, as_torch=True)
            for i, x, y in zip(rec["id"].tolist(), rec["x"], rec["y"]):
                rows[i] = (x.double(), y.double())
    for step in sorted(accepted):
        _, ids, _ = accepted[step]
        grads = None
        for rank_ids in ids:
            x = torch.stack([rows[i][0] for i in rank_ids])
            y = torch.stack([rows[i][1] for i in rank_ids])
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x).squeeze(1), y).backward()
            g = [p.grad.clone() for p in model.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip(model.parameters(), grads):
            p.grad = g / len(ids)
        opt.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def check(log, data, records, epochs):
    events = read_logs(log)
    accepted = history(events)
    check_records(accepted, records, epochs)
    done = [e for evs in events.values() for e in evs if e["ev"] == "done"]
    assert done and all(e["weights"] == done[0]["weights"] for e in done), "the replicas differ"
    want = reference(accepted, data, records)
    got = done[0]["weights"]
    for a, b in zip(want, got):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-9, atol=1e-12), (a, b)
    return events, accepted, done


def who(events, event):
    return next(w for w, evs in events.items() if event in evs)
