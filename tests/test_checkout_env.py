"""Each checkout its own environment: `make setup` installs into the checkout's `.venv`, so
the machine's Python (and every other checkout) imports and runs what it did before, and
the C library embeds the checkout's interpreter. Checked when the tests run from that
`.venv` (what `make test` does); skipped under another interpreter (`make PYTHON=...`, an
activated environment)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv")

pytestmark = pytest.mark.skipif(os.path.realpath(sys.prefix) != os.path.realpath(VENV),
                                reason="the tests run outside this checkout's .venv")


def _clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def test_the_machines_python_does_not_see_this_checkout(tmp_path):
    """The interpreter .venv was made from (sys.base_prefix) imports some other pybridge or
    none: setup installed nothing there."""
    base = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    out = subprocess.run([base, "-c", "import pybridge, os; print(os.path.realpath(pybridge.__file__))"],
                         cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        assert "No module named 'pybridge'" in out.stderr, out.stderr
    else:
        assert not out.stdout.strip().startswith(os.path.realpath(ROOT) + os.sep), \
            f"the machine's Python imports this checkout's pybridge: {out.stdout}"


def test_the_environment_imports_this_checkout(tmp_path):
    """From anywhere (not only the checkout's folder), .venv's Python and its pybridge-launch
    run this checkout's code."""
    python = os.path.join(VENV, "bin", "python")
    out = subprocess.run([python, "-c", "import pybridge, os; print(os.path.realpath(pybridge.__file__))"],
                         cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == os.path.realpath(os.path.join(ROOT, "pybridge", "__init__.py"))
    launch = os.path.join(VENV, "bin", "pybridge-launch")
    with open(launch) as f:
        assert f.readline().strip() == f"#!{python}", "pybridge-launch runs another interpreter"


def test_the_library_embeds_this_environment():
    """build/libpybridge.so starts .venv's interpreter (runtime.c names the build's
    sys.executable), so C and Go programs run this checkout's pybridge too."""
    lib = os.path.join(ROOT, "build", "libpybridge.so")
    if not os.path.exists(lib):
        pytest.skip("run `make setup` to build libpybridge.so")
    with open(lib, "rb") as f:
        data = f.read()
    assert os.path.join(VENV, "bin", "python").encode() in data
