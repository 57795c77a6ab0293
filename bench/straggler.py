"""A traced 4-rank run of the Go MNIST trainer with one rank slowed, and its report: the run
behind the pictures in docs/observability.md.

    python bench/straggler.py [--slow cpu|none] [--quota 0.25] [--epochs 1] [--out DIR]
                              [--images docs/img/observability]

--slow cpu (the default) puts rank 3 in a cgroup v1 cpu controller with a quota of --quota
CPUs (needs root and /sys/fs/cgroup/cpu), as a node shared with other people's processes
would; none runs the four ranks evenly. The ranks run under `pybridge-launch --trace DIR`,
then `pybridge report DIR --skip-steps 1` prints its tables and writes its charts, which
--images copies (PNG) for the docs.
"""

import argparse
import os
import shutil
import stat
import subprocess
import sys
import shlex
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, progress  # noqa: E402
from mnist import GO_TRAINER, build_go_trainer, prepare  # noqa: E402

from pybridge.testing import cpulimit  # noqa: E402

SLOW_RANK = 3


def wrapper(tmp, budget):
    """The executable each rank runs: rank 3 runs the trainer inside the CPU budget."""
    path = os.path.join(tmp, "rank.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n")
        if budget:
            f.write(f'[ "$RANK" = "{SLOW_RANK}" ] && exec {shlex.join(budget.wrap([GO_TRAINER]))} "$@"\n')
        f.write(f'exec {GO_TRAINER} "$@"\n')
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slow", choices=["cpu", "none"], default="cpu")
    ap.add_argument("--quota", type=float, default=0.25, help="CPUs rank 3 may use with --slow cpu (default 0.25)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--out", default=None, help="the trace directory (default: a temporary one)")
    ap.add_argument("--images", default=None, help="copy the report's PNG charts here")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mnist")
        prepare(data)
        progress("building the Go trainer")
        build_go_trainer()
        budget = None
        if opts.slow == "cpu":
            ok, why = cpulimit.available()
            if not ok:
                raise SystemExit(f"--slow cpu: {why}")
            budget = cpulimit.CpuBudget(opts.quota, period_us=10000)
        out = os.path.abspath(opts.out or os.path.join(tmp, "trace"))
        shutil.rmtree(out, ignore_errors=True)
        try:
            cmd = [sys.executable, "-m", "pybridge.launch", "--nproc-per-node", "4", "--trace", out, "--no-python",
                   wrapper(tmp, budget), "--data", data, "--epochs", str(opts.epochs)]
            progress(" ".join(cmd))
            subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        finally:
            if budget:
                progress(f"rank {SLOW_RANK}'s CPU budget: {budget.report()}")
                budget.close()
        rep = os.path.join(out, "report")
        subprocess.run([sys.executable, "-m", "pybridge.observe", "report", out, "--skip-steps", "1", "--out", rep],
                       cwd=ROOT, check=True)
        if opts.images:
            os.makedirs(opts.images, exist_ok=True)
            for name in ("timeline.png", "breakdown.png", "bandwidth.png"):
                shutil.copy(os.path.join(rep, name), os.path.join(opts.images, name))
            progress(f"copied the charts into {opts.images}")


if __name__ == "__main__":
    main()
