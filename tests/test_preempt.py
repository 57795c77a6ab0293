"""Preemption (pybridge/runtime/preempt.py): a scheduler's warning signal that reaches one
rank stops every rank after the same step; pybridge-launch passes SIGUSR1 to its workers
instead of dying of it and reports a preempted job with the requeue status; the job then
resumes from the checkpoint it saved."""

import os
import signal
import subprocess
import sys
import threading

import pytest

import pybridge
from launcher import launch, unprefixed
from pybridge.errors import InvalidArgument
from pybridge.runtime import checkpoint, preempt
from ranks import run_ranks


def _one_rank_warned(rank, world):
    pybridge.init(backend="gloo", timeout=30)
    with preempt.Preemption() as watch:
        for step in range(1, 50):
            if rank == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGUSR1)  # only rank 1 hears the scheduler
            if watch.should_stop():
                break
        seen = watch.requested
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # close() put the default back
    pybridge.finalize()
    return step, seen


def test_a_signal_on_one_rank_stops_every_rank_after_the_same_step():
    assert run_ranks(_one_rank_warned, 3, timeout=60) == [(3, None), (3, "SIGUSR1"), (3, None)]


def _c_any_rank(rank, world):
    from capi_loader import init_world, load
    ffi, lib = load()
    g, out = init_world(ffi, lib), ffi.new("int32_t *")
    answers = []
    for flag in ([0, 0, 0], [0, 0, 1]):
        assert lib.pb_any_rank(g, flag[rank], out) == 0
        answers.append(out[0])
    assert lib.pb_any_rank(g, 1, ffi.NULL) == lib.PB_ERR_INVALID_ARGUMENT
    assert lib.pb_finalize(g) == 0
    return answers


def test_pb_any_rank_from_c():
    assert run_ranks(_c_any_rank, 3, timeout=60) == [[0, 1]] * 3


def test_signal_names_are_checked():
    assert preempt.signal_numbers("USR1, SIGTERM") == [signal.SIGUSR1, signal.SIGTERM]
    with pytest.raises(InvalidArgument, match="unknown signal 'SIGFOO'"):
        preempt.signal_numbers("SIGFOO")
    assert preempt.REQUEUE == 75 == pybridge.abi.PB_EXIT_REQUEUE


TRAIN = """
import os, sys, time, torch, pybridge
from pybridge.runtime import checkpoint, preempt
folder, steps = sys.argv[1], int(sys.argv[2])
say = lambda *words: os.write(1, (" ".join(map(str, words)) + "\\n").encode())  # one write: whole lines
g = pybridge.init(backend="gloo", timeout=30)
w = torch.zeros(4)
got = checkpoint.restore(folder, tensors={"w": w})
start = 0 if got is None else got.step
watch = preempt.Preemption()
for step in range(start, steps):
    grad = torch.full((4,), float(step + g.rank))
    pybridge.all_reduce(grad, "avg")
    w -= 0.1 * grad
    if step == start:
        say("TRAINING", g.rank)
    time.sleep(0.02)
    if watch.should_stop():
        if g.rank == 0:
            checkpoint.save(folder, step + 1, tensors={"w": w})
        say("SAVED", g.rank, step + 1, watch.requested)
        pybridge.finalize()
        sys.exit(preempt.REQUEUE)
say("DONE", g.rank, start, w.tolist())
pybridge.finalize()
"""


def test_the_launcher_passes_the_warning_on_and_the_requeued_job_resumes(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    folder = str(tmp_path / "ckpt")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    # SLURM's --signal=USR1@120 as it may arrive: at the launcher only
    p = subprocess.Popen([sys.executable, "-m", "pybridge.launch", "--nproc-per-node", "2", str(script), folder,
                          "3000"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)  # its workers die with it (killpg below) if the test fails
    lines = []
    kill = lambda: os.killpg(p.pid, signal.SIGKILL)  # noqa: E731 - the launcher and its workers
    guard = threading.Timer(60, kill)  # a warning that never arrives fails the test, not hangs it
    guard.start()
    try:
        for line in p.stdout:
            lines.append(line)
            if sum(unprefixed(line).startswith("TRAINING") for line in lines) == 2:
                p.send_signal(signal.SIGUSR1)
                break
        out = unprefixed("".join(lines) + p.communicate(timeout=60)[0])
    finally:
        guard.cancel()
        if p.poll() is None:
            kill()
    assert p.returncode == 75, out
    assert "pybridge-launch: preempted: rank(s) " in out and "saved and exited with 75 (requeue)" in out, out
    saved = {int(line.split()[2]) for line in out.splitlines() if line.startswith("SAVED")}
    assert len(saved) == 1 and "SIGUSR1" in out, out  # both ranks stopped after the same step
    step = saved.pop()
    assert checkpoint.newest(folder)[0] == step
    # requeued: the job starts again and resumes from that step
    code, out2, _ = launch(["--nproc-per-node", "2", str(script), folder, str(step + 5)])
    assert code == 0, out2
    w = 0.0
    for s in range(step + 5):
        w -= 0.1 * (s + 0.5)  # the mean gradient of step s over the 2 ranks
    done = [line.split(maxsplit=3) for line in out2.splitlines() if line.startswith("DONE")]
    assert sorted((d[1], int(d[2])) for d in done) == [("0", step), ("1", step)], out2  # resumed, not restarted
    for d in done:
        assert [float(v) for v in d[3].strip("[]").split(",")] == pytest.approx([w] * 4, rel=1e-5), out2


def test_a_warning_before_the_workers_start_reaches_them():
    # Under a real SLURM a requeued job's warning came 3 s after it started and killed the
    # launcher (exit 138): the launcher now catches it first thing, and with no worker yet
    # keeps it for the workers it starts, whose Preemption() starts as warned. In a process
    # of its own: pytest's has children, to which the signal would go.
    code = """if True:
        import os, signal
        from pybridge.launch import exits
        from pybridge.runtime import preempt
        exits.forward_signals()
        os.kill(os.getpid(), signal.SIGUSR1)  # no child: nothing to forward to
        print(os.environ.get(exits.PENDING), exits.PENDING == preempt.PENDING)
        with preempt.Preemption() as watch:
            print(watch.requested)
        with preempt.Preemption(["SIGTERM"]) as watch:  # a signal it does not watch for
            print(watch.requested)
    """
    env = {k: v for k, v in os.environ.items() if k != preempt.PENDING}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["SIGUSR1", "True", "SIGUSR1", "None"], p.stdout + p.stderr
