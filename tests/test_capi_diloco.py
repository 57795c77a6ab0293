"""DiLoCo through the C ABI: a C program (tests/c/diloco.c) on 2 and 3 ranks ends each run of
tests/diloco_parity.py (plain DiLoCo; Streaming DiLoCo with 2 fragments, tau 1, alpha 0.5; int4
with error feedback and its own outer SGD) with the Python DiLoCo's weights, within 1e-6, and
names every bad input. tests/data/diloco_parity.json holds the Python DiLoCo's results, which
the Go test reads too; the first test checks that it still holds what the Python DiLoCo computes."""

import os
import subprocess

import numpy as np
import pytest

import diloco_parity as parity
from capi_loader import LIB_PATH, ROOT, pybridge_flags, run_c_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")

TOL = 1e-6


def test_the_file_holds_what_the_python_diloco_computes():
    saved, now = parity.load(), parity.compute()
    assert (saved["sizes"], saved["steps"], saved["configs"]) == (now["sizes"], now["steps"], now["configs"])
    for world, ranks in now["results"].items():
        for rank, runs in enumerate(ranks):
            for name, run in runs.items():
                want = saved["results"][world][rank][name]
                assert run["synced"] == want["synced"], (world, rank, name)
                diff = np.abs(np.array(run["weights"]) - np.array(want["weights"])).max()
                assert diff <= TOL, (world, rank, name, diff)
    # The runs train and sync: plain DiLoCo's replicas are equal after its last sync, and
    # differ from the start.
    for ranks in now["results"].values():
        assert len({tuple(r["plain"]["weights"]) for r in ranks}) == 1
        start = np.concatenate(parity.initial())
        assert np.abs(np.array(ranks[0]["plain"]["weights"]) - start).max() > 0.1


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    out = tmp_path_factory.mktemp("diloco-c") / "diloco"
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", str(out), os.path.join(ROOT, "tests/c/diloco.c"),
                    *pybridge_flags(), "-lm"], check=True)
    return out


def _lines(out, word):
    """{run name: the numbers after `word NAME:`} of one rank's output."""
    got = {}
    for line in out.splitlines():
        if line.startswith(word + " "):
            name, _, rest = line[len(word) + 1:].partition(":")
            got[name] = [float(x) for x in rest.split()]
    return got


@pytest.mark.parametrize("world", parity.WORLDS)
def test_c_diloco_equals_python_and_names_bad_input(exe, world):
    ranks = run_c_ranks(exe, world, world, timeout=120)
    saved = parity.load()["results"][str(world)]
    for rank, (code, out) in enumerate(ranks):
        assert code == 0 and "diloco: 0 failed checks" in out, f"rank {rank} exited {code}:\n{out}"
        weights, synced = _lines(out, "weights"), _lines(out, "synced")
        assert sorted(weights) == sorted(parity.CONFIGS), out
        for name, want in saved[rank].items():
            assert synced[name] == want["synced"], (rank, name, synced[name])
            diff = np.abs(np.array(weights[name]) - np.array(want["weights"])).max()
            assert diff <= TOL, (rank, name, diff)
        counts = _lines(out, "counts")
        assert counts["plain"][:2] == [parity.STEPS, 3] and counts["plain"][2] > 0, counts
