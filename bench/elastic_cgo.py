"""Elastic training through the C ABI (what C and Go programs pay), beside Python:

1. commit cost: pb_state_commit (the call Go's ElasticState.Commit makes) beside
   pybridge.runtime.elastic.State.commit on the same tensors (parameters + momentum), in one
   process, for the MNIST example's MLP and two larger models; the difference is the C
   ABI's conversion (names, descriptors, binding);
2. recovery from C: tests/c/elastic.c under `pybridge-launch --elastic` on 3 ranks, rank 2
   SIGKILLed mid-step: time from the kill to pb_state_reset's return (detection, agreement
   on the next world, new process group, re-binding, rollback and rank 0's commit sent)
   and to the first step done on the new world.

    python bench/elastic_cgo.py [--quick]

Writes bench/results/elastic_cgo.json.
"""

import argparse
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, progress, save, table  # noqa: E402

LIB = os.path.join(ROOT, "build", "libpybridge.so")
MNIST_MLP = 784 * 128 + 128 + 128 * 10 + 10  # examples/mnist's parameters
SIZES = {"MNIST MLP (0.1M)": MNIST_MLP, "4M": 4 << 20, "16M": 16 << 20}  # float32 parameters


def _commit_times(n, repeat, out):
    """In a child process (the library embeds this interpreter): median seconds of one
    commit of n parameters + n momentum values, through the C ABI and through Python."""
    import cffi
    import numpy as np
    import torch
    from pybridge.cbuild import gen as _capi_gen
    from pybridge.runtime.elastic import State
    ffi = cffi.FFI()
    with open(os.path.join(ROOT, "capi", "pybridge.h")) as f:
        ffi.cdef(_capi_gen.public_cdef(f.read()))
    lib = ffi.dlopen(LIB)
    arrays = [np.random.default_rng(k).random(n, dtype=np.float32) for k in range(2)]
    keep = [ffi.new("char[]", name) for name in (b"params", b"momentum")]
    names = ffi.new("char *[2]", keep)
    descs = ffi.new("pb_tensor[2]")
    for d, a in zip(descs, arrays):
        d.data, d.count, d.dtype, d.device = ffi.cast("void *", a.ctypes.data), n, lib.PB_FLOAT32, lib.PB_CPU
    sp = ffi.new("pb_state **")
    assert lib.pb_state_create(sp) == 0

    def c_commit():
        assert lib.pb_state_commit(sp[0], 1, 2, names, descs, ffi.NULL, ffi.NULL) == 0, \
            ffi.string(lib.pb_last_error()).decode()

    state = State(tensors={"params": torch.from_numpy(arrays[0]), "momentum": torch.from_numpy(arrays[1])}, step=0)
    times = {"c": [], "python": []}
    for _ in range(repeat):  # interleaved, so that machine noise hits both
        for key, fn in (("c", c_commit), ("python", state.commit)):
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    lib.pb_state_close(sp[0])
    out.put({k: statistics.median(v[1:]) for k, v in times.items()})  # the first allocates


def commit_costs(repeat):
    rows = {}
    ctx = mp.get_context("spawn")
    for name, n in SIZES.items():
        progress(f"commit: {name}")
        q = ctx.Queue()
        p = ctx.Process(target=_commit_times, args=(n, repeat, q))
        p.start()
        got = q.get(timeout=300)
        p.join()
        rows[name] = {"params": n, "mb": 2 * n * 4 / 1e6, "c_ms": got["c"] * 1e3, "python_ms": got["python"] * 1e3}
    return rows


def recovery(runs):
    """Kill-to-reset and kill-to-first-step of the C program, per survivor and run."""
    with tempfile.TemporaryDirectory(prefix="pybridge-bench-") as d:
        exe, data = os.path.join(d, "elastic"), os.path.join(d, "data.recordio")
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "pybridge"], check=True, text=True,
                               capture_output=True,
                               env={**os.environ, "PKG_CONFIG_PATH": os.path.join(ROOT, "build")}).stdout.split()
        subprocess.run(["gcc", "-O2", "-o", exe, os.path.join(ROOT, "tests", "c", "elastic.c"), *flags], check=True)
        from pybridge import recordio as rio
        rio.write_file(data, [bytes([i % 256]) for i in range(600)])
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "TMPDIR": d}
        out = []
        for k in range(runs):
            progress(f"recovery: run {k + 1} of {runs}")
            p = subprocess.run([sys.executable, "-m", "pybridge.launch", "--elastic", "--nproc-per-node", "3", exe,
                                data, "1", "5", "37", "2"], env=env, capture_output=True, text=True, timeout=180)
            text = p.stdout + p.stderr
            if p.returncode != 0:
                raise SystemExit(f"the elastic C run failed ({p.returncode}):\n{text[-3000:]}")
            killed = float(re.search(r"^KILL rank=2 t=(\S+)$", text, re.M).group(1))
            for reset_t, step_t in re.findall(r"^RESUMED rank=\d reset_t=(\S+) step_t=(\S+)$", text, re.M):
                out.append({"reset_ms": (float(reset_t) - killed) * 1e3, "step_ms": (float(step_t) - killed) * 1e3})
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    opts = p.parse_args(argv)
    if not os.path.exists(LIB):
        raise SystemExit(f"{LIB} is missing: run `make setup`")
    commits = commit_costs(5 if opts.quick else 15)
    print(table(["state (params + momentum)", "MB", "pb_state_commit ms", "State.commit ms", "C ABI extra ms"],
                [[name, f"{r['mb']:.1f}", f"{r['c_ms']:.3f}", f"{r['python_ms']:.3f}",
                  f"{r['c_ms'] - r['python_ms']:+.3f}"] for name, r in commits.items()]))
    rec = recovery(2 if opts.quick else 5)
    med = {k: statistics.median(r[k] for r in rec) for k in ("reset_ms", "step_ms")}
    print(table(["C, 3 ranks, rank 2 SIGKILLed", "median ms", "max ms", "samples"],
                [["kill -> pb_state_reset returned", f"{med['reset_ms']:.0f}",
                  f"{max(r['reset_ms'] for r in rec):.0f}", str(len(rec))],
                 ["kill -> first step on the new world", f"{med['step_ms']:.0f}",
                  f"{max(r['step_ms'] for r in rec):.0f}", str(len(rec))]]))
    save("elastic_cgo", {"commit": commits, "recovery": rec, "recovery_median_ms": med})


if __name__ == "__main__":
    main(sys.argv[1:])
