"""`pybridge report DIR` (pybridge/observe/report.py, charts.py, cli.py) over synthetic runs.

No process is launched: `write_run` writes per-rank trace files in the recorder's format
(Chrome trace JSON with the pybridge header) for a run whose every figure is known, each
rank on its own clock (merge puts them on rank 0's). One rank can be made slow in data or
in compute; the tests check the tables' figures against the numbers put in, the straggler
and its cause, bandwidth as nccl-tests defines it, the command's output and files, its
errors, and (when Chromium is there) that report.html renders.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from pybridge.errors import InvalidArgument
from pybridge.observe import bandwidth, cli, report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DATA_US, COMPUTE_US, COMM_US = 1000.0, 6000.0, 1000.0  # an even rank's step: data, compute, then all_reduce
BUCKET_BYTES = 3_000_000  # one bucket per step, all-reduced: size class 4 MiB
RECORDS = 32  # records per step
HIDDEN = (0.2, 0.3)  # hidden_share alternates: mean 0.25
OFFSETS = (0.0, 2_500_000.0, -1_250_000.0, 7_000.5)  # each rank's clock minus rank 0's (µs)
T0 = 10_000_000.0  # the run's first step, on rank 0's clock
# broadcast and all_gather calls of known sizes and durations (µs), after the steps, on every rank
EXTRA = [("broadcast", 1000, 10.0), ("broadcast", 1000, 10.0), ("broadcast", 1024, 16.0), ("broadcast", 1025, 20.0),
         ("all_gather", 3000, 20.0), ("all_gather", 3000, 30.0), ("barrier", 0, 50.0)]


def _rank_work(rank, step, slow, kind, extra_us, slow_from):
    data, compute = DATA_US, COMPUTE_US
    if rank == slow and step >= slow_from:
        if kind == "data":
            data += extra_us
        else:
            compute += extra_us
    return data, compute


def write_run(directory, ranks=4, steps=40, slow=None, kind="data", extra_us=4000.0, slow_from=1, jitter_us=30.0):
    """Write rank<R>.trace.json for `ranks` ranks and `steps` steps into `directory`; rank
    `slow` spends `extra_us` more per step on `kind` ("data" or "compute") from step
    `slow_from` on. Without a slow rank, a different rank issues each collective last, by
    `jitter_us`. Returns what was put in: {rank: [per-step dicts]} and the collectives."""
    os.makedirs(directory, exist_ok=True)
    events = {r: [] for r in range(ranks)}
    put = {r: [] for r in range(ranks)}
    t = T0
    seq = 0

    def local(r, ts):  # rank r's clock
        return ts + OFFSETS[r % len(OFFSETS)]

    for s in range(1, steps + 1):
        work = {r: _rank_work(r, s, slow, kind, extra_us, slow_from) for r in range(ranks)}
        late = {r: (jitter_us if slow is None and r == s % ranks else 0.0) for r in range(ranks)}
        issue = {r: t + work[r][0] + work[r][1] + late[r] for r in range(ranks)}
        done = max(issue.values()) + COMM_US
        step_us = done - t
        seq += 1
        for r in range(ranks):
            data, compute_span = work[r]
            exposed = done - issue[r]
            compute = step_us - data - exposed  # the recorder's rule
            hidden = HIDDEN[s % 2]
            args = {"step": s, "step_us": step_us, "data_us": data, "compute_us": compute,
                    "exposed_comm_us": exposed, "comm_us": COMM_US, "forward_us": compute_span / 3,
                    "backward_us": compute_span / 2, "buckets": 1, "bucket_bytes": BUCKET_BYTES,
                    "records": RECORDS, "hidden_share": hidden}
            put[r].append(dict(args))
            ev = events[r]
            ev.append({"ph": "X", "name": "step", "cat": "step", "pid": r, "tid": 2, "ts": local(r, t),
                       "dur": step_us, "args": args})
            ev.append({"ph": "X", "name": "loader.next", "cat": "data", "pid": r, "tid": 1, "ts": local(r, t),
                       "dur": data, "args": {"records": RECORDS}})
            ev.append({"ph": "X", "name": "forward", "cat": "forward", "pid": r, "tid": 1,
                       "ts": local(r, t + data), "dur": compute_span / 3})
            ev.append({"ph": "X", "name": "backward (grads ready)", "cat": "compute", "pid": r, "tid": 4,
                       "ts": local(r, t + data + compute_span / 2), "dur": compute_span / 2})
            ev.append({"ph": "X", "name": "reducer.wait", "cat": "comm", "pid": r, "tid": 1,
                       "ts": local(r, issue[r]), "dur": exposed})
            ev.append({"ph": "X", "name": "bucket 0", "cat": "comm", "pid": r, "tid": 3, "ts": local(r, issue[r]),
                       "dur": done - issue[r], "args": {"bucket": 0, "bytes": BUCKET_BYTES, "hook": "allreduce_hook",
                                                        "launched_us": local(r, issue[r])}})
            ev.append({"ph": "X", "name": "all_reduce", "cat": "comm", "pid": r, "tid": 10, "ts": local(r, issue[r]),
                       "dur": done - issue[r], "args": {"group": "w", "seq": seq, "bytes": BUCKET_BYTES,
                                                        "ranks": ranks, "issued_us": local(r, issue[r]),
                                                        "sync": False}})
            ev.append({"ph": "C", "name": "loss", "cat": "scalar", "pid": r, "tid": 1, "ts": local(r, done),
                       "args": {"loss": 1.0 / s}})
        t = done
    colls = []
    for op, nbytes, dur in EXTRA:
        seq += 1
        for r in range(ranks):
            args = {"group": "w", "seq": seq, "bytes": nbytes, "ranks": ranks, "issued_us": local(r, t),
                    "sync": True}
            events[r].append({"ph": "X", "name": op, "cat": "comm", "pid": r, "tid": 10, "ts": local(r, t),
                              "dur": dur, "args": args})
            colls.append((op, nbytes, dur))
        t += 100.0
    for r in range(ranks):
        header = {"format": 1, "rank": r, "world_size": ranks, "local_rank": r, "host": "node0", "pid": 100 + r,
                  "clock": "CLOCK_MONOTONIC, microseconds", "clock_offset_us": OFFSETS[r % len(OFFSETS)],
                  "clock_uncertainty_us": 12.0, "clock_synced": True, "monotonic_at_wall_us": [0.0, 0.0],
                  "steps": steps}
        meta = [{"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}}]
        with open(os.path.join(directory, f"rank{r}.trace.json"), "w") as f:
            json.dump({"traceEvents": meta + events[r], "displayTimeUnit": "ms", "otherData": {"pybridge": header}}, f)
    return put, colls


def _mean(xs):
    return sum(xs) / len(xs)


# ---- the figures ------------------------------------------------------------------------------

def test_per_rank_figures_are_the_numbers_put_in(tmp_path):
    put, _ = write_run(tmp_path, slow=2, kind="data", extra_us=4000.0)
    rep = report.analyze(str(tmp_path))
    assert os.path.isfile(tmp_path / "trace.json"), "the report merges a run that was not merged"
    assert rep["ranks"] == [0, 1, 2, 3] and rep["world_size"] == 4 and rep["hosts"] == ["node0"]
    for row in rep["per_rank"]:
        mine = put[row["rank"]]
        step = _mean([s["step_us"] for s in mine]) / 1e3
        assert row["steps"] == 40
        assert row["step_ms"] == pytest.approx(step)
        assert row["step_ms"] == pytest.approx((DATA_US + 4000 + COMPUTE_US + COMM_US) / 1e3)  # everyone waits for 2
        for key, field in (("compute", "compute_us"), ("exposed_comm", "exposed_comm_us"), ("data", "data_us")):
            ms = _mean([s[field] for s in mine]) / 1e3
            assert row[f"{key}_ms"] == pytest.approx(ms)
            assert row[f"{key}_pct"] == pytest.approx(100 * ms / step)
        assert row["compute_pct"] + row["exposed_comm_pct"] + row["data_pct"] == pytest.approx(100.0)
        assert row["hidden_share"] == pytest.approx(_mean(HIDDEN))
        assert row["records_per_s"] == pytest.approx(RECORDS / (step / 1e3))
    slow = rep["per_rank"][2]
    assert slow["data_ms"] == pytest.approx(5.0) and slow["exposed_comm_ms"] == pytest.approx(COMM_US / 1e3)
    even = rep["per_rank"][0]
    assert even["data_ms"] == pytest.approx(1.0) and even["exposed_comm_ms"] == pytest.approx(5.0)
    assert even["compute_ms"] == pytest.approx(6.0) == slow["compute_ms"]
    text = report.text(rep)
    assert "Step time per rank" in text and " 12.00 " in text and "25%" in text  # step ms, hidden share


def test_bandwidth_per_size_class_as_nccl_tests(tmp_path):
    put, colls = write_run(tmp_path, jitter_us=0.0)
    rep = report.analyze(str(tmp_path))
    rows = {(x["op"], x["size_class"]): x for x in rep["bandwidth"]}
    n = 4
    # broadcast: 2 x 1000 B in 10 µs and 1024 B in 16 µs are class 1024; 1025 B is class 2048; factor 1
    b = rows[("broadcast", 1024)]
    assert b["calls"] == 3 * n and b["bytes"] == (1000 + 1000 + 1024) * n
    assert b["busbw_GBps"] == pytest.approx((1000 + 1000 + 1024) / (10 + 10 + 16) * 1e6 / 1e9)
    assert rows[("broadcast", 2048)]["busbw_GBps"] == pytest.approx(1025 / 20 * 1e6 / 1e9)
    # all_gather: 3000 B in 20 and 30 µs, class 4096, busbw = algbw x (n-1)/n
    g = rows[("all_gather", 4096)]
    assert g["algbw_GBps"] == pytest.approx(6000 / 50 * 1e6 / 1e9)
    assert g["busbw_GBps"] == pytest.approx(6000 / 50 * 1e6 / 1e9 * (n - 1) / n)
    # all_reduce: every rank's bucket from its issue to the common end; busbw = algbw x 2(n-1)/n
    a = rows[("all_reduce", bandwidth.size_bin(BUCKET_BYTES))]
    assert a["size_class"] == 4 << 20 and a["calls"] == 40 * n
    secs = 40 * n * COMM_US / 1e6  # nobody late: every rank's call takes the communication time
    assert a["algbw_GBps"] == pytest.approx(BUCKET_BYTES * 40 * n / secs / 1e9)
    assert a["busbw_GBps"] == pytest.approx(a["algbw_GBps"] * 2 * (n - 1) / n)
    assert not [x for x in rep["bandwidth"] if x["op"] == "barrier"], "a barrier moves no payload"
    (bucket,) = rep["buckets"]
    assert bucket["bytes"] == BUCKET_BYTES and bucket["count"] == 40 * n and bucket["hook"] == "allreduce_hook"
    assert bucket["mean_ms"] == pytest.approx(COMM_US / 1e3)
    assert bucket["busbw_GBps"] == pytest.approx(BUCKET_BYTES / (COMM_US / 1e6) / 1e9 * 1.5)
    text = report.text(rep)
    assert "1 KiB" in text and "2 KiB" in text and "4 MiB" in text and "2.9 MiB" in text


@pytest.mark.parametrize("kind,slow,extra,cause,words", [
    ("data", 3, 4300.0, "data", "waiting for data"),
    ("compute", 1, 2500.0, "compute", "computing"),
])
def test_the_slow_rank_and_its_cause(tmp_path, kind, slow, extra, cause, words):
    write_run(tmp_path, slow=slow, kind=kind, extra_us=extra)
    rep = report.analyze(str(tmp_path))
    v = rep["verdict"]
    assert v["straggler"] == slow and v["cause"] == cause, v
    assert v["excess_ms"][cause] == pytest.approx(extra / 1e3)
    other = "compute" if cause == "data" else "data"
    assert v["excess_ms"][other] == pytest.approx(0.0, abs=1e-9)
    assert v["excess_ms"]["communication"] == pytest.approx(-extra / 1e3)  # the others wait for it
    st = {x["rank"]: x for x in rep["stragglers"]["per_rank"]}
    assert rep["stragglers"]["collectives"] == 40 + len(EXTRA)
    assert st[slow]["last"] == 40 and st[slow]["last_share"] == pytest.approx(40 / (40 + len(EXTRA)))
    assert sum(x["last"] for x in st.values()) == 40, "a collective all ranks issued at once has no last rank"
    assert st[slow]["lateness_mean_ms"] == pytest.approx(extra / 1e3)
    assert st[slow]["lateness_total_ms"] == pytest.approx(extra / 1e3 * 40)
    assert st[slow]["relative_score_latest"] == pytest.approx(7.0 / (7.0 + extra / 1e3))
    assert all(st[r]["relative_score_latest"] == pytest.approx(1.0) for r in st if r != slow)
    assert v["text"].startswith(f"rank {slow} is the straggler")
    assert f"{extra / 1e3:.1f} ms more per step {words} than the other ranks (median)" in v["text"]
    assert f"Verdict: {v['text']}" in report.text(rep)


def test_an_even_run_has_no_straggler(tmp_path):
    write_run(tmp_path, jitter_us=30.0)
    rep = report.analyze(str(tmp_path))
    assert rep["verdict"]["straggler"] is None and rep["verdict"]["cause"] is None
    assert rep["verdict"]["text"].startswith("no straggler")
    assert all(x["relative_score_min"] == pytest.approx(1.0) for x in rep["stragglers"]["per_rank"])


def test_a_small_lateness_is_no_straggler(tmp_path):
    # rank 1 is last every time, but by 0.3 ms of an 8 ms step: below max(1 ms, 10%)
    write_run(tmp_path, slow=1, kind="compute", extra_us=300.0)
    rep = report.analyze(str(tmp_path))
    assert rep["verdict"]["straggler"] is None
    assert "below the 1.00 ms that matters" in rep["verdict"]["text"]


def test_scores_over_windows(tmp_path):
    # rank 2 becomes slow in data from step 21: its first window is even, its latest is not
    write_run(tmp_path, slow=2, kind="data", extra_us=4000.0, slow_from=21, steps=45)
    rep = report.analyze(str(tmp_path), window=20)
    wins = rep["stragglers"]["windows"]
    assert [w["steps"] for w in wins] == [[1, 20], [21, 45]]  # the 5-step tail joins the window before
    st = {x["rank"]: x for x in rep["stragglers"]["per_rank"]}
    assert st[2]["relative_score_latest"] == pytest.approx(7 / 11)
    assert st[2]["relative_score_min"] == pytest.approx(7 / 11)
    assert st[2]["individual_score"] == pytest.approx(7 / 11)
    assert st[0]["individual_score"] == pytest.approx(1.0) and st[0]["relative_score_latest"] == pytest.approx(1.0)
    skipped = report.analyze(str(tmp_path), window=20, skip=20)
    assert [x["steps"] for x in skipped["per_rank"]] == [25] * 4
    assert skipped["per_rank"][2]["data_ms"] == pytest.approx(5.0)


def test_a_slow_first_step_is_pointed_out(tmp_path):
    write_run(tmp_path, jitter_us=0.0)
    for r in range(4):
        path = tmp_path / f"rank{r}.trace.json"
        data = json.loads(path.read_text())
        for e in data["traceEvents"]:
            if e["name"] == "step" and e["args"]["step"] == 1:
                e["dur"] = e["args"]["step_us"] = 500_000.0
        path.write_text(json.dumps(data))
    text = report.text(report.analyze(str(tmp_path)))
    assert "step 1 of rank" in text and "--skip-steps 1" in text


# ---- the command ------------------------------------------------------------------------------

def test_cli_report_prints_tables_and_writes_files(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    write_run(run, slow=3, kind="data", extra_us=4300.0)
    assert cli.main(["report", str(run), "--link-gbps", "12.5", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    for words in ("Step time per rank", "Collective bandwidth per message size", "Reducer buckets per size",
                  "Stragglers", "Verdict: rank 3 is the straggler",
                  "4.3 ms more per step waiting for data than the other ranks (median)"):
        assert words in out
    dest = run / "report"
    names = ["report.json", "report.html"] + [f"{c}.{x}" for c in ("timeline", "breakdown", "bandwidth")
                                              for x in ("png", "svg")]
    for name in names:
        path = dest / name
        assert path.is_file() and path.stat().st_size > 0, name
        assert str(path) in out, f"the command does not print {path}"
    for c in ("timeline", "breakdown", "bandwidth"):
        assert (dest / f"{c}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in (dest / f"{c}.svg").read_bytes()[:2000]
    page = (dest / "report.html").read_text()
    assert page.count("data:image/svg+xml;base64,") == 3
    assert 'href="timeline.png"' in page and 'href="bandwidth.svg"' in page
    assert "rank 3 is the straggler" in page and "<table>" in page
    saved = json.loads((dest / "report.json").read_text())
    assert saved["verdict"]["straggler"] == 3 and saved["verdict"]["cause"] == "data"
    assert len(saved["per_rank"]) == 4 and saved["bandwidth"]


def test_cli_json_no_charts_and_out(tmp_path, capsys):
    write_run(tmp_path / "run", jitter_us=30.0)
    out_dir = tmp_path / "elsewhere"
    assert cli.main(["report", str(tmp_path / "run"), "--no-charts", "--json", "--out", str(out_dir)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["verdict"]["straggler"] is None
    assert sorted(os.listdir(out_dir)) == ["report.html", "report.json"]
    assert "data:image/svg" not in (out_dir / "report.html").read_text()


def test_cli_merge(tmp_path, capsys):
    write_run(tmp_path)
    assert cli.main(["merge", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"trace: {tmp_path / 'trace.json'} (4 ranks,")
    merged = json.loads((tmp_path / "trace.json").read_text())
    pids = {e["pid"] for e in merged["traceEvents"]}
    assert pids == {0, 1, 2, 3}
    # every rank's first step starts at the same moment once on rank 0's clock
    starts = {e["pid"]: e["ts"] for e in merged["traceEvents"] if e["name"] == "step" and e["args"]["step"] == 1}
    assert len(set(starts.values())) == 1


def test_report_remerges_when_a_rank_file_is_newer(tmp_path):
    write_run(tmp_path, jitter_us=30.0)
    assert report.analyze(str(tmp_path))["verdict"]["straggler"] is None
    write_run(tmp_path, slow=0, kind="compute", extra_us=3000.0)
    merged = tmp_path / "trace.json"
    os.utime(merged, (1, 1))  # older than the rank files just written
    assert report.analyze(str(tmp_path))["verdict"]["straggler"] == 0


def _fails(argv, capsys, *words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith(f"pybridge {argv[0]}: error: ")
    for w in words:
        assert w in err, err
    return err


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    _fails(["report", str(tmp_path / "nope")], capsys, "no such directory")
    _fails(["report", str(tmp_path), "--no-charts"], capsys, "no trace files")
    _fails(["merge", str(tmp_path)], capsys, "no trace files")
    bad = tmp_path / "bad"
    write_run(bad)
    (bad / "rank2.trace.json").write_text('{"traceEvents": [{"ph": "X", "na')  # cut short by a crash
    _fails(["report", str(bad), "--no-charts"], capsys, "rank2.trace.json", "not JSON")
    worse = tmp_path / "worse"
    write_run(worse)
    (worse / "rank1.trace.json").write_text(json.dumps({"traceEvents": [], "otherData": {}}))
    _fails(["report", str(worse), "--no-charts"], capsys, "rank1.trace.json", "not a pybridge trace file")
    odd = tmp_path / "odd"
    write_run(odd)
    data = json.loads((odd / "rank3.trace.json").read_text())
    for e in data["traceEvents"]:
        if e["name"] == "step":
            e["args"]["step_us"] = "soon"
    (odd / "rank3.trace.json").write_text(json.dumps(data))
    _fails(["report", str(odd), "--no-charts"], capsys, "corrupt", "step_us")
    with pytest.raises(InvalidArgument, match="window"):
        report.analyze(str(odd), window=0)


def test_charts_without_matplotlib_say_so(tmp_path, capsys, monkeypatch):
    write_run(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    _fails(["report", str(tmp_path)], capsys, "matplotlib", "--no-charts")
    assert cli.main(["report", str(tmp_path), "--no-charts"]) == 0


def test_python_dash_m_and_no_torch_or_matplotlib_at_start(tmp_path):
    code = ("import sys, runpy; sys.argv = ['pybridge', 'report', sys.argv[1]]; "
            "import pybridge.observe.cli, pybridge.observe.report, pybridge.observe.charts; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'matplotlib')); "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)
    out = subprocess.run([sys.executable, "-m", "pybridge.observe", "report", str(tmp_path / "missing")], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no such directory" in out.stderr and out.stderr.count("\n") == 1


# ---- the page in a browser ----------------------------------------------------------------------

def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _png_colors(path):
    """(width, height, distinct colors) of a PNG screenshot."""
    import numpy as np
    from matplotlib import image
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pixels = (image.imread(path)[:, :, :3] * 255).round().astype(np.uint32)
    packed = (pixels[:, :, 0] << 16) | (pixels[:, :, 1] << 8) | pixels[:, :, 2]
    return pixels.shape[1], pixels.shape[0], np.unique(packed)


def test_report_html_renders_in_chromium(tmp_path, capsys):
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium binary (chromium, chromium-browser, google-chrome) on PATH: "
                    "apt-get install -y chromium to run this test")
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "run", slow=3, kind="data", extra_us=4300.0)
    assert cli.main(["report", str(tmp_path / "run"), "--link-gbps", "12.5"]) == 0
    capsys.readouterr()
    shot = tmp_path / "shot.png"
    page = tmp_path / "run" / "report" / "report.html"
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                          "--window-size=1400,2000", page.as_uri()], capture_output=True, text=True, timeout=90)
    assert shot.is_file(), f"no screenshot (exit {out.returncode}): {out.stderr[-2000:]}"
    width, height, colors = _png_colors(shot)
    assert (width, height) == (1400, 2000)
    assert len(colors) > 200, f"the page looks blank: {len(colors)} distinct colors"
    keep = os.environ.get("PYBRIDGE_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
