"""The MNIST example: data preparation, the Python twin trainer under pybridge-launch
(equivalence with single-process training, accuracy, a killed rank, restart from a checkpoint).

Every launcher run is a subprocess bounded by a timeout; the data set is a small synthetic one.
"""

import gzip
import importlib.util
import hashlib
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MNIST = os.path.join(ROOT, "examples", "mnist")
sys.path.insert(0, MNIST)
import mnist_format as fmt  # noqa: E402
import prepare  # noqa: E402
from plot import main as plot_main  # noqa: E402

from gobuild import go_build  # noqa: E402
from launcher import launch as _launch  # noqa: E402
from pybridge import recordio  # noqa: E402

TRAIN_PY = os.path.join(MNIST, "train.py")
TIMEOUT = 90
# Measured on the 2000/500 synthetic set below (seed 0), 2 ranks, 3 epochs, batch 32, lr 0.05:
# 0.882 (Python twin) and 0.864 (Go trainer); the bound leaves a margin for other machines.
MIN_ACCURACY = 0.80


def small_data(tmp_path_factory):
    """A small synthetic set (2000 train, 500 test records in 3 + 1 shards, seed 0); its folder."""
    out = tmp_path_factory.mktemp("mnist")
    assert prepare.main(["--out", str(out), "--train-count", "2000", "--test-count", "500",
                         "--shards", "3", "--seed", "0"]) == 0
    return str(out)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)




@pytest.fixture(scope="module", params=["python", "go"])
def trainer(request, tmp_path_factory):
    """The command line of a trainer: the Python twin, or the Go trainer built from examples/mnist."""
    if request.param == "python":
        return [TRAIN_PY]
    return [go_build(MNIST, tmp_path_factory.mktemp("gobin") / "mnist")]


def launch(args, env=None, timeout=TIMEOUT):
    return _launch(args, env=env, timeout=timeout)


def final_accuracy(out):
    m = re.search(r"^final test accuracy: (\d\.\d{4})$", out, re.M)
    assert m, out
    return float(m.group(1))


EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+)  loss (\d+\.\d{4})  test-acc (\d\.\d{4})  samples/s (\d+)  "
                        r"\(rank 0 of (\d+)\)$", re.M)


# ------------------------------------------------------------------------------------ prepare

def test_prepare_synthetic(data, capsys):
    with open(os.path.join(data, fmt.MANIFEST)) as f:
        manifest = json.load(f)
    assert manifest["kind"] == "synthetic"
    assert manifest["record"]["bytes"] == fmt.RECORD_BYTES == 785
    assert manifest["train"]["count"] == 2000 and manifest["test"]["count"] == 500
    assert manifest["train"]["shards"] == [fmt.shard_name("train", i, 3) for i in range(3)]
    assert manifest["train"]["shards"][0] == "train-00000-of-00003.recordio"
    assert manifest["test"]["shards"] == ["test-00000-of-00001.recordio"]
    with recordio.Loader(os.path.join(data, fmt.TRAIN_GLOB), 2000, prefetch=0) as loader:
        batch = next(iter(loader))
    assert set(batch.lengths.tolist()) == {785}
    arrays = batch.decode(fmt.LAYOUT)
    labels, images = arrays["label"], arrays["image"].astype(np.float32)
    counts = np.bincount(labels, minlength=10)
    assert len(counts) == 10 and counts.min() > 120  # all ten digits, roughly balanced
    # Not trivial: the images of a class vary (shifts, strokes, noise)...
    for d in range(10):
        imgs = images[labels == d]
        assert imgs.std(0).mean() > 20
    # ...but learnable: classes differ on average.
    means = np.stack([images[labels == d].mean(0) for d in range(10)]).reshape(10, -1)
    dist = np.linalg.norm(means[:, None] - means[None], axis=-1)
    assert dist[~np.eye(10, dtype=bool)].min() > 100


def test_prepare_says_which_data(tmp_path, capsys):
    prepare.main(["--out", str(tmp_path / "s"), "--train-count", "20", "--test-count", "10"])
    assert "SYNTHETIC digits" in capsys.readouterr().out


def _idx_bytes(arr):
    """An unsigned-byte IDX file's bytes for arr."""
    header = struct.pack(">BBBB", 0, 0, 8, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def _idx(path, arr, gz):
    raw = _idx_bytes(arr)
    with open(path, "wb") as f:
        f.write(gzip.compress(raw) if gz else raw)


@pytest.mark.parametrize("gz", [False, True])
def test_prepare_real_idx_files(tmp_path, capsys, gz):
    rng = np.random.default_rng(5)
    src = tmp_path / "raw"
    src.mkdir()
    sets = {}
    for split, n, prefix in (("train", 37, "train"), ("test", 11, "t10k")):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        ext = ".gz" if gz else ""
        _idx(src / f"{prefix}-images-idx3-ubyte{ext}", images, gz)
        _idx(src / f"{prefix}-labels-idx1-ubyte{ext}", labels, gz)
        sets[split] = (labels, images)
    out = tmp_path / "out"
    assert prepare.main(["--out", str(out), "--mnist-dir", str(src), "--shards", "2"]) == 0
    assert "REAL MNIST" in capsys.readouterr().out
    with open(out / fmt.MANIFEST) as f:
        assert json.load(f)["kind"] == "mnist"
    for split, glob in (("train", fmt.TRAIN_GLOB), ("test", fmt.TEST_GLOB)):
        labels, images = sets[split]
        want = [fmt.encode_record(l, im) for l, im in zip(labels, images)]
        got = [r for path in recordio.expand_files(str(out / glob)) for r in recordio.read_file(path)]
        assert got == want
        assert want[0][0] == labels[0] and want[0][1:] == images[0].tobytes()  # label first


def test_prepare_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="no train-images-idx3-ubyte"):
        prepare.main(["--out", str(tmp_path / "o"), "--mnist-dir", str(tmp_path)])
    monkeypatch.setattr(prepare, "MIRRORS", ["http://127.0.0.1:1/"])
    monkeypatch.setattr(prepare, "TARBALL", "http://127.0.0.1:1/mnist.tgz")
    with pytest.raises(SystemExit, match="could not get train-images-idx3-ubyte.*offline"):
        prepare.main(["--out", str(tmp_path / "o"), "--download"])


@pytest.fixture
def http_dir(tmp_path):
    """(folder, base URL): a local HTTP server over a fresh folder, standing in for the mirrors."""
    import functools
    import http.server
    import threading
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def _fake_idx_set(rng):
    """{base: uncompressed IDX bytes}: a tiny stand-in for the four official files."""
    files = {}
    for prefix, n in (("train", 6), ("t10k", 3)):
        for kind, arr in (("images", rng.integers(0, 256, (n, 28, 28))), ("labels", rng.integers(0, 10, n))):
            files[f"{prefix}-{kind}-idx{arr.ndim}-ubyte"] = _idx_bytes(arr)
    return files


def _fake_sources(monkeypatch, http_dir, official, served):
    """Make `official` ({base: bytes}) the checksummed files, serve `served` in the fallback
    tarball, and point the gzip mirror at http_dir/mirror/ (empty: every file 404s)."""
    import io
    import tarfile
    root, url = http_dir
    monkeypatch.setattr(prepare, "IDX_SHA256", {b: hashlib.sha256(r).hexdigest() for b, r in official.items()})
    with tarfile.open(root / "mnist.tgz", "w:gz") as tar:
        for base, raw in served.items():
            info = tarfile.TarInfo(prepare.TARBALL_MEMBER.format(base))
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    monkeypatch.setattr(prepare, "MIRRORS", [url + "mirror/"])
    monkeypatch.setattr(prepare, "TARBALL", url + "mnist.tgz")
    (root / "mirror").mkdir()
    return root / "mirror"


def test_download_checks_every_file_and_falls_back_to_the_tarball(tmp_path, http_dir, monkeypatch):
    files = _fake_idx_set(np.random.default_rng(3))
    mirror = _fake_sources(monkeypatch, http_dir, files, files)
    # The gzip mirror serves a wrong train-images file and nothing else; the tarball has all four.
    (mirror / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(b"\0\0\x08\x03 not mnist"))
    raw = tmp_path / "raw"
    prepare.download(str(raw))
    assert sorted(os.listdir(raw)) == sorted(files)  # no .part files, no unchecked .gz
    for base, data in files.items():
        assert (raw / base).read_bytes() == data
    out = tmp_path / "out"
    assert prepare.main(["--out", str(out), "--mnist-dir", str(raw)]) == 0
    with open(out / fmt.MANIFEST) as f:
        assert json.load(f)["train"]["count"] == 6


def test_download_rejects_a_file_with_the_wrong_checksum(tmp_path, http_dir, monkeypatch):
    files = _fake_idx_set(np.random.default_rng(4))
    served = dict(files)
    served["t10k-labels-idx1-ubyte"] = files["t10k-labels-idx1-ubyte"][:-1] + b"\x09"  # one byte off
    _fake_sources(monkeypatch, http_dir, files, served)
    raw = tmp_path / "raw"
    with pytest.raises(SystemExit, match="t10k-labels-idx1-ubyte: SHA-256 [0-9a-f]{64} is not the official"):
        prepare.download(str(raw))
    assert "t10k-labels-idx1-ubyte" not in os.listdir(raw)
    assert not [n for n in os.listdir(raw) if n.endswith(".part")]


def test_checkpoint_format_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {n: rng.standard_normal(fmt.SHAPES[n]).astype(np.float32) for n in fmt.TENSOR_NAMES}
    path = str(tmp_path / "ck")
    fmt.write_checkpoint(path, 3, 120, tensors)
    size = 28 + sum(4 + 4 * len(fmt.SHAPES[n]) + 4 * int(np.prod(fmt.SHAPES[n])) for n in fmt.TENSOR_NAMES)
    assert os.path.getsize(path) == size
    epoch, step, back = fmt.read_checkpoint(path)
    assert (epoch, step) == (3, 120)
    for n in fmt.TENSOR_NAMES:
        np.testing.assert_array_equal(back[n], tensors[n])
    with open(path, "r+b") as f:
        f.write(b"NOTMAGIC")
    with pytest.raises(ValueError, match="bad magic"):
        fmt.read_checkpoint(path)


# ------------------------------------------------------------------------------------ training

def reference_weights(data, init, world, global_batch, steps, lr, momentum, seed):
    """Single-process training on the same global batches that `world` ranks see together:
    step k's global batch is the k-th batch of every rank's static partition, concatenated."""
    per_rank = global_batch // world
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    params = [model[0].weight, model[0].bias, model[2].weight, model[2].bias]
    with torch.no_grad():
        for name, p in zip(fmt.TENSOR_NAMES, params):
            p.copy_(torch.from_numpy(init[name]))
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    loaders = [recordio.Loader(os.path.join(data, fmt.TRAIN_GLOB), per_rank, num_replicas=world, rank=r,
                               shuffle=True, seed=seed, drop_last=True, prefetch=0) for r in range(world)]
    done, epoch = 0, 0
    while done < steps:
        for loader in loaders:
            loader.set_epoch(epoch)
        for batches in zip(*loaders):
            if done == steps:
                break
            arrays = [b.decode(fmt.LAYOUT) for b in batches]
            x = torch.from_numpy(np.concatenate([a["image"] for a in arrays]).reshape(-1, 784)).float() / 255
            y = torch.from_numpy(np.concatenate([a["label"] for a in arrays]).astype(np.int64))
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            done += 1
        epoch += 1
    for loader in loaders:
        loader.close()
    out = {name: p.detach().numpy() for name, p in zip(fmt.TENSOR_NAMES, params)}
    for name, p in zip(fmt.TENSOR_NAMES, params):
        out["m_" + name] = opt.state[p]["momentum_buffer"].numpy()
    return out


def test_two_ranks_equal_one_process_on_the_same_global_batch(data, tmp_path, trainer):
    rng = np.random.default_rng(42)
    init = {n: (rng.standard_normal(fmt.SHAPES[n]) * 0.05).astype(np.float32) for n in fmt.TENSOR_NAMES[:4]}
    fmt.write_checkpoint(str(tmp_path / "init"), 0, 0, init)
    # 2000 records, global batch 48 -> 41 steps per epoch: 50 steps cross an epoch boundary.
    steps, batch, lr, momentum, seed = 50, 48, 0.05, 0.9, 7
    # The Go trainer runs traced (pybridge-launch --trace): recording must not change the arithmetic.
    go = not trainer[0].endswith(".py")
    trace = tmp_path / "trace"
    rc, out, _ = launch([*(["--trace", str(trace)] if go else []), "--nproc-per-node", "2", *trainer,
                         "--data", data, "--epochs", "2",
                         "--steps", str(steps), "--batch-size", str(batch), "--lr", str(lr),
                         "--momentum", str(momentum), "--seed", str(seed),
                         "--init-weights", str(tmp_path / "init"), "--save-weights", str(tmp_path / "w")])
    assert rc == 0, out
    epoch, step, got = fmt.read_checkpoint(str(tmp_path / "w"))
    assert step == steps and epoch == 2
    want = reference_weights(data, init, 2, batch, steps, lr, momentum, seed)
    for name in fmt.TENSOR_NAMES:
        assert np.abs(got[name] - want[name]).max() < 1e-5, name
    # The run moved the weights: the comparison is not between two copies of the init.
    assert np.abs(got["w2"] - init["w2"]).max() > 1e-2
    if go:
        _check_go_trace(trace, steps, out)


def _check_go_trace(trace, steps, out):
    """The traced Go run: each rank's trace shows the Go program's forward, backward and
    optimizer spans on the program track (categories forward and compute), its loss at every
    step and the test accuracy of each epoch as counters; the metrics rows have their latest
    values; the launcher merged the ranks' files, and the report reads them."""
    assert "pybridge-launch: trace: " in out and "clock offsets measured at init" in out, out
    for rank in (0, 1):
        doc = json.load(open(trace / f"rank{rank}.trace.json"))
        assert doc["otherData"]["pybridge"]["steps"] == steps
        program = [e for e in doc["traceEvents"] if e.get("tid") == 1 and e["ph"] != "M"]
        spans = [(e["name"], e["cat"]) for e in program if e["ph"] == "X"]
        mine = [s for s in spans if s[0] in ("forward", "backward", "optimizer")]
        assert mine == [("forward", "forward"), ("backward", "compute"), ("optimizer", "compute")] * steps, spans
        assert ("loader.next", "data") in spans and ("reducer.wait", "comm") in spans  # the library's own
        counters = [e["name"] for e in program if e["ph"] == "C"]
        assert counters.count("loss") == steps and counters.count("test_accuracy") == 2, counters
        rows = [json.loads(line) for line in open(trace / "metrics" / f"rank{rank}.jsonl")]
        assert rows[-1]["step"] == steps and set(rows[-1]["scalars"]) == {"loss", "test_accuracy"}
        if rank == 0:
            assert f"{rows[-1]['scalars']['test_accuracy']:.4f}" == EPOCH_LINE.findall(out)[-1][3]
    from pybridge.observe import report
    rep = report.analyze(str(trace), skip=1)
    assert [r["steps"] for r in rep["per_rank"]] == [steps - 1] * 2
    assert rep["stragglers"]["collectives"] > steps and rep["verdict"]["text"]


def test_end_to_end_two_ranks_reach_accuracy(data, tmp_path, trainer):
    metrics = tmp_path / "metrics.jsonl"
    rc, out, _ = launch(["--nproc-per-node", "2", *trainer, "--data", data, "--epochs", "3",
                         "--batch-size", "32", "--checkpoint", str(tmp_path / "ck"), "--metrics", str(metrics)])
    assert rc == 0, out
    lines = EPOCH_LINE.findall(out)
    # --metrics: rank 0's JSON line per epoch says what the epoch line says; plot.py draws it.
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(r["epoch"], r["ranks"]) for r in rows] == [(1, 2), (2, 2), (3, 2)]
    assert [f"{r['loss']:.4f}" for r in rows] == [l[2] for l in lines]
    assert [f"{r['test_accuracy']:.4f}" for r in rows] == [l[3] for l in lines]
    assert rows[0]["seconds"] < rows[1]["seconds"] < rows[2]["seconds"]
    if importlib.util.find_spec("matplotlib"):
        svg = tmp_path / "curves.svg"
        assert plot_main([str(metrics), "--out", str(svg)]) == 0
        assert "test accuracy" in svg.read_text()
    assert [(e, n, w) for e, n, _, _, _, w in lines] == [("1", "3", "2"), ("2", "3", "2"), ("3", "3", "2")], out
    losses = [float(l[2]) for l in lines]
    assert losses[-1] < losses[0]
    assert "data: synthetic digits (SYNTHETIC: not real MNIST)" in out
    assert final_accuracy(out) >= MIN_ACCURACY, out
    assert final_accuracy(out) == float(lines[-1][3])
    assert fmt.read_checkpoint(str(tmp_path / "ck"))[0] == 3


STEPS_PER_RANK = re.compile(r"^steps per rank: \[([\d, ]+)\]$", re.M)


def test_dynamic_partition_trains_under_join(data, trainer):
    # --partition dynamic: the ranks claim chunks through the store as they go, so their step
    # counts may differ (by the last chunks of an epoch); the epoch ends with a join. The
    # cases where they surely differ, against torch's Join: test_join.py, go/join_test.go.
    rc, out, _ = launch(["--nproc-per-node", "2", *trainer, "--data", data, "--epochs", "2",
                         "--batch-size", "20", "--partition", "dynamic", "--slow-rank", "1", "--slow-ms", "1"])
    assert rc == 0, out
    counts = [[int(v) for v in m.replace(",", " ").split()] for m in STEPS_PER_RANK.findall(out)]
    assert len(counts) == 2 and all(len(c) == 2 and 90 <= sum(c) <= 200 for c in counts), out
    assert "~100 steps/epoch" in out, out
    # As static on the same batch (measured: loss 1.40 then 0.60 static, 1.39 then 0.61
    # dynamic); the test accuracy of 2 epochs on this small set is too noisy to compare.
    losses = [float(line[2]) for line in EPOCH_LINE.findall(out)]
    assert len(losses) == 2 and losses[1] < 0.75 < losses[0], out


def test_go_trainer_with_gossip(data, tmp_path):
    # --reduce gossip-*: the Go reducer gossips with one partner per step, and --sync-every 4
    # averages the replicas every 4 steps. Compared with allreduce on the same data and batch,
    # rank 0's training loss after 2 epochs is within 5% (measured: 0.7304 allreduce, 0.7550
    # dissemination, 0.7648 cube; with --sync-every 20 gossip's loss is 40% higher).
    exe = go_build(MNIST, tmp_path / "mnist")

    def final_loss(reduce):
        rc, out, _ = launch(["--nproc-per-node", "4", exe, "--data", data, "--epochs", "2",
                             "--batch-size", "32", "--reduce", reduce, "--sync-every", "4"])
        assert rc == 0, out
        epochs = EPOCH_LINE.findall(out)
        assert len(epochs) == 2, out
        return float(epochs[-1][2]), final_accuracy(out)

    allreduce_loss, allreduce_acc = final_loss("allreduce")
    gossip_loss, gossip_acc = final_loss("gossip-cube")
    assert gossip_loss <= 1.05 * allreduce_loss, (gossip_loss, allreduce_loss)
    assert gossip_acc >= allreduce_acc - 0.05, (gossip_acc, allreduce_acc)
    # A bad --reduce is refused before Init: no launcher, no rendezvous.
    p = subprocess.run([exe, "--data", data, "--reduce", "ring"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    assert p.returncode != 0 and "--reduce \"ring\": choose allreduce, gossip-cube or gossip-dissemination" in p.stdout


def test_killed_rank_stops_the_job_and_is_named(data, tmp_path, trainer):
    # 2000 records / batch 32 = 62 steps per epoch: step 80 is in the middle of epoch 2.
    rc, out, took = launch(["--nproc-per-node", "2", *trainer, "--data", data, "--epochs", "3",
                            "--batch-size", "32", "--checkpoint", str(tmp_path / "ck")],
                           env={"PYBRIDGE_TEST_FAIL_AT_STEP": "80"}, timeout=60)
    assert rc == 17, out
    assert "pybridge-launch: rank 1 (local rank 1) failed with exit code 17" in out, out
    assert "failing on purpose before step 80" in out.split("failed with exit code 17", 1)[1]
    assert "final test accuracy" not in out
    assert "epoch 1/3" in out and "epoch 2/3" not in out
    assert fmt.read_checkpoint(str(tmp_path / "ck"))[:2] == (1, 62)
    assert took < 60


def test_restart_resumes_from_the_last_epoch_and_finishes(data, tmp_path, trainer):
    marker = tmp_path / "failed-once"
    rc, out, _ = launch(["--nproc-per-node", "2", "--max-restarts", "1", *trainer, "--data", data,
                         "--epochs", "3", "--batch-size", "32", "--checkpoint", str(tmp_path / "ck"),
                         "--resume"],
                        env={"PYBRIDGE_TEST_FAIL_AT_STEP": "80", "PYBRIDGE_TEST_FAIL_MARKER": str(marker)})
    assert rc == 0, out
    assert marker.exists()
    assert "no checkpoint at" in out  # the first attempt started from scratch
    assert f"resumed from {tmp_path / 'ck'} after epoch 1 (step 62)" in out, out
    epochs = [int(e) for e, *_ in EPOCH_LINE.findall(out)]
    assert epochs == [1, 2, 3], out  # epoch 1 once, then the resumed epochs 2 and 3
    assert fmt.read_checkpoint(str(tmp_path / "ck"))[:2] == (3, 186)
    assert final_accuracy(out) >= MIN_ACCURACY
