"""Running tests/elastic_train.py under pybridge-launch --elastic and reading its logs: for
tests/test_elastic_survive.py and bench/elastic.py."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(port, log, data, *extra, nproc=4, node=None, launcher=(), env=None, epochs=3, batch=4):
    """pybridge-launch --elastic running tests/elastic_train.py (its output piped); node: start
    it as that node of a 2-node job (a launcher that joins the running job's store)."""
    where = ["--nnodes", "2", "--node-rank", str(node)] if node is not None else []
    cmd = [sys.executable, "-m", "pybridge.launch", "--elastic", "--nproc-per-node", str(nproc),
           "--rdzv-endpoint", f"127.0.0.1:{port}", *where, *launcher,
           os.path.join(ROOT, "tests", "elastic_train.py"), "--data", *data, "--log", log,
           "--epochs", str(epochs), "--batch", str(batch), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT, **(env or {})}, start_new_session=True)


def read_logs(log):
    out = {}
    for path in glob.glob(f"{log}-*.jsonl"):
        who = path[len(log) + 1:-len(".jsonl")]
        with open(path) as f:
            out[who] = [json.loads(line) for line in f if line.strip()]
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
