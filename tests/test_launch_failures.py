"""pybridge-launch names the rank that failed FIRST (issue 13 item 9): a rank is SIGKILLed and
the others exit with an error a few milliseconds later, in the same monitoring pass and the
same second, which torchrun's whole-second timestamps cannot order. No torch in the ranks:
each run costs about a launcher start-up, so it is repeated."""

import os
import textwrap

from launcher import launch

# Rank 1 publishes its pid and kills itself; the others wait for its death (pidfd) and exit 1
# within a millisecond (os._exit), with a message that does not look like a lost peer.
VICTIM_AND_FOLLOWERS = """
    import os, select, signal, sys, time
    where = sys.argv[1]
    rank = os.environ["RANK"]
    if rank == "1":
        with open(where + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(where + ".tmp", where)
        time.sleep(0.5)  # the others are waiting on our pid by now
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not os.path.exists(where) and time.monotonic() < deadline:
        time.sleep(0.01)
    fd = os.pidfd_open(int(open(where).read()))
    select.select([fd], [], [], 30)
    print(f"rank {rank}: giving up", file=sys.stderr, flush=True)
    os._exit(1)
"""


def test_the_killed_rank_is_named_not_the_ranks_that_exit_after_it(tmp_path):
    script = tmp_path / "victim.py"
    script.write_text(textwrap.dedent(VICTIM_AND_FOLLOWERS))
    for attempt in range(4):
        rc, out, _ = launch(["--nproc-per-node", "3", str(script), str(tmp_path / f"pid{attempt}")],
                            timeout=90)
        report = [line for line in out.splitlines() if line.startswith("pybridge-launch: rank")]
        assert rc == 128 + 9, f"attempt {attempt}:\n{out}"
        assert report and report[0] == "pybridge-launch: rank 1 (local rank 1) was killed by signal SIGKILL", \
            f"attempt {attempt}:\n{out}"
        # the others are reported after it, with how much later they failed (or, when
        # torchrun looked between the deaths, as stopped)
        assert any(line.startswith("pybridge-launch: rank 0 (local rank 0) failed with exit code 1 (")
                   and "s after rank 1)" in line for line in report[1:]) \
            or "stopped the other rank(s) on this node: 0" in out, out


def test_no_empty_log_folder_is_left_behind(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(textwrap.dedent("""
        import os, signal, time
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    """))
    launcher_tmp = tmp_path / "tmp"
    launcher_tmp.mkdir()
    rc, out, _ = launch(["--nproc-per-node", "2", str(script)], tmpdir=launcher_tmp, timeout=90)
    assert rc == 128 + 9, out
    assert "rank 0 (local rank 0) was killed by signal SIGKILL" in out, out
    # no rank wrote anything: nothing to keep, nothing said about it
    assert os.listdir(launcher_tmp) == [] and "logs kept in" not in out, (os.listdir(launcher_tmp), out)
    # a rank that wrote to stderr: its log is kept, and the report says where
    script.write_text("import sys\nprint('rank failing: disk on fire', file=sys.stderr)\nsys.exit(4)\n")
    rc, out, _ = launch(["--nproc-per-node", "1", str(script)], tmpdir=launcher_tmp, timeout=90)
    assert rc == 4 and "logs kept in" in out, out
    kept = os.listdir(launcher_tmp)
    assert len(kept) == 1 and str(launcher_tmp / kept[0]) in out, (kept, out)
