"""Training state checkpoints (pybridge.runtime.checkpoint) and elastic resume.

A crash mid-run restarted by the launcher (--max-restarts) ends with the weights of an
uninterrupted run; 4 ranks stopped mid-epoch resume on 2; each record is trained on exactly
once per epoch (from the ranks' step logs: tests/resume_train.py).
"""

import collections
import json
import os
import sys

import pytest
import torch

from launcher import launch
from ranks import run_ranks
import resume_train

import pybridge
from pybridge.runtime import checkpoint
from pybridge.errors import CorruptData, InvalidArgument, IOFailure
from pybridge.recordio import Loader

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resume_train.py")


def _model():
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(4, 3)).sum().backward()
    opt.step()  # momentum buffers exist
    return model, opt


def test_save_restore_round_trip_in_one_process(tmp_path):
    model, opt = _model()
    w = torch.arange(5, dtype=torch.float64)
    checkpoint.save(tmp_path, 3, model=model, optimizer=opt, tensors={"w": w}, extra={"note": "x"})
    torch.manual_seed(2)
    model2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    w2 = torch.zeros(5, dtype=torch.float64)
    got = checkpoint.restore(tmp_path, model=model2, optimizer=opt2, tensors={"w": w2})
    assert got.step == 3 and got.extra == {"note": "x"} and got.source_rank == 0
    assert torch.equal(model2.weight, model.weight) and torch.equal(w2, w)
    mom = [opt2.state[p]["momentum_buffer"] for p in model2.parameters()]
    assert all(torch.equal(a, opt.state[p]["momentum_buffer"]) for a, p in zip(mom, model.parameters()))
    assert checkpoint.restore(tmp_path / "none") is None


def test_keep_and_atomic_write(tmp_path, monkeypatch):
    t = {"w": torch.zeros(2)}
    for step in range(1, 6):
        t["w"].fill_(step)
        checkpoint.save(tmp_path, step, tensors=t, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["step-000000000004.pt", "step-000000000005.pt"]

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(IOFailure, match="step-000000000006.pt"):
        checkpoint.save(tmp_path, 6, tensors=t)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["step-000000000004.pt", "step-000000000005.pt"]  # no temp left
    out = {"w": torch.zeros(2)}
    assert checkpoint.restore(tmp_path, tensors=out).step == 5 and out["w"].tolist() == [5, 5]


def test_bad_inputs_are_named(tmp_path):
    checkpoint.save(tmp_path, 1, tensors={"w": torch.zeros(3)})
    with pytest.raises(InvalidArgument, match="tensor names differ.*'v'"):
        checkpoint.restore(tmp_path, tensors={"v": torch.zeros(3)})
    with pytest.raises(InvalidArgument, match="'w' holds 3 torch.float32.*2 torch.float32"):
        checkpoint.restore(tmp_path, tensors={"w": torch.zeros(2)})
    with pytest.raises(InvalidArgument, match="holds no model state"):
        checkpoint.restore(tmp_path, model=torch.nn.Linear(1, 1), tensors={"w": torch.zeros(3)})
    with pytest.raises(InvalidArgument, match="step"):
        checkpoint.save(tmp_path, -1)
    (tmp_path / "step-000000000009.pt").write_bytes(b"garbage")
    with pytest.raises(CorruptData, match="step-000000000009.pt"):
        checkpoint.restore(tmp_path)


@pytest.mark.parametrize("field, value", [("step", "seven"), ("step", "7"), ("step", 7.5), ("step", True), ("step", -1),
                                          ("step", None), ("world_size", "two"), ("world_size", 0),
                                          ("tensors", [torch.zeros(1)]), ("tensors", {"w": 1.0})])
def test_metadata_of_the_wrong_type_is_corrupt_data_naming_the_file_and_field(tmp_path, field, value):
    # A step that is not an integer was a raw ValueError from int() (issue 32, finding 10); a
    # float was truncated without a word.
    state = checkpoint.state_of(3, tensors={"w": torch.zeros(2)})
    state[field] = value
    path = checkpoint.path_for(tmp_path, 3)
    with open(path, "wb") as f:
        f.write(checkpoint.to_bytes(state))
    with pytest.raises(CorruptData, match=f"step-000000000003.pt.*'{field}'"):
        checkpoint.restore(tmp_path, tensors={"w": torch.zeros(2)})
    with pytest.raises(CorruptData, match=f"rank 0's state: field '{field}'"):
        checkpoint.decode(checkpoint.to_bytes(state), "rank 0's state")


def test_loader_state_of_another_dataset_is_refused(tmp_path):
    paths = resume_train.write_dataset(str(tmp_path), 64)
    with Loader(paths, 4, shuffle=True, seed=7) as a, Loader(paths, 4, shuffle=True, seed=8) as b, \
            Loader(paths[:1], 4, shuffle=True, seed=7) as c:
        state = a.state_dict()
        with pytest.raises(InvalidArgument, match="seed 7 .this loader: 8"):
            b.load_state_dict(state)
        with pytest.raises(InvalidArgument, match="num_records 64 .this loader: 32"):
            c.load_state_dict(state)


def _read_in_lockstep(loaders, steps):
    """Every loader reads `steps` batches (or to the end), as ranks of one job; returns the
    records read and the loaders' common state."""
    seen = []
    its = [iter(ld) for ld in loaders]
    for _ in range(steps):
        for it in its:
            batch = next(it, None)
            if batch is not None:
                seen += [bytes(batch[i]) for i in range(len(batch))]
    states = [ld.state_dict() for ld in loaders]
    assert all(st == states[0] for st in states), "ranks disagree on the position"
    return seen, states[0]


@pytest.mark.parametrize("worlds,steps", [((4, 2), (5,)), ((2, 4), (3,)), ((4, 2, 3), (2, 4)), ((2, 2), (0,))])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resumed_epochs_read_each_remaining_record_once(tmp_path, worlds, steps, drop_last):
    paths = resume_train.write_dataset(str(tmp_path), 301, files=3, chunk_records=7)

    def job(world, state):
        loaders = [Loader(paths, 4, num_replicas=world, rank=r, shuffle=True, seed=3, drop_last=drop_last,
                          prefetch=0, epoch=1) for r in range(world)]
        if state is not None:
            for ld in loaders:
                ld.load_state_dict(state)
        return loaders

    seen, state = [], None
    for world, n in zip(worlds, steps):  # stop after n steps; restart on the next world size
        loaders = job(world, state)
        got, state = _read_in_lockstep(loaders, n)
        seen += got
        for ld in loaders:
            ld.close()
    loaders = job(worlds[-1], state)
    assert all(ld.epoch == 1 for ld in loaders)
    got, end = _read_in_lockstep(loaders, 10**6)
    seen += got
    assert end["remaining"] == []
    counts = collections.Counter(seen)
    if drop_last:  # nothing read twice; each pass drops less than a batch per rank
        assert max(counts.values()) == 1
        assert 301 - len(counts) < sum(w * 4 for w in worlds + worlds[-1:])
    else:  # everything read; padding repeats at most world - 1 records per run
        assert len(counts) == 301
        assert sum(counts.values()) - 301 <= sum(w - 1 for w in worlds)


def _different_checkpoints(rank, world, root):
    pybridge.init(timeout=30)
    try:
        folder = os.path.join(root, f"rank{rank}")
        w = torch.zeros(4)
        # rank 0: none; rank 1: steps 3 and 5; ranks 2 and 3: step 7 with their own values.
        for step in {1: [3, 5], 2: [7], 3: [7]}.get(rank, []):
            w.fill_(10 * rank + step)
            checkpoint.save(folder, step, tensors={"w": w}, extra=rank)
        out = {"w": torch.full((4,), -1.0)}
        got = checkpoint.restore(folder, tensors=out)
        # A rank whose folder cannot be listed: every rank fails (none hangs), naming it.
        broken = os.path.join(root, f"file{rank}")
        open(broken, "w").close()
        try:
            checkpoint.restore(broken if rank == 3 else folder, tensors=out)
            failure = None
        except IOFailure as exc:
            failure = str(exc)
        return got.step, got.source_rank, got.extra, out["w"].tolist(), failure
    finally:
        pybridge.finalize()


def test_newest_checkpoint_is_sent_by_the_lowest_rank_holding_it(tmp_path):
    results = run_ranks(_different_checkpoints, 4, str(tmp_path), timeout=90)
    assert [r[:4] for r in results] == [(7, 2, 2, [27.0] * 4)] * 4
    assert all("ranks [3] could not list" in r[4] for r in results[:3]), results
    assert "file3" in results[3][4], results[3]


# ---- training runs ---------------------------------------------------------------------

def _steps(log_prefix, world):
    """Every logged step line of every rank."""
    lines = []
    for r in range(world):
        path = f"{log_prefix}-rank{r}.jsonl"
        if os.path.exists(path):
            with open(path) as f:
                lines += [json.loads(line) for line in f]
    return lines


def _kept(lines, resumed_at):
    """Lines of steps whose effect is in the final weights: each attempt's steps up to the
    step the next attempt resumed from."""
    last = len(resumed_at) - 1
    return [ln for ln in lines if ln["attempt"] == last or ln["step"] <= resumed_at[ln["attempt"] + 1]]


def _assert_each_record_once(lines, records, epochs):
    for epoch in range(epochs):
        seen = collections.Counter(i for ln in lines if ln["epoch"] == epoch for i in ln["ids"])
        dup = {i: n for i, n in seen.items() if n > 1}
        assert not dup, f"epoch {epoch}: records seen more than once: {sorted(dup)[:10]}"
        assert set(seen) == set(range(records)), f"epoch {epoch}: {records - len(seen)} records never seen"


RECORDS, BATCH, EPOCHS = 400, 4, 2  # 2 ranks: 50 steps per epoch, no padding


def _run(rank, world, argv):
    return resume_train.train(resume_train.parse(argv))


def test_crash_at_step_37_restarted_by_the_launcher_ends_with_the_uninterrupted_weights(tmp_path):
    data = resume_train.write_dataset(str(tmp_path), RECORDS)
    runs = {}

    def argv(d):
        return ["--data", *data, "--ckpt", str(d / "ck-{rank}"), "--steplog", str(d / "log"), "--out", str(d / "w.pt"),
                "--epochs", str(EPOCHS), "--batch", str(BATCH)]

    # The reference needs no launcher (the same training function on 2 ranks, uninterrupted);
    # the crash and its restart are the launcher's.
    for name in ("plain", "crash"):
        (tmp_path / name).mkdir()
    total = EPOCHS * RECORDS // (2 * BATCH)
    assert run_ranks(_run, 2, argv(tmp_path / "plain"), timeout=180) == [total] * 2
    rc, out, _ = launch(["--nproc-per-node", "2", "--max-restarts", "1", SCRIPT, *argv(tmp_path / "crash"),
                         "--crash-at", "37"], timeout=240)
    assert rc == 0, out
    for name in ("plain", "crash"):
        runs[name] = (torch.load(tmp_path / name / "w.pt"), _steps(str(tmp_path / name / "log"), 2))
    (plain, plain_lines), (crash, crash_lines) = runs["plain"], runs["crash"]
    assert "rank 0: attempt 1 world 2 resumed at step 36 from rank 0" in out, out
    assert {ln["attempt"] for ln in crash_lines} == {0, 1}
    assert max(ln["step"] for ln in crash_lines if ln["attempt"] == 0) == 36  # died in step 37
    assert plain["step"] == crash["step"] == total
    assert plain["iterations"] == crash["iterations"] == total  # the reducer's counter was restored
    for k, w in plain["weights"].items():
        torch.testing.assert_close(crash["weights"][k], w, rtol=0, atol=1e-6)
    _assert_each_record_once(_kept(crash_lines, [0, 36]), RECORDS, EPOCHS)
    _assert_each_record_once(plain_lines, RECORDS, EPOCHS)


def test_four_ranks_stopped_at_step_50_resume_on_two(tmp_path):
    records = 1024  # 4 ranks x 4 records: 64 steps per epoch; 14 steps left at step 50
    data = resume_train.write_dataset(str(tmp_path), records, files=3)
    argv = ["--data", *data, "--ckpt", str(tmp_path / "ck"), "--steplog", str(tmp_path / "log"),
            "--epochs", "1", "--batch", "4", "--writers", "rank0"]
    assert run_ranks(_run, 4, argv + ["--stop-at", "50"], timeout=180) == [50] * 4
    first = _steps(str(tmp_path / "log"), 4)
    for ln in first:
        ln["attempt"] = 0
    os.rename(tmp_path / "log-rank0.jsonl", tmp_path / "first-rank0.jsonl")
    os.rename(tmp_path / "log-rank1.jsonl", tmp_path / "first-rank1.jsonl")
    # 224 records left, 112 per rank: 28 more steps on each of 2 ranks.
    assert run_ranks(_run, 2, argv, timeout=180) == [78] * 2
    second = _steps(str(tmp_path / "log"), 2)
    assert {ln["world"] for ln in second} == {2} and {ln["step"] for ln in second} == set(range(51, 79))
    for ln in second:
        ln["attempt"] = 1
    _assert_each_record_once(first + second, records, 1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
