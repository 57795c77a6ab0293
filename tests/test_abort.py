"""Aborting from another thread (Group.abort, comm/cancel.py; C pb_group_abort and
pb_init_abort; what Go's contexts use): the blocked call returns at once with Canceled,
later calls on the group say it was aborted, the peer blocked on this rank fails too, and
the process still finalizes and exits cleanly."""

import threading
import time

import pytest
import torch

import pybridge
from pybridge.comm import cancel
from ranks import run_ranks

pytestmark = pytest.mark.timeout(120)


def _abort_later(fn, seconds, *args):
    t = threading.Timer(seconds, fn, args)
    t.daemon = True
    t.start()
    return t


def _collective_aborted(rank, world):
    g = pybridge.init(backend="gloo", timeout=60)
    out = {}
    if rank == 1:
        sub = g.new_group([0, 1])  # a subgroup is aborted with its world
        _abort_later(g.abort, 0.5, "test deadline")
        t0 = time.monotonic()
        with pytest.raises(pybridge.Canceled, match=r"all_reduce #\d+ .* aborted \(test deadline\)"):
            pybridge.all_reduce(torch.ones(4), group=g)  # rank 0 is not there yet
        out["blocked"] = time.monotonic() - t0
        for call in (lambda: pybridge.all_reduce(torch.ones(4), group=g), lambda: pybridge.barrier(group=sub)):
            with pytest.raises(pybridge.Closed, match=r"was aborted \(test deadline\)"):
                call()
        g.abort("again")  # nothing more happens
    else:
        sub = g.new_group([0, 1])
        time.sleep(2.0)
        t0 = time.monotonic()
        with pytest.raises(pybridge.CommError):  # its peer shut the connections
            pybridge.all_reduce(torch.ones(4), group=g)
        out["peer"] = time.monotonic() - t0
    pybridge.finalize()
    return out


def test_an_abort_ends_a_blocked_collective_and_the_group():
    res = run_ranks(_collective_aborted, 2, timeout=90)
    assert res[1]["blocked"] < 10, res  # not the group's 60 s timeout
    assert res[0]["peer"] < 10, res


def _subgroup_aborted(rank, world):
    g = pybridge.init(backend="gloo", timeout=60)
    if rank == 1:
        _abort_later(g.abort, 0.5, "stop")
        t0 = time.monotonic()
        with pytest.raises(pybridge.Canceled, match="subgroup's backend was canceled"):
            g.new_group([0, 1])  # rank 0 never makes it
        took = time.monotonic() - t0
    else:
        time.sleep(3.0)
        took = 0
    pybridge.finalize()
    return took


def test_an_abort_ends_a_subgroups_creation():
    res = run_ranks(_subgroup_aborted, 2, timeout=90)
    assert res[1] < 10, res


def _init_aborted(rank, world):
    assert not cancel.abort("nothing in progress")  # no join: nothing happens
    _abort_later(cancel.abort, 0.5, "init's deadline")
    t0 = time.monotonic()
    with pytest.raises(pybridge.Canceled, match="init.* was canceled: init's deadline"):
        pybridge.init(backend="gloo", timeout=60)  # the other rank never comes
    took = time.monotonic() - t0
    assert not pybridge.is_initialized()
    return took


@pytest.mark.parametrize("only", [[0], [1]], ids=["roster", "store-host"])
def test_an_abort_ends_an_init(only):
    res = run_ranks(_init_aborted, 2, timeout=90, only=only)
    assert res[only[0]] < 10, res


def _elastic_outcome(tmp_path, script, nproc, timeout):
    """Run `script` on `nproc` workers under pybridge-launch --elastic (min world 2); the line
    it printed about how its wait ended (None if none), and the whole output."""
    from launcher import launch
    path = tmp_path / "script.py"
    path.write_text(script)
    _, out, _ = launch(["--elastic", "--nproc-per-node", str(nproc), "--min-world", "2", str(path)], timeout=timeout)
    ends = ("CANCELED", "Canceled", "FORMED", "NO FAILURE", "Timeout")
    return next((ln for ln in out.splitlines() if ln.startswith(ends)), None), out


_ELASTIC_JOIN = '''
import threading, time, pybridge
from pybridge.comm import cancel
from pybridge.runtime import elastic
def later():
    time.sleep(1.5)
    cancel.abort("test deadline")  # what Go's ElasticInitContext does when its context ends
threading.Thread(target=later, daemon=True).start()
t0 = time.monotonic()
try:
    elastic.init(join_timeout=60)
    print("FORMED")
except pybridge.Canceled as e:
    print("CANCELED after %.1f s: %s" % (time.monotonic() - t0, e))
'''


def test_an_elastic_join_waiting_for_its_first_world_is_aborted(tmp_path):
    """ElasticInit's wait (min world 2, one worker) ends at the abort, not at the join timeout."""
    line, out = _elastic_outcome(tmp_path, _ELASTIC_JOIN, 1, timeout=90)
    assert line and line.startswith("CANCELED") and "forming world 1 was canceled: test deadline" in line, out
    assert float(line.split()[2]) < 20, line  # not the 60 s join timeout


_ELASTIC_CHANGE = '''
import os, threading, time, torch, pybridge
from pybridge.runtime import elastic
g = elastic.init(join_timeout=60, lost_after=2)
if g.rank == 1:
    os._exit(0)  # leaves: rank 0's next collective fails and waits for a world of 2
time.sleep(0.5)
threading.Timer(1.5, g.abort, ["test deadline"]).start()  # what Go's AllReduceContext does when its context ends
t0 = time.monotonic()
try:
    for _ in range(1000):
        pybridge.all_reduce(torch.ones(1), group=g)
    print("NO FAILURE")
except pybridge.PyBridgeError as e:
    print("%s after %.1f s: %s" % (type(e).__name__, time.monotonic() - t0, e))
'''


def test_aborting_an_elastic_world_ends_the_wait_for_the_next_one(tmp_path):
    """A collective of an elastic world whose peer left waits to agree on the next world (up
    to the join timeout); aborting the world (Go: the call's context ended) ends that wait."""
    line, out = _elastic_outcome(tmp_path, _ELASTIC_CHANGE, 2, timeout=120)
    assert line and line.startswith("Canceled after") and "forming world 2 was canceled: test deadline" in line, out
    assert float(line.split()[2]) < 30, line  # not the 60 s join timeout


_ELASTIC_RESET = '''
import os, threading, time, torch, pybridge
from pybridge.comm import cancel
from pybridge.runtime import elastic
g = elastic.init(join_timeout=60, lost_after=2)
if g.rank == 2:
    os._exit(0)  # leaves: ranks 0 and 1 agree on a world of 2
try:
    for _ in range(1000):
        pybridge.all_reduce(torch.ones(1), group=g)
except pybridge.MembershipChanged as err:
    if g.rank == 1:
        time.sleep(8)  # never resets in time: rank 0's reset waits for it in the new world's rendezvous
        os._exit(0)
    def later():
        time.sleep(1.5)
        cancel.abort("test deadline")  # what Go's ElasticState.ResetContext does when its context ends
    threading.Thread(target=later, daemon=True).start()
    t0 = time.monotonic()
    try:
        elastic.reset(err)
        print("FORMED")
    except pybridge.PyBridgeError as e:
        print("%s after %.1f s: %s" % (type(e).__name__, time.monotonic() - t0, e))
'''


def test_an_elastic_reset_waiting_for_a_member_is_aborted(tmp_path):
    """ElasticState.Reset's wait for the new world's members ends at the abort."""
    line, out = _elastic_outcome(tmp_path, _ELASTIC_RESET, 3, timeout=120)
    assert line and line.startswith("Canceled after") and "canceled: test deadline" in line, out
    assert float(line.split()[2]) < 30, line  # not the 60 s timeout
