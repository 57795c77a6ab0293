"""Observability (docs/observability.md) from Python ranks: the trace files' schema and
nesting, counts equal to what ran (steps, buckets x steps, every collective by sequence
number, the loader's batches), the program's spans and scalars, metrics as JSON lines,
TensorBoard files read by TensorBoard's own reader, the Prometheus endpoint scraped over
HTTP, each rank's clock measured against rank 0's (one rank's clock skewed by 5 s on
purpose), hang dumps that torch's Flight Recorder analyzer reads, and nothing at all when
recording is off."""

import json
import os
import subprocess
import sys
import time

import pytest

from ranks import run_ranks

STEPS = 12
BATCH = 4
SKEW_US = 5_000_000.0  # rank 1's clock runs 5 s ahead of rank 0's in the traced world
SIZES = (3000, 1000, 500)  # three parameters: several buckets at a 5 KB cap


def _shard(path, n):
    from pybridge import recordio as rio
    with rio.Writer(path) as w:
        for i in range(n):
            w.write(i.to_bytes(4, "little") * 8)


def _traced(rank, world, out, shard):
    import urllib.request

    import torch

    import pybridge
    from pybridge import observe
    from pybridge import recordio as rio
    from pybridge.observe import clock
    if rank == 1:  # a clock far from rank 0's: the merge must put it right
        real = clock.now_us
        clock.now_us = lambda: real() + SKEW_US
    observe.start(out, metrics_port=0, every=5)
    g = pybridge.init(timeout=30)
    params = [torch.zeros(n) for n in SIZES]
    r = pybridge.Reducer(params, bucket_cap_mb=0.005, first_bucket_cap_mb=0.005)
    loader = rio.Loader([shard], BATCH, prefetch=0)
    for step in range(STEPS):
        batch = loader.next_batch()
        assert batch is not None
        with observe.span("forward", "forward", step=step):
            time.sleep(0.001)
        for i in reversed(range(len(SIZES))):
            r.set_grad(i, torch.full((SIZES[i],), float(rank + 1)))
        r.wait()
        observe.scalar("loss", 1.0 / (step + 1))
    observe.instant("done training")
    pybridge.all_reduce(torch.ones(4))  # synchronous, outside the reducer
    assert torch.equal(r.grad(0), torch.full((SIZES[0],), 1.5))  # the reduction still reduces
    ports = torch.zeros(world, dtype=torch.int64)
    mine = torch.tensor([observe.state.REC.metrics_address[1]], dtype=torch.int64)
    pybridge.all_gather(mine, ports)
    other = int(ports[(rank + 1) % world])
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{other}/metrics", timeout=20).read().decode()
    pybridge.barrier()  # both scraped before either endpoint closes
    issued, buckets = g.issued, r.num_buckets
    loader.close()
    pybridge.finalize()
    observe.stop()
    return {"issued": issued, "buckets": buckets, "scraped": scraped}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    base = tmp_path_factory.mktemp("traced")
    shard = str(base / "data.rio")
    _shard(shard, 2 * STEPS * BATCH)
    out = str(base / "trace")
    results = run_ranks(_traced, 2, out, shard, timeout=90)
    from pybridge.observe import merge
    summary = merge.merge(out)
    files = {r: json.load(open(os.path.join(out, f"rank{r}.trace.json"))) for r in range(2)}
    return {"dir": out, "results": results, "files": files, "summary": summary,
            "merged": json.load(open(summary["path"]))}


def _events(data, **match):
    return [e for e in data["traceEvents"] if all(e.get(k) == v for k, v in match.items())]


def test_each_event_has_the_chrome_trace_fields(traced):
    for rank, data in traced["files"].items():
        assert data["otherData"]["pybridge"]["rank"] == rank
        for e in data["traceEvents"]:
            assert e["ph"] in ("X", "i", "C", "M"), e
            assert e["pid"] == rank and isinstance(e["tid"], int) and isinstance(e["name"], str)
            if e["ph"] != "M":
                assert isinstance(e["ts"], float | int) and isinstance(e["cat"], str)
            if e["ph"] == "X":
                assert e["dur"] >= 0, e
        names = {e["args"]["name"] for e in _events(data, ph="M", name="thread_name")}
        assert {"program", "steps", "buckets (reducer)", "collectives (the world group)"} <= names


def test_spans_on_the_program_track_nest(traced):
    for data in traced["files"].values():
        spans = sorted(_events(data, ph="X", tid=1), key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []
        for e in spans:
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            end = e["ts"] + e["dur"]
            assert not open_ends or end <= open_ends[-1] + 0.001, f"{e} overlaps its parent"
            open_ends.append(end)


def test_counts_equal_what_ran(traced):
    for rank, data in traced["files"].items():
        res = traced["results"][rank]
        steps = _events(data, name="step")
        assert [s["args"]["step"] for s in steps] == list(range(1, STEPS + 1))
        buckets = [e for e in data["traceEvents"] if e["name"].startswith("bucket ")]
        assert res["buckets"] >= 2 and len(buckets) == res["buckets"] * STEPS
        assert sum(e["args"]["bytes"] for e in buckets) == 4 * sum(SIZES) * STEPS
        # every numbered collective of the world, by sequence number, once
        seqs = sorted(e["args"]["seq"] for e in data["traceEvents"] if e.get("cat") == "comm" and "seq" in e.get("args", {}))
        assert seqs == list(range(1, res["issued"] + 1))
        loads = _events(data, name="loader.next")
        assert len(loads) == STEPS and sum(e["args"]["records"] for e in loads) == STEPS * BATCH
        assert [e["args"]["step"] for e in _events(data, name="forward")] == list(range(STEPS))
        assert len(_events(data, name="loss", ph="C")) == STEPS
        assert len(_events(data, name="done training", ph="i")) == 1
        assert len(_events(data, name="reducer.wait")) == STEPS


def test_a_step_splits_into_data_compute_and_communication(traced):
    for data in traced["files"].values():
        for s in _events(data, name="step"):
            a = s["args"]
            assert a["data_us"] + a["compute_us"] + a["exposed_comm_us"] == pytest.approx(a["step_us"], abs=0.01)
            assert a["forward_us"] >= 1000  # the 1 ms sleep inside the forward span
            assert a["buckets"] >= 2 and 0 <= a.get("hidden_share", 0) <= 1
            assert a["records"] == BATCH


def test_metrics_rows_and_tensorboard_read_the_same_figures(traced):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    for rank in range(2):
        rows = [json.loads(line) for line in open(os.path.join(traced["dir"], "metrics", f"rank{rank}.jsonl"))]
        assert [r["step"] for r in rows] == [5, 10, 12]  # every 5 steps, and the rest at the end
        assert rows[-1]["scalars"]["loss"] == pytest.approx(1.0 / STEPS)
        assert rows[-1]["collectives"]["all_reduce"]["count"] >= STEPS
        steps = _events(traced["files"][rank], name="step")
        assert rows[0]["step_ms"] == pytest.approx(sum(s["args"]["step_us"] for s in steps[:5]) / 5 / 1000, abs=1e-4)
        acc = EventAccumulator(os.path.join(traced["dir"], "tensorboard", f"rank{rank}"))
        acc.Reload()
        loss = acc.Scalars("loss")
        assert [e.step for e in loss] == list(range(1, STEPS + 1))  # logged after each step's wait() ended it
        assert [e.value for e in loss] == pytest.approx([1.0 / (s + 1) for s in range(STEPS)], rel=1e-6)
        step_ms = acc.Scalars("step/ms")
        assert [e.step for e in step_ms] == [5, 10, 12]
        assert [e.value for e in step_ms] == pytest.approx([r["step_ms"] for r in rows], rel=1e-5)


def test_prometheus_endpoint_is_scraped_over_http(traced):
    from prometheus_client.parser import text_string_to_metric_families
    for rank in range(2):
        text = traced["results"][(rank + 1) % 2]["scraped"]  # each rank scraped the other
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for fam in text_string_to_metric_families(text) for s in fam.samples}
        r = str(rank)
        assert samples[("pybridge_steps_total", (("rank", r),))] == STEPS
        reduces = [e for e in traced["files"][rank]["traceEvents"] if e["name"] == "all_reduce"]
        # scraped after the training and the one synchronous all_reduce, before the barrier
        assert samples[("pybridge_collectives_total", (("op", "all_reduce"), ("rank", r)))] == len(reduces)
        assert samples[("pybridge_scalar", (("name", "loss"), ("rank", r)))] == pytest.approx(1.0 / STEPS)
        assert samples[("pybridge_loader_records_total", (("rank", r),))] == STEPS * BATCH


def test_clocks_are_measured_against_rank_0_and_merged(traced):
    h0 = traced["files"][0]["otherData"]["pybridge"]
    h1 = traced["files"][1]["otherData"]["pybridge"]
    assert h0["clock_offset_us"] == 0 and h0["clock_synced"] and h1["clock_synced"]
    # the estimate is off by at most half the round trip it came from (clocksync.py)
    assert abs(h1["clock_offset_us"] - SKEW_US) <= h1["clock_uncertainty_us"] + 1.0
    assert h1["clock_uncertainty_us"] < 50_000
    summary = traced["summary"]
    spread = summary["end_spread_us"]
    # unaligned, rank 1's ends would be 5 s later than rank 0's
    assert spread is not None and spread["median"] < 20_000, summary
    merged = traced["merged"]
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}
    assert min(e["ts"] for e in merged["traceEvents"] if "ts" in e) == 0


def _quiet(rank, world):
    import torch

    import pybridge
    from pybridge import observe
    pybridge.init(timeout=30)
    assert not observe.enabled() and observe.state.REC is None
    assert observe.begin("x") == 0
    observe.end(0)
    with observe.span("y"):
        pass
    observe.scalar("loss", 1.0)
    assert observe.step() == 0 and observe.flush() is None
    pybridge.all_reduce(torch.ones(2))
    pybridge.finalize()
    return sorted(os.listdir("."))


def test_off_by_default_records_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for var in ("PYBRIDGE_TRACE", "PYBRIDGE_METRICS_PORT", "PYBRIDGE_OTEL"):
        monkeypatch.delenv(var, raising=False)
    assert run_ranks(_quiet, 1, timeout=60) == [[]]


def test_bad_settings_are_named():
    from pybridge import observe
    from pybridge.errors import InvalidArgument
    with pytest.raises(InvalidArgument, match="needs a trace directory, a metrics port or otel=True"):
        observe.start()
    with pytest.raises(InvalidArgument, match="metrics port must be 0..65535, got 70000"):
        observe.start("x", metrics_port=70000)
    with pytest.raises(InvalidArgument, match="every N steps needs N >= 1"):
        observe.start("x", every=0)


def _hung(rank, world, out):
    import torch

    import pybridge
    from pybridge import observe
    observe.start(out)
    pybridge.init(timeout=30, watchdog=0.5)
    t = torch.ones(8)
    for _ in range(3):
        pybridge.all_reduce(t)
    if rank == 2:  # late for collective #4: the others' watchdog asks, everyone dumps
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(out, "fr", "rank_0")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
    pybridge.all_reduce(t)
    pybridge.finalize()


def test_flight_recorder_analyzer_names_the_rank_that_never_joined(tmp_path):
    out = str(tmp_path / "trace")
    run_ranks(_hung, 3, out, timeout=90)
    assert sorted(os.listdir(os.path.join(out, "fr"))) == ["rank_0", "rank_1", "rank_2"]
    fr = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                         os.path.join(out, "fr"), "-p", "rank_"], capture_output=True, text=True, timeout=120)
    said = fr.stdout + fr.stderr  # the analyzer reports through logging (stderr)
    assert fr.returncode == 0, said
    assert "Not all ranks joining collective, sequence number: 4" in said, said
    assert "missing ranks: {2}" in said, said
    assert "collective: gloo:all_reduce" in said


def test_a_long_run_keeps_the_latest_steps(tmp_path):
    """keep_steps: the trace holds the events of the latest steps only (at most twice as many
    between cuts), the header says how many were dropped; the metrics count every step."""
    from pybridge.observe.recorder import Recorder
    rec = Recorder(str(tmp_path), rank=0, world_size=1, keep_steps=5)
    held = []
    for step in range(1, 101):
        sid = rec.begin("work", "compute", {"step": step})
        rec.end(sid)
        rec.end_step(True)
        held.append(len(rec.events))
    assert max(held) <= 2 * 5 * 2  # two events a step (the span and the step), at most 2 x keep_steps steps
    doc = json.load(open(rec.flush()))
    header = doc["otherData"]["pybridge"]
    steps = [e["args"]["step"] for e in doc["traceEvents"] if e.get("name") == "step"]
    assert steps == list(range(101 - len(steps), 101)) and 5 <= len(steps) <= 10
    assert header["steps"] == 100 and header["dropped_steps"] == 100 - len(steps)
    spans = [e["args"]["step"] for e in doc["traceEvents"] if e.get("name") == "work"]
    assert spans == steps  # each kept step's own events are kept with it
    assert rec.metrics.steps == 100
    rec.close()


def test_keep_steps_is_checked(monkeypatch):
    from pybridge import observe
    from pybridge.errors import InvalidArgument
    with pytest.raises(InvalidArgument, match=r"steps a trace keeps must be >= 0 \(0: all\), got -1"):
        observe.start("x", keep_steps=-1)
    monkeypatch.setenv("PYBRIDGE_TRACE", "x")
    monkeypatch.setenv("PYBRIDGE_TRACE_STEPS", "many")
    with pytest.raises(InvalidArgument, match="PYBRIDGE_TRACE_STEPS='many': expected an integer"):
        observe._settings_from_env()
