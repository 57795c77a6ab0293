"""Elastic training from plain C (tests/c/elastic.c) under pybridge-launch --elastic: a rank
SIGKILLs itself mid-training, the survivors get PB_ERR_MEMBERSHIP, pb_state_reset onto the
smaller world and finish with identical state; and the calls' bad uses."""

import math
import os
import re
import subprocess

import pytest

from capi_loader import LIB_PATH, init_world, last_error, load, pybridge_flags
from launcher import launch
from pybridge import recordio as rio
from ranks import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    d = tmp_path_factory.mktemp("elastic-c")
    exe, data = str(d / "elastic"), str(d / "data.recordio")
    flags = pybridge_flags(os.path.join(ROOT, "build"))
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", exe, os.path.join(ROOT, "tests", "c", "elastic.c"),
                    *flags], check=True)
    rio.write_file(data, [bytes([i]) for i in range(120)])
    return exe, data


def _run(exe, data, die_rank, *extra, launcher=()):
    """3 ranks, 2 epochs of 120 records, batch 2 per rank, a commit every 5 steps; rank
    die_rank SIGKILLs itself before step 7. Returns the output; checks what every run shows."""
    code, out, _ = launch(["--elastic", *launcher, "--nproc-per-node", "3", exe, data, "2", "5", "7", str(die_rank),
                           *extra], timeout=90)
    assert code == 0, out
    assert f"worker node0-slot{die_rank}-0 (local rank {die_rank}) was killed by signal SIGKILL" in out, out
    assert sorted(re.findall(r"^NORESET rank=(\d) status=(\S+) barrier=(\S+)$", out, re.M)) == \
        [(str(r), "PB_ERR_INVALID_ARGUMENT", "PB_OK") for r in range(3)], out
    why = re.findall(r"^MEMBERSHIP rank=\d: (.*)$", out, re.M)
    assert len(why) >= 2 and all(f"ranks [{die_rank}] lost (node0-slot{die_rank}-0 (host" in w for w in why[:2]), out
    # Both survivors: lost the killed rank, rolled back to the commit of step 5, old handle closed.
    resets = re.findall(r"^RESET rank=(\d) (.*gen=2 .*)$", out, re.M)
    assert sorted(r for r, _ in resets) == ["0", "1"], out
    assert {rest for _, rest in resets} == {f"lost={die_rank} joined=0 old=3 new=2 gen=2 step=5 old_handle=PB_ERR_CLOSED"}
    return out


def _results(out, n):
    results = re.findall(r"^RESULT rank=(\d) (.*)$", out, re.M)
    assert sorted(r for r, _ in results) == [str(r) for r in range(n)], out
    finals = {rest for _, rest in results}
    assert len(finals) == 1, out  # identical weights, momentum, step and epoch
    return next(iter(finals))


def test_survivors_reset_and_finish_identical(program):
    out = _run(*program, 2)
    # 5 steps of 6 records, the epoch's other 90 at 4 a step (22, the last 2 dropped), 30 more.
    assert _results(out, 2).startswith("world=2 gen=2 step=57 epoch=2 "), out


def test_rank_0_dies_and_a_replacement_joins_with_the_state(program):
    # Steps take 200 ms while the world is short of 3 (a 10 s window), so the replacement joins
    # before the end; once it has, they are fast again.
    out = _run(*program, 0, "200", launcher=["--replace", "1"])
    assert "node0-slot0-1 replaces it" in out, out
    joins = re.findall(r"^RESET rank=(\d) lost= joined=1 old=2 new=3 gen=3 step=(\d+) old_handle=PB_ERR_CLOSED$", out, re.M)
    assert sorted(r for r, _ in joins) == ["0", "1"] and len({s for _, s in joins}) == 1, out
    assert int(joins[0][1]) > 5, out  # admitted at a later commit, rolled back to it
    # The joiner (rank 2) ends with the survivors' weights: it received the committed state.
    assert re.match(r"world=3 gen=3 step=\d+ epoch=2 ", _results(out, 3)), out


def misuse(rank, world):
    ffi, lib = load()
    gp, got = ffi.new("pb_group **"), {}
    got["addr"] = lib.pb_elastic_init(b"gloo", b"nowhere", 10.0, gp), last_error(ffi, lib)
    got["nan"] = lib.pb_elastic_init(b"gloo", b"127.0.0.1:1", math.nan, gp), last_error(ffi, lib)
    got["out"] = lib.pb_elastic_init(b"gloo", ffi.NULL, 10.0, ffi.NULL), last_error(ffi, lib)
    got["change"] = lib.pb_elastic_last_change(ffi.NULL, 0, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL), last_error(ffi, lib)
    g = init_world(ffi, lib)
    sp = ffi.new("pb_state **")
    assert lib.pb_state_create(sp) == 0
    step = ffi.new("int64_t *")
    assert lib.pb_state_commit(sp[0], 1, 0, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL) == 0, last_error(ffi, lib)
    got["reset"] = lib.pb_state_reset(sp[0], 0, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, gp, step), last_error(ffi, lib)
    got["finish"] = lib.pb_elastic_finish(g), last_error(ffi, lib)
    got["barrier"] = lib.pb_barrier(g), ""  # the world made by pb_init is untouched
    lib.pb_state_close(sp[0])
    lib.pb_finalize(g)
    return got


def test_misuse_is_named():
    ffi, lib = load()
    got = run_ranks(misuse, 1, timeout=60)[0]
    bad = lib.PB_ERR_INVALID_ARGUMENT
    assert got["addr"][0] == bad and "'nowhere': expected host:port" in got["addr"][1]
    assert got["nan"][0] == bad and "timeout_seconds is NaN" in got["nan"][1]
    assert got["out"][0] == bad and "out (the pointer" in got["out"][1]
    assert got["change"][0] == bad and "not in an elastic job (join it with pb_elastic_init)" in got["change"][1]
    assert got["reset"][0] == bad and "pb_state_reset: this process is not in an elastic job" in got["reset"][1]
    assert got["finish"][0] == bad and "pb_elastic_finish: this process is not in an elastic job" in got["finish"][1]
    assert got["barrier"][0] == 0
