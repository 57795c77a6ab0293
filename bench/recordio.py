"""RecordIO read throughput beside a plain sequential read of the same file (the ceiling).

For 100-byte, 1 KiB and 100 KiB records, uncompressed and Snappy, it writes one file per case
(default chunking: 32 MiB), then times, best of --repeat, with the page cache warm:
  plain   reading the file with readinto() into one reused 1 MiB buffer, doing nothing else;
  plain+CRC  the same plus CRC-32 of every byte (information: the ceiling of any reader that
          verifies checksums, as RecordIO readers do);
  reader  pybridge.recordio.Reader.batches(): checksums verified, batches assembled;
  loader  pybridge.recordio.Loader (one rank, static partition, 2 batches prefetched on a
          background thread: the default);
  loader, no prefetch  the same with prefetch=0 (read on the consumer's thread);
  Go via bridge  bench/recordio_go: pybridge.OpenLoader from Go (the same loader through the
          C ABI), shown on the loader rows with the same prefetch setting.
"vs plain" is t_plain / t_pybridge over the same file: the fraction of the ceiling reached.
Targets (issue 4): uncompressed 100 KiB records >= 50% of plain; 1 KiB >= 1M records/s.

    python bench/recordio.py [--mib 128] [--repeat 5] [--dir DIR] [--sizes 102400] [--no-go]
                             [--compressors none snappy gzip]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import ROOT, human_bytes, save, table  # noqa: E402

from pybridge import recordio as rio  # noqa: E402
from pybridge.recordio import checksum  # noqa: E402

CASES = [(100, 8192), (1024, 1024), (100 * 1024, 16)]  # (record bytes, records per batch)
COMPRESSORS = ["none", "snappy"]
GO_BIN = os.path.join(ROOT, "build", "bench_recordio_go")
LOADER_ROWS = {"loader": 2, "loader, no prefetch": 0}  # row -> prefetch


def build_go():
    """Build bench/recordio_go; returns an error message, or None when it built."""
    env = {**os.environ, "GOFLAGS": os.environ.get("GOFLAGS", "-mod=mod")}
    env.setdefault("PKG_CONFIG_PATH", os.path.join(ROOT, "build"))
    try:
        subprocess.run(["go", "build", "-o", GO_BIN, "."], check=True, capture_output=True, text=True,
                       cwd=os.path.join(HERE, "recordio_go"), env=env, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"go build failed: {getattr(exc, 'stderr', None) or exc}"
    return None


def go_read(path, batch, repeat, prefetch):
    """Best-of-repeat pass through the Go loader: {"seconds", "records", "bytes"}."""
    # The embedded core must import this checkout's pybridge, whatever else is installed.
    env = {**os.environ, "PYBRIDGE_PYTHONPATH": os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYBRIDGE_PYTHONPATH")) if p)}
    run = subprocess.run([GO_BIN, str(repeat), str(batch), path, str(prefetch)], capture_output=True, text=True,
                         env=env, timeout=300)
    if run.returncode:
        raise RuntimeError(f"{GO_BIN} failed:\n{run.stdout}{run.stderr}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def make_file(path, size, n, compressor, rng):
    """n records of `size` bytes: half random, half zeros (so Snappy has something to do)."""
    per_write = max(1, (16 << 20) // size)
    with rio.Writer(path, compressor) as w:
        for start in range(0, n, per_write):
            k = min(per_write, n - start)
            rows = np.zeros((k, size), np.uint8)
            rows[:, :size // 2] = rng.integers(0, 256, (k, size // 2), dtype=np.uint8)
            w.write_batch(rows.reshape(-1), np.arange(k + 1, dtype=np.int64) * size)


def plain_read(path):
    buf = bytearray(1 << 20)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(buf)
            if not got:
                return total
            total += got


def plain_read_crc(path):
    """The plain read plus CRC-32 of every byte: the ceiling for any reader that verifies."""
    buf = np.empty(1 << 20, np.uint8)
    view = memoryview(buf)
    crc = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(view)
            if not got:
                return crc
            crc = checksum.crc32_update(crc, buf[:got])


def reader_read(path, batch, verify=True):
    records = nbytes = 0
    with rio.Reader(path, verify_checksums=verify) as r:
        for b in r.batches(batch):
            records += len(b)
            nbytes += b.nbytes
    return records, nbytes


def loader_read(path, batch, prefetch):
    records = nbytes = 0
    with rio.Loader([path], batch, prefetch=prefetch) as loader:
        for b in loader:
            records += len(b)
            nbytes += b.nbytes
    return records, nbytes


def best_time(fn, repeat):
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=128, help="record data per case (MiB)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir)")
    ap.add_argument("--no-go", action="store_true", help="skip the Go via bridge column")
    ap.add_argument("--sizes", type=int, nargs="+", choices=[size for size, _ in CASES],
                    help="measure only these record sizes (bytes); the JSON is then not written")
    ap.add_argument("--compressors", nargs="+", choices=["none", "snappy", "gzip"],
                    help="measure these compressors (default none and snappy; anything else writes no JSON)")
    args = ap.parse_args(argv)
    work = args.dir or tempfile.mkdtemp(prefix="pybridge-bench-recordio-")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    go_error = "skipped (--no-go)" if args.no_go else build_go()
    if go_error:
        print(f"Go via bridge: not measured: {go_error}", file=sys.stderr)
    rows, results = [], []
    try:
        for size, batch in CASES:
            if args.sizes and size not in args.sizes:
                continue
            n = (args.mib << 20) // size
            for compressor in args.compressors or COMPRESSORS:
                path = os.path.join(work, f"r{size}-{compressor}.recordio")
                make_file(path, size, n, compressor, rng)
                file_bytes = os.path.getsize(path)
                plain_read(path)  # warm the page cache
                t_plain, got = best_time(lambda: plain_read(path), args.repeat)
                assert got == file_bytes
                t_crc, _ = best_time(lambda: plain_read_crc(path), args.repeat)
                go = {}  # loader row -> Go result
                if not go_error:
                    for how, prefetch in LOADER_ROWS.items():
                        go[how] = go_read(path, batch, args.repeat, prefetch)
                        assert go[how]["records"] == n and go[how]["bytes"] == n * size, go
                variants = [("reader", lambda: reader_read(path, batch))]
                variants += [(how, lambda p=p: loader_read(path, batch, p)) for how, p in LOADER_ROWS.items()]
                if compressor == "none" and size == CASES[-1][0]:
                    variants.append(("reader, no CRC check", lambda: reader_read(path, batch, verify=False)))
                for how, fn in variants:
                    t, (records, data_bytes) = best_time(fn, args.repeat)
                    assert records == n and data_bytes == n * size, (how, records, data_bytes)
                    res = {"record_bytes": size, "compressor": compressor, "api": how, "records": n,
                           "batch_records": batch, "data_bytes": data_bytes, "file_bytes": file_bytes,
                           "plain_s": t_plain, "plain_MBps": file_bytes / t_plain / 1e6,
                           "plain_crc_MBps": file_bytes / t_crc / 1e6,
                           "pybridge_s": t, "pybridge_MBps": data_bytes / t / 1e6,
                           "records_per_s": records / t, "vs_plain": t_plain / t,
                           "go_bridge_MBps": None, "go_bridge_records_per_s": None}
                    go_cell = "-"
                    if how in go:
                        g = go[how]
                        res["go_bridge_s"] = g["seconds"]
                        res["go_bridge_MBps"] = g["bytes"] / g["seconds"] / 1e6
                        res["go_bridge_records_per_s"] = g["records"] / g["seconds"]
                        res["go_bridge_vs_plain"] = t_plain / g["seconds"]
                        go_cell = (f"{res['go_bridge_MBps']:.0f} MB/s, "
                                   f"{res['go_bridge_records_per_s'] / 1e6:.2f}M rec/s, "
                                   f"{res['go_bridge_vs_plain'] * 100:.0f}%")
                    elif go_error and how in LOADER_ROWS:
                        go_cell = "not measured"
                    results.append(res)
                    rows.append([human_bytes(size), compressor, how, batch, f"{file_bytes / 2**20:.0f}",
                                 f"{res['plain_MBps']:.0f}", f"{res['plain_crc_MBps']:.0f}",
                                 f"{res['pybridge_MBps']:.0f}",
                                 f"{res['records_per_s'] / 1e6:.2f}", f"{res['vs_plain'] * 100:.0f}%",
                                 go_cell])
                os.unlink(path)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"RecordIO read throughput, {args.mib} MiB of records per case, best of {args.repeat}, "
          f"page cache warm; CRC-32 via {checksum.backend()}; {os.cpu_count()} CPUs")
    print(table(["record", "compressor", "pybridge API", "batch", "file MiB", "plain MB/s",
                 "plain+CRC MB/s", "pybridge MB/s", "M records/s", "vs plain", "Go via bridge"], rows))

    if args.sizes or (args.compressors and args.compressors != COMPRESSORS):
        print(f"(total {time.perf_counter() - started:.0f} s; partial run: no JSON written)")
        return

    def pick(size, comp, api):
        return next(r for r in results if (r["record_bytes"], r["compressor"], r["api"]) == (size, comp, api))

    big = pick(100 * 1024, "none", "reader")
    kib = pick(1024, "none", "reader")
    kib_z = pick(1024, "snappy", "reader")
    targets = [
        {"target": "uncompressed 100 KiB records >= 50% of plain read (Python reader)", "value": big["vs_plain"],
         "met": big["vs_plain"] >= 0.5},
        {"target": "1 KiB records >= 1M records/s (uncompressed)", "value": kib["records_per_s"],
         "met": kib["records_per_s"] >= 1e6},
        {"target": "1 KiB records >= 1M records/s (snappy)", "value": kib_z["records_per_s"],
         "met": kib_z["records_per_s"] >= 1e6},
    ]
    for how in LOADER_ROWS:  # Go through the bridge has the loader only
        ratio = pick(100 * 1024, "none", how).get("go_bridge_vs_plain")
        if ratio is not None:
            targets.append({"target": f"uncompressed 100 KiB records >= 50% of plain read (Go via bridge, {how})",
                            "value": ratio, "met": ratio >= 0.5})
    for t in targets:
        value = f"{t['value'] * 100:.0f}%" if t["value"] < 10 else f"{t['value'] / 1e6:.2f}M records/s"
        print(f"target: {t['target']}: {value} -> {'met' if t['met'] else 'NOT met'}")
    print(f"(total {time.perf_counter() - started:.0f} s)")
    path = save("recordio", {"settings": {"mib_per_case": args.mib, "repeat": args.repeat,
                                          "crc_backend": checksum.backend(),
                                          "chunk_bytes": rio.DEFAULT_MAX_CHUNK_BYTES},
                             "results": results, "targets": targets,
                             "go_bridge": go_error or ("bench/recordio_go: pybridge.OpenLoader from Go, best of "
                                                       f"{args.repeat} passes, on the loader rows")})
    print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
