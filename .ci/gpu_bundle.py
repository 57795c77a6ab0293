"""Prepare build/gpu/ on a machine with network and Go, for `.ci/gpu-check` on a GPU machine
that has neither (Python 3.12 with a CUDA torch, gcc and nvcc, and nothing of ours; at most
64 MiB travels with the working tree). `make gpu-bundle` runs it.

  build/gpu/wheels/   the Python packages pybridge and its tests need beyond torch, for the
                      GPU machine's Python (cp312 manylinux wheels; --python to change)
  build/gpu/go.test   go/'s test binary (`go test -c`): TestCUDATensors runs from it
  build/gpu/gotorch   examples/gotorch built without its C++ model: it links
                      libgotorch_mlp.so, which .ci/gpu-check compiles there from mlp.cpp
                      against that machine's libtorch (a binary linked here would carry this
                      machine's CPU libtorch)

The Go binaries link the C library by name (libpybridge.so) and find it through
LD_LIBRARY_PATH, so the library .ci/gpu-check builds there is the one they use.
"""

import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # pybridge from this checkout, installed or not
OUT = os.path.join(ROOT, "build", "gpu")
WHEELS = ["cffi", "pycparser", "numpy", "cramjam", "isal", "pytest", "pytest-timeout", "pluggy", "iniconfig",
          "packaging", "expecttest"]
LIMIT = 60 << 20  # what may travel (64 MiB) less the working tree's few MiB


def say(msg):
    print(f"gpu-bundle: {msg}", flush=True)


def wheels(python):
    dest = os.path.join(OUT, "wheels")
    shutil.rmtree(dest, ignore_errors=True)
    say(f"downloading wheels for Python {python}: {' '.join(WHEELS)}")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", python,
                    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                    "--platform", "manylinux_2_28_x86_64", "-d", dest, *WHEELS], check=True, timeout=600)


def go_env():
    import sysconfig
    go = os.path.join(sysconfig.get_path("scripts"), "go")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": "-mod=mod",
           "PKG_CONFIG_PATH": os.path.join(ROOT, "build")}
    return (go if os.path.exists(go) else "go"), env


def go_test_binary():
    go, env = go_env()
    say("building go/'s test binary")
    subprocess.run([go, "test", "-c", "-o", os.path.join(OUT, "go.test"), "."], cwd=os.path.join(ROOT, "go"),
                   env=env, check=True, timeout=600)


def gotorch_binary():
    """examples/gotorch's Go code in a copy without model/mlp.cpp, linked against a libgotorch_mlp.so
    (built here from mlp.cpp only to link against; the GPU machine builds its own)."""
    from pybridge.cbuild.cli import torch_flags
    src = os.path.join(ROOT, "build", "gpu-src", "gotorch")
    shutil.rmtree(src, ignore_errors=True)
    example = os.path.join(ROOT, "examples", "gotorch")
    shutil.copytree(example, src, ignore=lambda d, names: [n for n in names if n == "mlp.cpp" or n.endswith("_test.go")])
    with open(os.path.join(example, "go.mod")) as f:
        mod = f.read().replace("=> ../mnist", f"=> {ROOT}/examples/mnist").replace("=> ../../go", f"=> {ROOT}/go")
    with open(os.path.join(src, "go.mod"), "w") as f:
        f.write(mod)
    cflags, libs = torch_flags()
    say("building libgotorch_mlp.so (to link against) and the gotorch binary")
    subprocess.run(["g++", "-std=c++17", "-O2", "-shared", "-fPIC", "-w", *cflags.split(),
                    os.path.join(example, "model", "mlp.cpp"), "-o", os.path.join(src, "libgotorch_mlp.so"), *libs.split()],
                   check=True, timeout=600)
    go, env = go_env()
    env.update(CGO_CXXFLAGS=cflags, CGO_LDFLAGS=f"{libs} -L{src} -lgotorch_mlp")
    subprocess.run([go, "build", "-o", os.path.join(OUT, "gotorch"), "."], cwd=src, env=env, check=True, timeout=600)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python version (default 3.12)")
    opts = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    wheels(opts.python)
    go_test_binary()
    gotorch_binary()
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    say(f"build/gpu holds {size / 2**20:.1f} MiB")
    if size > LIMIT:
        raise SystemExit(f"gpu-bundle: build/gpu is {size / 2**20:.1f} MiB, more than the {LIMIT >> 20} MiB "
                         "that may travel with the working tree")


if __name__ == "__main__":
    main()
