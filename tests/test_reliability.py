"""Cross-rank mismatches (checked mode, always-on checks of one-off calls), errors that
name ranks, and the hang watchdog (docs/failures.md). Every case runs on real ranks,
bounded in time; no rank may abort."""

import io
import os
import sys
import time

import pytest
import torch

import pybridge
from tests.ranks import run_ranks


def _error(fn):
    try:
        fn()
    except pybridge.PyBridgeError as exc:
        return type(exc).__name__, str(exc)
    return None


def _threads_in_opposite_orders(g, rank):
    """Two threads each all_reduce their own length on g; rank 0 starts them in one order,
    the other ranks in the other (the second starts once the first is numbered: it holds
    checked mode's unit). Returns what each thread got: its sum or (error type, text)."""
    import threading
    got = {}

    def call(n):
        t = torch.ones(n)
        got[n] = _error(lambda: pybridge.all_reduce(t, group=g)) or t.tolist()

    first, second = (2, 3) if rank == 0 else (3, 2)
    before = g.issued
    a = threading.Thread(target=call, args=(first,))
    a.start()
    while g.issued == before:
        time.sleep(0.001)
    b = threading.Thread(target=call, args=(second,))
    b.start()
    a.join()
    b.join()
    return got


def _checked_cases(rank, world):
    g = pybridge.init(backend="gloo", timeout=30, checked=True)
    odd = rank == 1
    out = {}
    out["dtype"] = _error(lambda: pybridge.all_reduce(
        torch.ones(4, dtype=torch.int32 if odd else torch.float32)))
    out["op"] = _error(lambda: pybridge.all_reduce(torch.ones(4), "max" if odd else "sum"))
    out["count"] = _error(lambda: pybridge.all_reduce(torch.ones(5 if odd else 4)))
    out["root"] = _error(lambda: pybridge.broadcast(torch.ones(4), 1 if odd else 0))
    out["gather"] = _error(lambda: pybridge.all_gather(
        torch.ones(3 if odd else 2), torch.zeros(world * (3 if odd else 2))))
    out["kind"] = _error(lambda: pybridge.barrier() if odd else pybridge.all_reduce(torch.ones(1)))
    out["threads"] = _threads_in_opposite_orders(g, rank)
    t = torch.full((4,), float(rank))
    pybridge.all_reduce(t)  # the group is still in step after the refusals
    out["sum"] = t.tolist()
    sub = pybridge.new_group([2, 0])  # ranks within the subgroup: 0 is world rank 2
    if sub is not None:
        out["sub"] = _error(lambda: pybridge.broadcast(torch.ones(2), sub.rank, group=sub))
        sub.close()
    # point to point: rank 0 sends 4 floats, rank 1 expects 3
    if rank == 0:
        out["p2p"] = _error(lambda: pybridge.send(torch.ones(4), 1))
    elif rank == 1:
        out["p2p"] = _error(lambda: pybridge.recv(torch.ones(3), 0))
    # an exchange posted receive-first on both sides still pairs in checked mode
    if rank < 2:
        got = torch.zeros(2)
        r = pybridge.irecv(got, 1 - rank, tag=5)
        s = pybridge.isend(torch.full((2,), rank + 10.0), 1 - rank, tag=5)
        s.wait()
        r.wait()
        out["exchange"] = got.tolist()
    pybridge.finalize()
    return out


def test_checked_mode_names_the_ranks_that_differ():
    res = run_ranks(_checked_cases, 3, timeout=120)
    for rank, out in enumerate(res):
        kind, msg = out["dtype"]
        assert kind == "InvalidArgument"
        assert "all_reduce #1" in msg and "rank 1 passed all_reduce #1 (sum) int32 x 4 (dtype differs)" in msg
        assert "ranks [0, 2] passed all_reduce #1 (sum) float32 x 4; rank 1 passed" in msg
        assert "rank 1 passed all_reduce #2 (max)" in out["op"][1] and "op or root differs" in out["op"][1]
        assert "float32 x 5 (count differs)" in out["count"][1]
        assert "broadcast #4 (root 1)" in out["root"][1]
        assert "rank 1 passed all_gather #5 float32 x 3 into 9 (count, output count differs)" in out["gather"][1]
        assert "rank 1 passed barrier #6 (operation, dtype, count, op or root differs)" in out["kind"][1]
        assert out["sum"] == [3.0] * 4
        # the finding: goroutines calling at once hung every rank in checked mode
        for n, (kind, msg) in out["threads"].items():
            seq = 7 if n == (2 if rank == 0 else 3) else 8
            assert kind == "InvalidArgument" and f"ranks disagree on all_reduce #{seq} on the world group" in msg, msg
        assert "rank 0 passed all_reduce #7 (sum) float32 x 2 (count differs); ranks [1, 2] passed all_reduce #7 (sum) float32 x 3" \
            in res[0]["threads"][2][1]
    for rank in (0, 2):  # each names itself root: the subgroup's ranks 0 and 1 differ
        kind, msg = res[rank]["sub"]
        assert kind == "InvalidArgument" and "ranks disagree on broadcast #1 on group w.1-2_0:" in msg
        assert ("rank 0 passed broadcast #1 (root 0) float32 x 2; "
                "rank 1 passed broadcast #1 (root 1) float32 x 2 (op or root differs)") in msg
    for rank in (0, 1):
        kind, msg = res[rank]["p2p"]
        assert kind == "InvalidArgument"
        assert "rank 0 sends float32 x 4, rank 1 receives float32 x 3" in msg
        assert res[rank]["exchange"] == [11.0 - rank] * 2


def _unchecked_mismatches(rank, world):
    pybridge.init(backend="gloo", timeout=30)
    out = {}
    out["params"] = _error(lambda: pybridge.broadcast_parameters(
        [torch.ones(3), torch.ones(2, dtype=torch.float64 if rank == 1 else torch.float32)]))
    out["count"] = _error(lambda: pybridge.broadcast_parameters([torch.ones(3)] * (1 + rank)))
    t = torch.ones(2)
    pybridge.broadcast_parameters([t, torch.ones(3)], root=0)
    out["ok"] = t.tolist()
    pybridge.finalize()
    return out


def test_broadcast_parameters_refuses_different_tensors_on_every_rank():
    res = run_ranks(_unchecked_mismatches, 2, timeout=90)
    for out in res:
        assert out["params"][0] == "InvalidArgument"
        assert "rank 0 pass 2 tensors (root 0); rank 1 pass 2 tensors (root 0) (dtypes and counts differs)" \
            in out["params"][1]
        assert "rank 0 pass 1 tensors (root 0); rank 1 pass 2 tensors" in out["count"][1]
        assert out["ok"] == [1.0, 1.0]


def _init_with(rank, world, sizes, checked):
    return _error(lambda: pybridge.init(backend="gloo", timeout=20, world_size=sizes[rank],
                                        checked=checked[rank]))


@pytest.mark.parametrize("sizes", [(2, 3), (3, 2)])
def test_ranks_disagreeing_on_world_size_all_fail(sizes):
    res = run_ranks(_init_with, 2, sizes, (False, False), timeout=60)
    for out in res:
        assert out is not None and out[0] == "InvalidArgument", res
        assert "ranks disagree on the world size: rank 0 world size" in out[1]


def test_ranks_disagreeing_on_checked_mode_all_fail():
    res = run_ranks(_init_with, 2, (2, 2), (True, False), timeout=60)
    for out in res:
        assert out[0] == "InvalidArgument" and "rank 0 checked mode on; rank 1 checked mode off" in out[1]


def _join_alone(rank, world):
    return _error(lambda: pybridge.init(backend="gloo", timeout=3))


def test_a_rank_that_never_joins_is_named():
    res = run_ranks(_join_alone, 3, only=(0, 1), timeout=60)
    for rank in (0, 1):
        kind, msg = res[rank]
        assert kind == "Timeout" and "ranks [2] never joined within 3 s (world size 3)" in msg
        assert f"rank {1 - rank} (host " in msg and "pid" in msg


def _late_rank(rank, world):
    sys.stderr = captured = io.StringIO()  # the watchdog reports to stderr
    pybridge.init(backend="gloo", timeout=30, watchdog=1)
    pybridge.all_reduce(torch.ones(1))
    if rank == 2:
        time.sleep(4)  # rank 2 is late for all_reduce #2
    pybridge.all_reduce(torch.ones(1))
    pybridge.finalize()
    return captured.getvalue()


def test_watchdog_reports_the_ranks_that_have_not_reached_a_collective():
    res = run_ranks(_late_rank, 3, timeout=90)
    for rank in (0, 1):
        text = res[rank]
        assert "pybridge watchdog on rank" in text and "all_reduce #2 (4 bytes) on the world group" in text
        assert "ranks [2] never started all_reduce #2 (last started: rank 2 at #1)" in text
        assert "started all_reduce #2 but have not finished" in text
    assert "watchdog" not in res[2]


def _dying_rank(rank, world):
    pybridge.init(backend="gloo", timeout=30)
    pybridge.all_reduce(torch.ones(1))
    if rank == 2:
        os._exit(1)
    return _error(lambda: pybridge.all_reduce(torch.ones(8)))


def test_errors_name_the_rank_that_died_and_the_operation():
    res = run_ranks(_dying_rank, 3, timeout=90, expect_fail=(2,))
    for rank in (0, 1):
        kind, msg = res[rank]
        assert kind in ("CommError", "Timeout"), res[rank]
        assert msg.startswith("all_reduce #2 (32 bytes) on the world group: ")
        assert "rank 2 (host " in msg and "did not answer (died, or stopped)" in msg


def _open_loaders(rank, world, paths):
    from pybridge import recordio as rio
    pybridge.init(backend="gloo", timeout=30)
    out = {}
    out["batch"] = _error(lambda: rio.Loader(paths, 4 + rank, partition="dynamic"))
    out["files"] = _error(lambda: rio.Loader(paths[:1 + rank], 4, partition="dynamic"))
    with rio.Loader(paths, 4, partition="dynamic") as loader:  # the same everywhere: fine
        out["records"] = sum(len(b) for b in loader)
    pybridge.finalize()
    return out


def test_dynamic_loaders_opened_differently_fail_on_every_rank(tmp_path):
    from pybridge import recordio as rio
    paths = []
    for f in range(2):
        paths.append(str(tmp_path / f"d{f}.recordio"))
        rio.write_file(paths[-1], [bytes([f, i]) for i in range(10)], "none", 4)
    res = run_ranks(_open_loaders, 2, paths, timeout=90)
    for out in res:
        assert out["batch"][0] == "InvalidArgument"
        assert "dynamic loader open: ranks disagree: rank 0 opened 2 files, 20 records, batch 4" in out["batch"][1]
        assert "rank 1 opened 2 files, 20 records, batch 5, " in out["batch"][1]
        assert "(batch differs)" in out["batch"][1]
        assert "rank 0 opened 1 files, 10 records" in out["files"][1]
        assert "(files, records, data differs)" in out["files"][1]
    assert res[0]["records"] + res[1]["records"] == 20


def test_settings_from_the_environment(monkeypatch):
    from pybridge.comm import watchdog
    from pybridge.comm import world as group
    monkeypatch.setenv("PYBRIDGE_CHECKED", "1")
    assert group._checked_setting(None) is True and group._checked_setting(False) is False
    monkeypatch.setenv("PYBRIDGE_CHECKED", "maybe")
    with pytest.raises(pybridge.InvalidArgument, match="PYBRIDGE_CHECKED"):
        group._checked_setting(None)
    monkeypatch.delenv("PYBRIDGE_WATCHDOG", raising=False)
    assert watchdog.threshold(None, 300) == 60 and watchdog.threshold(None, 10) == 5
    monkeypatch.setenv("PYBRIDGE_WATCHDOG", "off")
    assert watchdog.threshold(None, 300) == 0 and watchdog.threshold(7, 300) == 7
    monkeypatch.setenv("PYBRIDGE_WATCHDOG", "-3")
    with pytest.raises(pybridge.InvalidArgument, match="PYBRIDGE_WATCHDOG"):
        watchdog.threshold(None, 300)
    assert watchdog.threshold(False, 300) == 0
    with pytest.raises(pybridge.InvalidArgument, match="watchdog"):
        watchdog.threshold(float("inf"), 300)


def _reducer_peer_dies(rank, world):
    pybridge.init(backend="gloo", timeout=30)
    red = pybridge.Reducer([(64, "float32")] * 2)
    for step in range(2):
        if rank == 2 and step == 1:
            os._exit(1)
        for i in range(2):
            red.mark_ready(i)
        try:
            red.finalize()
        except pybridge.PyBridgeError as exc:
            return type(exc).__name__, str(exc)
    return None


def test_reducer_errors_name_the_rank_that_died():
    res = run_ranks(_reducer_peer_dies, 3, timeout=90, expect_fail=(2,))
    for rank in (0, 1):
        kind, msg = res[rank]
        assert kind in ("CommError", "Timeout"), res[rank]
        assert msg.startswith("bucket 0 (2 gradients) (the latest collective on the world group is #")
        assert "rank 2 (host " in msg and "did not answer (died, or stopped)" in msg
