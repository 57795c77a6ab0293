"""pybridge-launch (python -m pybridge.launch): environment, failures, restarts, two nodes on
loopback, and non-Python executables. Every launcher run is a real subprocess with a timeout."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from capi_loader import pybridge_flags
from launcher import launch
from ranks import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 60


def write(path, text, mode=0o644):
    path.write_text(textwrap.dedent(text))
    path.chmod(mode)
    return str(path)


ENV_SCRIPT = """
    import json, os, sys
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
            "MASTER_PORT", "PYBRIDGE_DEVICE", "TORCHELASTIC_RESTART_COUNT"]
    # A file per rank: three ranks' stdout lines can interleave in the launcher's output.
    with open(os.path.join(sys.argv[1], "env-" + os.environ["RANK"] + ".json"), "w") as f:
        json.dump({k: os.environ.get(k) for k in keys}, f)
"""


def envs_of(folder):
    return [json.loads(p.read_text()) for p in folder.glob("env-*.json")]


def test_env_vars_seen_by_ranks(tmp_path):
    script = write(tmp_path / "env.py", ENV_SCRIPT)
    rc, out, _ = launch(["--nproc-per-node", "3", script, str(tmp_path)])
    assert rc == 0, out
    envs = sorted(envs_of(tmp_path), key=lambda e: int(e["RANK"]))
    assert [e["RANK"] for e in envs] == ["0", "1", "2"], out
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    for e in envs:
        assert e["WORLD_SIZE"] == "3" and e["LOCAL_WORLD_SIZE"] == "3" and e["GROUP_RANK"] == "0"
        assert e["MASTER_ADDR"] and int(e["MASTER_PORT"]) > 0
        assert e["PYBRIDGE_DEVICE"] == "cpu"  # no GPU on the test machine
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1


def test_script_arguments_pass_through(tmp_path):
    script = write(tmp_path / "args.py", """
        import os, sys
        print("ARGS", os.environ["RANK"], sys.argv[1:], flush=True)
    """)
    rc, out, _ = launch(["--nproc-per-node", "1", script, "--epochs", "3", "x y", "--log", "--m"])
    assert rc == 0, out  # --log and --m are prefixes of torchrun's --log-dir and --master-*
    assert "ARGS 0 ['--epochs', '3', 'x y', '--log', '--m']" in out


def test_ranks_lines_stay_whole(tmp_path):
    """print() from 3 ranks at once: every line arrives whole, with its rank's prefix (run as
    `python -u` before, a print wrote its text and its newline apart, and lines interleaved:
    "OKOK 0  1"); a line written in two pieces, a while apart, is copied as one line."""
    script = write(tmp_path / "lines.py", """
        import os, sys, time
        r = os.environ["RANK"]
        here = os.path.dirname(os.path.abspath(__file__))
        open(os.path.join(here, "ready-" + r), "w").close()
        while len([n for n in os.listdir(here) if n.startswith("ready-")]) < 3:
            time.sleep(0.001)  # all three print at the same moment
        sys.stdout.write("a piece ")
        sys.stdout.flush()
        time.sleep(0.3)  # the launcher has copied what there was, without the rest of the line
        print("of one row from", r)
        for i in range(2000):
            print("rank", r, "line", i, "of", 2000)
        print("module", __name__, "argv", sys.argv, "path0", sys.path[0], file=sys.stderr)
    """)
    rc, out, _ = launch(["--nproc-per-node", "3", script, "a b"], raw=True)
    assert rc == 0, out
    lines = [line for line in out.splitlines() if " line " in line and "module" not in line]
    broken = [line for line in lines if not re.fullmatch(r"\[rank(\d)\]:rank \1 line \d+ of 2000", line)]
    assert len(lines) == 6000 and not broken, (len(lines), broken[:10])
    for r in range(3):
        assert f"[rank{r}]:a piece of one row from {r}" in out.splitlines(), out[:2000]
    # run as `python lines.py "a b"` would: __main__, its argv, its folder first on sys.path
    assert f"[rank0]:module __main__ argv ['{script}', 'a b'] path0 {tmp_path}" in out, out


def test_line_prefix_names_the_node_across_nodes(tmp_path):
    """The prefix template given to torchrun: the rank on one node; with the node rank
    (static rendezvous) or this host's name (dynamic) across nodes."""
    import socket
    from argparse import Namespace
    from pybridge.launch import lines, torchrun
    node = torchrun._prefix_node
    assert lines.template(node(Namespace(nnodes="1", node_rank=None))) == "[rank${rank}]:"
    assert lines.template(node(Namespace(nnodes="2", node_rank=1))) == "[node1 rank${rank}]:"
    assert lines.template(node(Namespace(nnodes="1:4", node_rank=None))) == f"[{socket.gethostname()} rank${{rank}}]:"
    assert lines.template("gpu$7") == "[gpu$$7 rank${rank}]:"  # a literal "$" for torch's Template
    # Stdout in log files as torchrun keeps them, and what --no-prefix shows: the lines as written.
    script = write(tmp_path / "p.py", "print('plain', flush=True)\n")
    rc, out, _ = launch(["--nproc-per-node", "1", "--log-dir", str(tmp_path / "logs"), "--no-prefix", script], raw=True)
    assert rc == 0 and "\nplain\n" in "\n" + out, out
    kept = list((tmp_path / "logs").glob("*/attempt_0/0/stdout.log"))
    assert len(kept) == 1 and kept[0].read_text() == "plain\n", kept


def test_failing_rank_stops_job_and_is_named(tmp_path):
    script = write(tmp_path / "fail.py", """
        import os, sys, time
        if os.environ["RANK"] == "1":
            time.sleep(0.5)
            print("rank 1 is about to fail: disk on fire", file=sys.stderr, flush=True)
            sys.exit(3)
        time.sleep(120)  # rank 0 would wait forever; the launcher must stop it
    """)
    rc, out, took = launch(["--nproc-per-node", "2", script], timeout=60)
    assert rc == 3, out
    assert "pybridge-launch: rank 1 (local rank 1) failed with exit code 3" in out, out
    assert "disk on fire" in out.split("failed with exit code 3", 1)[1]  # its stderr is shown
    assert "stopped the other rank(s) on this node: 0" in out
    assert took < 40, f"the launcher took {took:.0f}s to stop the job"


def test_traceback_of_a_pybridge_rank_has_one_prefix(tmp_path):
    # torch's init_process_group prefixes tracebacks with "[rank1]: "; the launcher prefixes
    # every stderr line too, and the two gave "[rank1]:[rank1]: Traceback ...".
    script = write(tmp_path / "raise.py", """
        import os, time, pybridge
        pybridge.init(timeout=60)
        if os.environ["RANK"] == "1":
            raise ValueError("the tea kettle is empty")
        time.sleep(120)  # stopped by the launcher
    """)
    rc, out, _ = launch(["--nproc-per-node", "2", script], timeout=90, raw=True)
    assert rc == 1, out
    assert "[rank1]:ValueError: the tea kettle is empty" in out, out
    assert "[rank1]:[rank1]:" not in out and "[rank1]: [rank1]:" not in out, out
    tail = out.split("last lines of rank 1's stderr", 1)[1]
    assert "\nValueError: the tea kettle is empty" in tail, out  # the log holds the bare traceback


def test_rank_killed_by_signal_is_named(tmp_path):
    script = write(tmp_path / "kill.py", """
        import os, signal, time
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    """)
    rc, out, took = launch(["--nproc-per-node", "2", script], timeout=60)
    assert rc == 128 + 9, out
    assert "pybridge-launch: rank 0 (local rank 0) was killed by signal SIGKILL" in out, out
    assert took < 40


def test_max_restarts_restarts_a_job_that_fails_once(tmp_path):
    marker = tmp_path / "failed-once"
    script = write(tmp_path / "flaky.py", f"""
        import os, sys
        restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
        if os.environ["RANK"] == "1" and not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, "w").close()
            print("first attempt fails", file=sys.stderr, flush=True)
            sys.exit(5)
        print(f"DONE rank {{os.environ['RANK']}} attempt {{restart}}", flush=True)
    """)
    rc, out, _ = launch(["--nproc-per-node", "2", "--max-restarts", "1", script])
    assert rc == 0, out
    assert marker.exists()
    assert "DONE rank 0 attempt 1" in out and "DONE rank 1 attempt 1" in out, out
    # Without restarts the same failure ends the job.
    marker.unlink()
    rc, out, _ = launch(["--nproc-per-node", "2", script])
    assert rc == 5 and "rank 1 (local rank 1) failed with exit code 5" in out, out


ALLREDUCE = """
    import os, torch, pybridge
    g = pybridge.init(timeout=30)
    x = torch.tensor([float(g.rank + 1)])
    pybridge.all_reduce(x)
    model = torch.nn.Linear(4, 2)
    torch.manual_seed(100 + g.rank)  # different data per rank
    ddp = pybridge.DistributedDataParallel(model)
    ddp(torch.randn(8, 4)).pow(2).mean().backward()
    grad = model.weight.grad.clone()
    pybridge.broadcast(grad, 0)
    same = bool(torch.equal(grad, model.weight.grad))
    print(f"RESULT rank {g.rank} of {g.size} node {os.environ['GROUP_RANK']} sum {x.item()} "
          f"grads-equal {same}", flush=True)
    pybridge.finalize()
"""


def test_two_nodes_on_loopback(tmp_path):
    script = write(tmp_path / "ar.py", ALLREDUCE)
    endpoint = f"127.0.0.1:{free_port()}"
    full_env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                "TMPDIR": str(tmp_path)}  # a failed run's logs stay in the test's folder, not /tmp
    procs = [subprocess.Popen([sys.executable, "-m", "pybridge.launch", "--nproc-per-node", "1",
                               "--nnodes", "2", "--node-rank", str(node), "--rdzv-endpoint", endpoint,
                               script], cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for node in (0, 1)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("two-node job did not finish in time:\n" + "\n".join(
            (p.communicate()[0] or "") for p in procs))
    for node, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node {node}:\n{out}"
        # each line names its node and rank
        assert f"\n[node{node} rank{node}]:RESULT rank {node} of 2 node {node} sum 3.0 grads-equal True\n" in out, out


def test_runs_a_shell_script_executable(tmp_path):
    script = write(tmp_path / "job.sh", """\
        #!/bin/sh
        echo "SH rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE device=$PYBRIDGE_DEVICE args=$*"
    """, 0o755)
    rc, out, _ = launch(["--nproc-per-node", "2", script, "a", "b"])
    assert rc == 0, out
    for r in range(2):
        assert f"SH rank={r} local={r} world=2 device=cpu args=a b" in out, out


@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler")
def test_runs_a_compiled_program_and_reports_its_failure(tmp_path):
    src = write(tmp_path / "prog.c", """
        #include <stdio.h>
        #include <stdlib.h>
        int main(int argc, char **argv) {
            const char *rank = getenv("RANK");
            printf("C rank=%s world=%s arg=%s\\n", rank, getenv("WORLD_SIZE"), argc > 1 ? argv[1] : "");
            fflush(stdout);
            if (argc > 2 && atoi(rank) == 1) { fprintf(stderr, "C program error on rank 1\\n"); return 9; }
            return 0;
        }
    """)
    exe = str(tmp_path / "prog")
    subprocess.run(["cc", "-o", exe, src], check=True, timeout=60)
    rc, out, _ = launch(["--nproc-per-node", "2", "--no-prefix", exe, "hello"], raw=True)
    assert rc == 0, out  # --no-prefix: the lines as the program wrote them
    assert sorted(re.findall(r"^C rank=.*$", out, re.M)) == [f"C rank={r} world=2 arg=hello" for r in (0, 1)], out
    rc, out, _ = launch(["--nproc-per-node", "2", exe, "hello", "fail"])
    assert rc == 9, out
    assert "rank 1 (local rank 1) failed with exit code 9" in out
    assert "C program error on rank 1" in out


def test_a_c_rank_linked_with_pybridge_prints_whole_lines_as_it_goes(tmp_path):
    # A rank's stdout is a log file: C's stdio would hold "first" in its 4 KiB buffer until
    # the program exits. Linked with libpybridge, stdout is line-buffered (PYBRIDGE_LINE_BUFFERED):
    # the line reaches the launcher's console while the program still waits for the test.
    go_on = tmp_path / "go-on"
    src = write(tmp_path / "waits.c", f"""
        #include <stdio.h>
        #include <unistd.h>
        #include <pybridge.h>
        int main(void) {{
            printf("first from pybridge %s\\n", pb_version());  /* no fflush */
            for (int i = 0; i < 300 && access("{go_on}", F_OK) != 0; i++) usleep(100000);
            printf("second\\n");
            return 0;
        }}
    """)
    exe = str(tmp_path / "waits")
    subprocess.run(["gcc", "-o", exe, src, *pybridge_flags(os.path.join(ROOT, "build"))], check=True, timeout=60)
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-m", "pybridge.launch", "--nproc-per-node", "1", exe], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = []
        timer = threading.Timer(20, os.killpg, (proc.pid, signal.SIGKILL))  # bounds the readline below
        timer.start()
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("[rank0]:first from pybridge"):
                break
        timer.cancel()
        assert seen and seen[-1].startswith("[rank0]:first from pybridge"), "".join(seen)
        go_on.touch()
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0 and "[rank0]:second\n" in rest, "".join(seen) + rest


def test_usage_errors_are_clear(tmp_path):
    rc, out, _ = launch(["--nproc-per-node", "2", str(tmp_path / "missing.py")])
    assert rc != 0 and "no such script" in out
    rc, out, _ = launch(["--nproc-per-node", "2", "no-such-program-xyz"])
    assert rc != 0 and "not found or not executable" in out
    rc, out, _ = launch(["--nnodes", "2", "/bin/true"])
    assert rc != 0 and "needs --rdzv-endpoint" in out


def test_ranks_exit_cleanly_after_finalize(tmp_path):
    # Regression: a ProcessGroup that pybridge kept referenced after finalize() was freed at
    # interpreter exit, where gloo aborted about every other 2-rank run
    # ("terminate called without an active exception", SIGABRT).
    script = write(tmp_path / "leave.py", """
        import torch, pybridge
        pybridge.init(timeout=30)
        ddp = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))
        ddp(torch.randn(8, 4)).pow(2).mean().backward()
        pybridge.broadcast(torch.ones(3), 0)
        ddp.close()
        pybridge.finalize()
    """)
    for attempt in range(2):  # 8 ranks' exits in all, for two launcher start-ups
        rc, out, _ = launch(["--nproc-per-node", "4", script])
        assert rc == 0, f"attempt {attempt}:\n{out}"
        assert "terminate called" not in out


def test_failure_report_names_the_cause_not_the_ranks_that_lost_it(tmp_path):
    from types import SimpleNamespace

    from pybridge.launch.torchrun import format_failure

    for local_rank, text in ((0, "pb_all_reduce: Connection closed by peer [PB_ERR_COMM]"),
                             (1, "rank 1: out of memory")):
        log = tmp_path / "run" / "attempt_0" / str(local_rank)
        log.mkdir(parents=True)
        (log / "stderr.log").write_text(text + "\n")
    fail = lambda lr, code: SimpleNamespace(exitcode=code, local_rank=lr, timestamp=100, error_file_data={})
    # Same timestamp, and the survivor (rank 0) would sort first by rank.
    text, status = format_failure(SimpleNamespace(failures={0: fail(0, 1), 1: fail(1, 3)}), str(tmp_path), None)
    assert status == 3
    assert text.splitlines()[0] == "pybridge-launch: rank 1 (local rank 1) failed with exit code 3", text
    assert "out of memory" in text and "rank 0 (local rank 0) failed with exit code 1" in text


@pytest.mark.parametrize("local_rank,gpus,isolate,visible,want", [
    (0, 0, "0", None, ("cpu", None)),            # CPU machine
    (1, 2, "0", None, ("cuda:1", None)),         # one GPU per local rank
    (3, 2, "0", None, ("cuda:1", None)),         # more ranks than GPUs: round robin
    (1, 2, "1", None, ("cuda:0", "1")),          # --isolate-gpus: only its GPU is visible
    (1, 2, "1", "5,7", ("cuda:0", "7")),         # ... chosen among the GPUs already visible
])
def test_worker_device_choice(local_rank, gpus, isolate, visible, want):
    """The per-rank device the worker shim sets before exec'ing the target (GPU counts faked:
    the shim only reads them from the launcher's environment)."""
    from pybridge.launch import torchrun as launch_mod
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update({"LOCAL_RANK": str(local_rank), "PYBRIDGE_NUM_GPUS": str(gpus), "PYBRIDGE_ISOLATE_GPUS": isolate})
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    shell = 'echo "$PYBRIDGE_DEVICE ${CUDA_VISIBLE_DEVICES-unset}"'
    p = subprocess.run([sys.executable, "-c", launch_mod._WORKER_SHIM, "exec", "/bin/sh", "-c", shell],
                       env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    device, cvd = p.stdout.split()
    assert (device, None if cvd == "unset" else cvd) == want
