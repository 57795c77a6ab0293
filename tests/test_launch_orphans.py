"""No orphans: a pybridge-launch killed with SIGKILL (the OOM killer, a node agent, kill -9)
takes its workers with it, Python and exec'd (C, Go) targets alike, with torchrun's agent
and with --elastic. Before, both ranks of a 2-rank job were still running 5 s after the
launcher's death, with parent 1 (torchrun behaves so too)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GONE_WITHIN = 5.0  # seconds after the launcher's death


def _children(pid):
    """Pids whose parent is `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid):
    """Running (a zombie waiting for a reaper is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _workers(launcher, want, timeout=60):
    """The launcher's worker processes once `want` of them run the target."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            pytest.fail(f"launcher exited early: {launcher.communicate()[0]}")
        kids = [p for p in _children(launcher.pid) if _started(p)]
        if len(kids) >= want:
            return kids
        time.sleep(0.1)
    pytest.fail(f"{want} workers did not start within {timeout} s")


def _started(pid):
    """The worker reached its target (its marker file exists: written by the target)."""
    return os.path.exists(os.path.join(MARKS, str(pid)))


MARKS = None


@pytest.fixture(autouse=True)
def _marks(tmp_path):
    global MARKS
    MARKS = str(tmp_path / "marks")
    os.makedirs(MARKS)


def _python_target(tmp_path):
    script = tmp_path / "spin.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        open(os.path.join({MARKS!r}, str(os.getpid())), "w").close()
        while True:
            time.sleep(0.05)
    """))
    return [str(script)]


def _exec_target(tmp_path):
    # An exec'd program (as a C or Go rank is): the shell marks its pid, then execs sleep in place.
    script = tmp_path / "spin.sh"
    script.write_text(f"#!/bin/sh\ntouch {MARKS}/$$\nexec sleep 300\n")
    script.chmod(0o755)
    return ["--no-python", str(script)]


@pytest.mark.parametrize("elastic", [False, True], ids=["torchrun-agent", "elastic"])
@pytest.mark.parametrize("target", [_python_target, _exec_target], ids=["python", "exec"])
def test_workers_end_with_a_killed_launcher(tmp_path, target, elastic):
    args = [sys.executable, "-m", "pybridge.launch", "--nproc-per-node", "2"]
    if elastic:
        args += ["--elastic", "--monitor-interval", "0.1"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TMPDIR=str(tmp_path))
    launcher = subprocess.Popen(args + target(tmp_path), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        workers = _workers(launcher, 2)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        deadline = time.monotonic() + GONE_WITHIN
        while time.monotonic() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.05)
        left = [p for p in workers if _alive(p)]
        assert not left, f"workers {left} outlived their launcher by {GONE_WITHIN} s"
    finally:
        launcher.kill()
        for p in _children(launcher.pid) + [p for p in os.listdir(MARKS) if p.isdigit()]:
            try:
                os.kill(int(p), signal.SIGKILL)
            except (OSError, ValueError):
                pass


def test_a_worker_whose_launcher_is_already_gone_does_not_start(tmp_path):
    """The race the shim closes: the launcher dies between the fork and the death signal."""
    from pybridge.launch.torchrun import _WORKER_SHIM
    env = dict(os.environ, PYBRIDGE_LAUNCHER_PID="1")  # not our parent
    out = subprocess.run([sys.executable, "-c", _WORKER_SHIM, "exec", "true"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 1 and "the launcher (pid 1) is gone; not starting" in out.stderr
