"""--version on every command-line tool, from the one version string."""

import os
import subprocess
import sys

import pytest

import pybridge

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("cmd", [
    ["-m", "pybridge.launch"],
    ["-m", "pybridge.recordio"],
    ["-m", "pybridge.capi"],
    ["-m", "pybridge.observe"],
    [os.path.join(ROOT, "examples", "mnist", "prepare.py")],
    [os.path.join(ROOT, "bench", "run.py")],
])
def test_version(cmd):
    run = subprocess.run([sys.executable, *cmd, "--version"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert run.returncode == 0, run.stderr
    assert pybridge.__version__ in run.stdout and run.stdout.count("\n") == 1, run.stdout


def test_bench_run_help_and_unknown_names():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "usage:" in run.stdout and "collectives" in run.stdout
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "nonesuch"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown benchmark(s) nonesuch" in run.stderr


def run_python(code):
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_the_tools_start_without_importing_torch():
    # `import pybridge` loads its exported names on first use, so the tools' usage errors,
    # --help and --version do not pay torch's import (1.5 s of CPU) first.
    loaded = run_python("import sys, pybridge, pybridge.launch, pybridge.cbuild.cli, pybridge.recordio.__main__;"
                        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    assert loaded == "[]"


def test_every_exported_name_and_submodule_loads_on_first_use():
    out = run_python("import sys, pybridge\n"
                     "names = {}\n"
                     "exec('from pybridge import *', names)\n"
                     "missing = [n for n in pybridge.__all__ if n not in names]\n"
                     "assert not missing, missing\n"
                     "assert pybridge.Reducer is pybridge.ddp.reducer.Reducer and 'torch' in sys.modules\n"
                     "assert pybridge.recordio.Loader.__module__ == 'pybridge.recordio.loader'\n"
                     "assert set(pybridge.__all__) <= set(dir(pybridge))\n"
                     "try:\n    pybridge.no_such_name\nexcept AttributeError as e:\n    print(e)\n")
    assert out == "module 'pybridge' has no attribute 'no_such_name'"


def test_the_type_checking_imports_name_the_lazy_exports():
    import ast
    tree = ast.parse(open(os.path.join(ROOT, "pybridge", "__init__.py")).read())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    seen = {imp.module: tuple(sorted(a.name for a in imp.names)) for imp in block.body}
    assert seen == {module: tuple(sorted(names)) for module, names in pybridge._EXPORTS.items()}
