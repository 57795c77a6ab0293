"""Elastic membership rounds (pybridge/runtime/membership.py) in one process, over a real TCPStore:
who forms each world, in which order, and when a member counts as lost."""

import datetime
import os
import threading

import pytest
import torch.distributed as dist

from pybridge.runtime import membership as mb
from pybridge.runtime.elastic_store import TcpStore
from pybridge.errors import Closed, CommError, MembershipChanged, Timeout
from ranks import free_port


_made = []  # every Membership of the test: closed before its store goes


@pytest.fixture
def port():
    p = free_port()
    host = dist.TCPStore("127.0.0.1", p, None, True, datetime.timedelta(seconds=10), wait_for_workers=False,
                         multi_tenant=True)
    yield p
    while _made:
        _made.pop().close()
    del host


def _member(port, mid, **kw):
    kw.setdefault("timeout", 5)
    m = mb.Membership(TcpStore("127.0.0.1", port), member_id=mid, **kw)
    _made.append(m)
    return m


def _cand(mid, want=None, pid=None):
    # another machine: no pid probe, so only the launcher's mark or the heartbeat decide
    return {"id": mid, "host": "h", "pid": pid or 1, "machine": "elsewhere", "want": want}


def _in_threads(fns):
    out, errors = [None] * len(fns), []

    def run(i, fn):
        try:
            out[i] = fn()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors, errors
    return out


def test_first_world_waits_for_the_initial_count_and_orders_by_rank(port):
    m = _member(port, "me", initial=3)
    members, waiting = m._decide(1, None, [_cand("a", 2), _cand("b", 0)])
    assert members is None and "2 of the 3 initial processes" in waiting
    members, _ = m._decide(1, None, [_cand("a", 2), _cand("b", 0), _cand("c", 1)])
    assert [c["id"] for c in members] == ["b", "c", "a"]
    m.close()


def test_next_world_keeps_the_survivors_order_then_the_joiners(port):
    m = _member(port, "me")
    prev = [_cand(x) for x in "abcd"]
    mb.mark_dead(m.store, "b", "was killed by signal SIGKILL")
    members, waiting = m._decide(2, prev, [_cand("d"), _cand("new"), _cand("a")])
    assert members is None and "c (host h, pid 1)" in waiting  # c neither came back nor is known lost
    mb.mark_dead(m.store, "c", "exited with code 1")
    members, _ = m._decide(2, prev, [_cand("d"), _cand("new"), _cand("a")])
    assert [c["id"] for c in members] == ["a", "d", "new"]
    assert m.lost_reason(_cand("b")) == "was killed by signal SIGKILL"
    m.close()


def test_max_and_min_world_size(port):
    small = _member(port, "me", min_size=3)
    members, waiting = small._decide(1, None, [_cand("a", 0), _cand("b", 1)])
    assert members is None
    members, waiting = small._decide(2, [_cand("a"), _cand("b")], [_cand("a"), _cand("b")])
    assert members is None and "below the minimum world size 3" in waiting
    capped = _member(port, "me2", max_size=2)
    members, _ = capped._decide(2, [_cand("a"), _cand("b")], [_cand("a"), _cand("b"), _cand("j")])
    assert [c["id"] for c in members] == ["a", "b"]  # the joiner waits for a later world
    small.close()
    capped.close()


def test_a_still_heartbeat_counts_as_lost_after_lost_after(port):
    m = _member(port, "me", lost_after=0.3)
    m.store.set(mb.PREFIX + "hb/quiet", "1")
    assert m.lost_reason(_cand("quiet")) is None  # first look: the clock starts
    threading.Event().wait(0.4)
    assert "no heartbeat for" in m.lost_reason(_cand("quiet"))
    other = _member(port, "beating", lost_after=0.3)  # its thread beats
    assert m.lost_reason(_cand("beating")) is None
    threading.Event().wait(0.45)
    assert m.lost_reason(_cand("beating")) is None
    m.close()
    other.close()


def test_a_gone_pid_on_this_machine_is_lost_at_once(port):
    m = _member(port, "me", lost_after=60)
    gone = {**m.me, "id": "gone", "pid": 2**22 + 12345}  # beyond pid_max on Linux by default
    assert m.lost_reason(gone) == "its process is gone"
    assert m.lost_reason({**m.me, "id": "me-too", "pid": os.getpid()}) is None
    m.close()


def test_rounds_end_to_end(port):
    ms = [_member(port, f"w{i}", initial=3, want=i) for i in range(3)]
    worlds = _in_threads([m.first_world for m in ms])
    assert [w.rank for w in worlds] == [0, 1, 2] and {w.generation for w in worlds} == {1}
    # w1 dies: its launcher says so; the two others form world 2 and name it
    mb.mark_dead(ms[0].store, "w1", "was killed by signal SIGKILL")
    errs = _in_threads([lambda m=m, w=w: m.changed(w, cause="test") for m, w in ((ms[0], worlds[0]),
                                                                                   (ms[2], worlds[2]))])
    assert all(isinstance(e, MembershipChanged) for e in errs)
    assert [e.lost for e in errs] == [[1], [1]] and [e.world.rank for e in errs] == [0, 1]
    assert "ranks [1] lost (w1 (host" in str(errs[0]) and errs[0].new_size == 2
    assert ms[0].changed(worlds[0]) is errs[0]  # once per world
    # a joiner registers for world 3; the members see it waiting
    joiner = _member(port, "j", initial=3)
    box = []
    t = threading.Thread(target=lambda: box.append(joiner.first_world()))
    t.start()
    while ms[0].joiners_waiting(errs[0].world) == 0:
        threading.Event().wait(0.01)
    news = _in_threads([lambda m=m, e=e: m.next_world(e.world) for m, e in ((ms[0], errs[0]), (ms[2], errs[1]))])
    t.join(10)
    assert [n.ids for n in news] == [["w0", "w2", "j"]] * 2 and box[-1].rank == 2
    # the job finishes: a late process is told so
    ms[0].finish()
    with pytest.raises(Closed, match="already finished"):
        _member(port, "late").first_world()
    for m in ms + [joiner]:
        m.close()


def test_a_round_that_cannot_form_times_out_naming_who_it_waits_for(port):
    m = _member(port, "me", timeout=0.5)
    other = _member(port, "other")  # alive (it beats) but never registers again
    with pytest.raises(Timeout, match="neither came back nor are known lost: other"):
        m.next_world(mb.World(1, [m.me, other.me], "me"))
    m.close()
    other.close()


def test_a_store_that_is_gone_is_named():
    p = free_port()
    host = dist.TCPStore("127.0.0.1", p, None, True, datetime.timedelta(seconds=5), wait_for_workers=False)
    m = _member(p, "me")
    m.close()  # its heartbeat thread would only log the broken pipe
    del host
    with pytest.raises(CommError, match="stopped answering"):
        m.joiners_waiting(mb.World(1, [m.me], "me"))
