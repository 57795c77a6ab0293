"""bench/charts.py draws every committed benchmark result (the charts docs/benchmarks.md shows)."""

import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)
import charts  # noqa: E402

pytest.importorskip("matplotlib")


@pytest.mark.parametrize("name,words", [
    ("collectives", ["allreduce, 2 ranks", "pybridge-go", "message size"]),
    ("reducer", ["torch ddp", "ms per training step"]),
    ("recordio", ["plain read", "pybridge loader", "compressor snappy"]),
    ("mnist", ["test accuracy", "go, 2 ranks"]),
    ("gossip", ["gossip, cube", "MiB sent per rank per step", "8 ranks, (b)"]),
    ("gossip-mnist", ["gossip-cube, sync every 4", "allreduce", "test accuracy"]),
    ("hierarchical", ["hierarchical, fp16 wire", "MiB over node links", "4 ranks, (b)"]),
    ("federated", ["federated rounds", "seconds per round", "async"]),
    ("federated-modes", ["time to target accuracy by server mode", "fedbuff", "workers long tail"]),
    ("federated-strategies", ["federated server aggregation", "FedAdam", "baseline"]),
    ("scaling", ["speedup in time to target vs 1 node", "8 nodes at 100 Mbit/s, against bytes", "diloco"]),
])
def test_each_result_draws_its_chart(tmp_path, monkeypatch, name, words):
    with open(os.path.join(charts.RESULTS, f"{name}.json")) as f:
        data = json.load(f)
    monkeypatch.setattr(charts, "RESULTS", str(tmp_path))
    path = charts.draw(name, data)
    assert path == str(tmp_path / f"{name}.svg")
    svg = open(path).read()
    assert svg.startswith("<?xml") and "<svg" in svg
    for w in words:
        assert f"<!-- {w}" in svg or w in svg, w  # matplotlib keeps each text as a comment


def test_unknown_benchmark_draws_nothing():
    assert charts.draw("nonesuch", {}) is None
