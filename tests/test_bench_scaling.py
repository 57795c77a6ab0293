"""bench/scaling.py without a cluster: its argument handling, the speedup, efficiency and
bytes-a-sample arithmetic, merging runs, and the standard-library text set the LM trains on."""

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)
import scaling  # noqa: E402
import scaling_rank  # noqa: E402


def test_defaults_are_the_whole_grid():
    a = scaling.parse_args([])
    assert (a.models, a.nodes, a.rates, a.methods) == (["mlp", "lm"], [1, 2, 4, 8], [10000, 1000, 100],
                                                       scaling.METHODS)
    assert a.cpus == 0.2 and not a.quick


def test_selections():
    a = scaling.parse_args(["--models", "lm", "--nodes", "1,8", "--rates", "100", "--methods", "diloco,torch_ddp",
                            "--quick", "--max-seconds", "5"])
    assert (a.models, a.nodes, a.rates, a.methods, a.quick, a.max_seconds) == (
        ["lm"], [1, 8], [100], ["diloco", "torch_ddp"], True, 5)
    cfg = scaling.config("lm", "diloco", a)
    assert cfg["max_seconds"] == 5 and cfg["target"] == scaling.QUICK["lm"]["target"]
    assert cfg["eval_every"] == scaling.SETTINGS["diloco_h"]  # evaluated right after each sync
    assert scaling.config("mlp", "streaming", a)["eval_every"] == 25
    assert scaling.config("mlp", "localsgd", a)["eval_every"] == 8


@pytest.mark.parametrize("argv,words", [
    (["--models", "cnn"], "cnn not among mlp, lm"),
    (["--nodes", "0"], "must be positive"),
    (["--nodes", "16"], "16 not among"),
    (["--rates", "fast"], "not a list of integers"),
    (["--methods", "ddp"], "ddp not among torch_ddp"),
    (["--methods", ","], "empty list"),
    (["--cpus", "0"], "--cpus must be in (0, 8]"),
    (["--max-seconds", "-1"], "--max-seconds must be positive"),
])
def test_bad_arguments_are_named(capsys, argv, words):
    with pytest.raises(SystemExit):
        scaling.parse_args(argv)
    assert words in capsys.readouterr().err


def test_speedup_and_efficiency():
    assert scaling.scaling(10.0, 2.5, 8) == (4.0, 0.5)
    assert scaling.scaling(10.0, None, 8) == (None, None)  # not reached: no speedup
    assert scaling.scaling(None, 1.0, 2) == (None, None)
    with pytest.raises(ValueError, match="positive"):
        scaling.scaling(1.0, 0.0, 2)


def test_bytes_per_sample_is_the_busiest_link():
    ranks = [{"rank": 0, "sent": 100, "received": 300}, {"rank": 1, "sent": 500, "received": 100}]
    assert scaling.bytes_per_sample(ranks, 60) == 10.0
    with pytest.raises(ValueError, match="samples"):
        scaling.bytes_per_sample(ranks, 0)


def row(model, method, nodes, rate, seconds):
    ranks = [{"rank": k, "sent": 10 * nodes, "received": 10 * nodes, "curve": [[seconds or 9.0, 640, 0.5]],
              "reached": seconds is not None, "seconds": seconds or 9.0, "samples": 640, "steps": 10,
              **({"seconds_to_target": seconds} if seconds else {})} for k in range(nodes)]
    return scaling.summarize({"model": model, "method": method, "nodes": nodes, "rate_mbit": rate}, ranks)


def test_rows_scale_against_their_models_one_node():
    rows = scaling.add_scaling([row("mlp", "plain", 1, None, 8.0), row("mlp", "diloco", 4, 100, 4.0),
                                row("mlp", "torch_ddp", 4, 100, None), row("lm", "plain", 1, None, 3.0),
                                row("lm", "diloco", 2, 100, 1.0)])
    assert [(r["speedup"], r["efficiency"]) for r in rows] == [
        (1.0, 1.0), (2.0, 0.5), (None, None), (1.0, 1.0), (3.0, 1.5)]
    assert rows[1]["bytes_per_sample"] == 80 / 640 and rows[1]["samples_per_s"] == 160
    assert "not in 9" in scaling.report(rows)


def test_append_replaces_only_the_same_cases(tmp_path):
    import json
    old = {"rows": [row("mlp", "plain", 1, None, 8.0), row("mlp", "diloco", 2, 100, 4.0)], "failed": [],
           "command": "a", "wall_s": 5, "models": {"mlp": {}}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(old))
    new = {"rows": [row("mlp", "diloco", 2, 100, 2.0), row("mlp", "diloco", 2, 1000, 1.0)], "failed": [],
           "command": "b", "wall_s": 1, "models": {"mlp": {}}}
    got = scaling.merge(str(path), new)
    assert [(r["rate_mbit"], r["seconds_to_target"]) for r in got["rows"]] == [(None, 8.0), (100, 2.0), (1000, 1.0)]
    assert got["command"] == "a ; b" and got["wall_s"] == 6


def test_text_corpus_is_sorted_bounded_and_split(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "b" / "z.py").write_bytes(b"z" * 900)
    (tmp_path / "a.py").write_bytes(b"a" * 900)
    (tmp_path / "site-packages" / "c.py").write_bytes(b"c" * 900)  # differs between machines: left out
    (tmp_path / "notes.txt").write_bytes(b"t" * 900)
    data = scaling_rank.text_corpus(str(tmp_path), 1500)
    assert data == b"a" * 900 + b"\n" + b"z" * 599
    assert scaling_rank.text_corpus(str(tmp_path), 1500) == data  # deterministic
    train, val = scaling_rank.split_text(data, 0.1)
    assert train + val == data and len(val) == 150
    (tmp_path / "b" / "small").mkdir()
    (tmp_path / "b" / "small" / "x.py").write_bytes(b"x" * 99)
    with pytest.raises(ValueError, match="only 100 bytes of .py files"):
        scaling_rank.text_corpus(str(tmp_path / "b" / "small"), 10**6)
    with pytest.raises(ValueError, match="not a folder"):
        scaling_rank.text_corpus(str(tmp_path / "none"), 100)
    with pytest.raises(ValueError, match="max_bytes"):
        scaling_rank.text_corpus(str(tmp_path), 0)


def test_text_windows_and_model_shapes(tmp_path):
    import torch
    path = tmp_path / "t.txt"
    path.write_bytes(bytes(range(256)) * 200)
    data = scaling_rank.TextData(str(path))
    assert data.val.shape == (32, scaling_rank.CONTEXT + 1)
    (starts,) = data.shard(1, 4)
    assert starts[:3].tolist() == [1, 5, 9]
    net = scaling_rank.build("lm")
    loss = data.loss(net, (starts[:2],))
    assert loss.shape == () and torch.isfinite(loss)
    assert 5.0 < data.evaluate(net) < 6.5  # about log(256) for an untrained model
