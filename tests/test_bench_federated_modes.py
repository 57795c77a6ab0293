"""bench/federated_modes.py's quick preset as a smoke test: every (speed profile, mode)
federation runs on the same 4 ranks and the table reports each; FedBuff stepped the model
more often than the rounds did."""

import os
import sys

from ranks import run_ranks

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.join(os.path.dirname(BENCH), "examples", "mnist"))
import federated_modes as bench  # noqa: E402


def _ranks(rank, world, data, out_dir):
    bench.ranks(data, bench.QUICK, out_dir)


def test_the_quick_preset_runs_every_mode_and_reports_it(tmp_path, capsys):
    import prepare
    data = str(tmp_path / "mnist")
    assert prepare.main(["--out", data, "--synthetic", "--train-count", str(bench.QUICK["train"]),
                         "--test-count", str(bench.QUICK["test"]), "--seed", "0"]) == 0
    run_ranks(_ranks, bench.WORLD, data, str(tmp_path), timeout=120)
    runs = bench.results(str(tmp_path), bench.QUICK)
    assert [(r["profile"], r["mode"]) for r in runs] == bench.plan() and len(runs) == 6
    text = bench.report(runs, bench.QUICK)
    for words in ("sync waves", "per-round async", "fedbuff", "long tail", "1x, 1x, 4x", "time to target"):
        assert words in text
    for r in runs:
        assert 1 <= len(r["rounds"]) <= bench.QUICK["rounds"] and all(0 <= x["test_accuracy"] <= 1 for x in r["rounds"])
        if r["mode"] == "fedbuff":  # a step every 3 results, not one per round of 10
            assert r["model_steps"] > len(r["rounds"]) + 1
        else:
            assert r["model_steps"] == len(r["rounds"])
