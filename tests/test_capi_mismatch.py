"""Cross-rank mismatches from a plain C program on two ranks (tests/c/mismatch.c): every
rank gets PB_ERR_INVALID_ARGUMENT naming the rank that differs; no process aborts."""

import os
import subprocess

import pytest

from capi_loader import LIB_PATH, ROOT, pybridge_flags, run_two_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    path = tmp_path_factory.mktemp("c") / "mismatch"
    flags = pybridge_flags()
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", str(path), os.path.join(ROOT, "tests/c/mismatch.c"),
                    *flags], check=True)
    return path


@pytest.mark.parametrize("mode", ["checked", "worldsize"])
def test_mismatches_from_c(exe, mode):
    for rank, (code, out) in enumerate(run_two_ranks(exe, mode)):
        assert code == 0, f"rank {rank} exited {code}:\n{out}"  # a signal would be negative
        assert "mismatch: 0 failed checks" in out, out
