"""Elastic training from the MNIST trainers: --elastic of the Go trainer (examples/mnist/
elastic.go) and of its Python twin (train.py, train_elastic.py) under pybridge-launch --elastic
on 4 ranks; rank 2 SIGKILLs itself before step 37, the 3 survivors get ErrMembership /
MembershipChanged, are reset onto the smaller world, rolled back to the commit of step 30,
and finish with identical weights."""

import re
import subprocess
import sys

import pytest

from gobuild import go_build
from launcher import launch
from test_mnist import MNIST, TRAIN_PY, small_data


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    return go_build(MNIST, tmp_path_factory.mktemp("gobin") / "mnist"), small_data(tmp_path_factory)


@pytest.mark.parametrize("twin", ["go", "python"])
def test_mnist_survivors_finish_identical(trainer, tmp_path, twin):
    exe, data = trainer
    program = exe if twin == "go" else TRAIN_PY
    code, out, _ = launch(["--elastic", "--nproc-per-node", "4", program, "--elastic", "--data", data, "--epochs", "2",
                           "--batch-size", "32", "--fail-at", "37", "--fail-rank", "2",
                           "--save-weights", str(tmp_path / "w.bin")], timeout=150)
    assert code == 0, out
    assert "worker node0-slot2-0 (local rank 2) was killed by signal SIGKILL; the others go on without it" in out
    assert "elastic: world 4 -> 3 ranks (lost ranks [2], 0 joined); back to the commit of step 30, epoch 0" in out
    done = re.findall(r"^elastic: rank (\d) of (\d) done at step (\d+), epoch (\d+), weights ([0-9a-f]{16})$", out, re.M)
    assert sorted(r for r, *_ in done) == ["0", "1", "2"], out
    assert len({tuple(rest) for _, *rest in done}) == 1, out  # one world, step, epoch and weights
    assert done[0][1:4] == ("3", done[0][2], "2")
    acc = float(re.search(r"^final test accuracy: (\d\.\d{4})$", out, re.M).group(1))
    assert acc > 0.5, out  # it learned
    assert (tmp_path / "w.bin").stat().st_size > 0


def test_elastic_flags_are_checked(trainer):
    exe, data = trainer
    for args, words in ((["--elastic", "--partition", "dynamic"], "--elastic takes the static partition only"),
                        (["--fail-at", "3"], "--fail-at and --fail-rank go with --elastic"),
                        (["--elastic", "--commit-every", "0"], "--commit-every must be positive")):
        for program in ([exe], [sys.executable, TRAIN_PY]):
            p = subprocess.run([*program, "--data", data, *args], capture_output=True, text=True, timeout=60)
            assert p.returncode != 0 and words in p.stderr, (program, args, p.stderr)
