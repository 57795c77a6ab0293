"""Run pybridge-launch as a subprocess of the tests, bounded in time; read its output
without the ranks' line prefixes."""

import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FAULT_VARS = ("PYBRIDGE_TEST_FAIL_AT_STEP", "PYBRIDGE_TEST_FAIL_MARKER", "PYBRIDGE_TEST_FAIL_RANK")
# The prefix pybridge-launch puts before each line of a rank (pybridge/launch/lines.py):
# "[rank3]:", or "[node1 rank3]:" / "[HOST rank3]:" in a multi-node job.
PREFIX = re.compile(r"^\[(?:\S+ )?rank\d+\]:", re.M)


def unprefixed(text):
    """The launcher's output as the ranks wrote it: each line without its rank prefix."""
    return PREFIX.sub("", text)


def launch(args, env=None, timeout=60, cwd=ROOT, tmpdir=None, raw=False):
    """Run the launcher with `args`; return (exit code, combined output, seconds).
    The output is unprefixed() unless raw is true.

    This checkout's pybridge comes first on PYTHONPATH, and fault-injection variables
    reach the ranks only when `env` sets them. `tmpdir`: the launcher's TMPDIR, left for
    the caller to inspect (default: a temporary folder removed afterwards).
    """
    full_env = {k: v for k, v in os.environ.items() if k not in _FAULT_VARS}
    full_env.update(env or {})
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    t0 = time.monotonic()
    # The launcher keeps a failed run's logs in a temporary folder: give it one of ours, so
    # that the tests that make ranks fail leave nothing behind in /tmp.
    with tempfile.TemporaryDirectory(prefix="pybridge-test-") as tmp:
        full_env["TMPDIR"] = str(tmpdir or tmp)
        try:
            p = subprocess.run([sys.executable, "-m", "pybridge.launch", *args], cwd=cwd, env=full_env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            pytest.fail(f"launcher did not finish within {timeout}s:\n{out}")
    return p.returncode, p.stdout if raw else unprefixed(p.stdout), time.monotonic() - t0
