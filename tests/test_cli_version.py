"""--version on every command-line tool, from the one version string."""

import os
import subprocess
import sys

import pytest

import pybridge

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("cmd", [
    ["-m", "pybridge.launch"],
    ["-m", "pybridge.recordio"],
    ["-m", "pybridge.capi"],
    [os.path.join(ROOT, "examples", "mnist", "prepare.py")],
    [os.path.join(ROOT, "bench", "run.py")],
])
def test_version(cmd):
    run = subprocess.run([sys.executable, *cmd, "--version"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert run.returncode == 0, run.stderr
    assert pybridge.__version__ in run.stdout and run.stdout.count("\n") == 1, run.stdout


def test_bench_run_help_and_unknown_names():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "usage:" in run.stdout and "collectives" in run.stdout
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "nonesuch"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown benchmark(s) nonesuch" in run.stderr
