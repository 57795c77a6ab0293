"""RecordIO read throughput beside a plain sequential read of the same file (the ceiling).

For 100-byte, 1 KiB and 100 KiB records, uncompressed and Snappy, it writes one file per case
(default chunking: 32 MiB), then times, best of --repeat, with the page cache warm:
  plain   reading the file with readinto() into one reused 1 MiB buffer, doing nothing else;
  plain+CRC  the same plus CRC-32 of every byte (information: the ceiling of any reader that
          verifies checksums, as RecordIO readers do);
  reader  pybridge.recordio.Reader.batches(): checksums verified, batches assembled;
  loader  pybridge.recordio.Loader (one rank, static partition, prefetch thread);
  go      Go through the bridge: not measured yet (the Go RecordIO wrapper comes later).
"vs plain" is t_plain / t_pybridge over the same file: the fraction of the ceiling reached.
Targets (issue 4): uncompressed 100 KiB records >= 50% of plain; 1 KiB >= 1M records/s.

    python bench/recordio.py [--mib 128] [--repeat 3] [--dir DIR]
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import human_bytes, save, table  # noqa: E402

from pybridge import recordio as rio  # noqa: E402
from pybridge.recordio import checksum  # noqa: E402

CASES = [(100, 8192), (1024, 1024), (100 * 1024, 16)]  # (record bytes, records per batch)
COMPRESSORS = ["none", "snappy"]


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


def loader_read(path, batch):
    records = nbytes = 0
    with rio.Loader([path], batch, prefetch=2) as loader:
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
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir)")
    args = ap.parse_args(argv)
    work = args.dir or tempfile.mkdtemp(prefix="pybridge-bench-recordio-")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    rows, results = [], []
    try:
        for size, batch in CASES:
            n = (args.mib << 20) // size
            for compressor in COMPRESSORS:
                path = os.path.join(work, f"r{size}-{compressor}.recordio")
                make_file(path, size, n, compressor, rng)
                file_bytes = os.path.getsize(path)
                plain_read(path)  # warm the page cache
                t_plain, got = best_time(lambda: plain_read(path), args.repeat)
                assert got == file_bytes
                t_crc, _ = best_time(lambda: plain_read_crc(path), args.repeat)
                variants = [("reader", lambda: reader_read(path, batch)),
                            ("loader", lambda: loader_read(path, batch))]
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
                           "go_bridge_MBps": None}
                    results.append(res)
                    rows.append([human_bytes(size), compressor, how, batch, f"{file_bytes / 2**20:.0f}",
                                 f"{res['plain_MBps']:.0f}", f"{res['plain_crc_MBps']:.0f}",
                                 f"{res['pybridge_MBps']:.0f}",
                                 f"{res['records_per_s'] / 1e6:.2f}", f"{res['vs_plain'] * 100:.0f}%",
                                 "not yet measured"])
                os.unlink(path)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"RecordIO read throughput, {args.mib} MiB of records per case, best of {args.repeat}, "
          f"page cache warm; CRC-32 via {checksum.backend()}; {os.cpu_count()} CPUs")
    print(table(["record", "compressor", "pybridge API", "batch", "file MiB", "plain MB/s",
                 "plain+CRC MB/s", "pybridge MB/s", "M records/s", "vs plain", "Go via bridge"], rows))

    def pick(size, comp, api):
        return next(r for r in results if (r["record_bytes"], r["compressor"], r["api"]) == (size, comp, api))

    big = pick(100 * 1024, "none", "reader")
    kib = pick(1024, "none", "reader")
    kib_z = pick(1024, "snappy", "reader")
    targets = [
        {"target": "uncompressed 100 KiB records >= 50% of plain read", "value": big["vs_plain"],
         "met": big["vs_plain"] >= 0.5},
        {"target": "1 KiB records >= 1M records/s (uncompressed)", "value": kib["records_per_s"],
         "met": kib["records_per_s"] >= 1e6},
        {"target": "1 KiB records >= 1M records/s (snappy)", "value": kib_z["records_per_s"],
         "met": kib_z["records_per_s"] >= 1e6},
    ]
    for t in targets:
        value = f"{t['value'] * 100:.0f}%" if t["value"] < 10 else f"{t['value'] / 1e6:.2f}M records/s"
        print(f"target: {t['target']}: {value} -> {'met' if t['met'] else 'NOT met'}")
    print(f"(total {time.perf_counter() - started:.0f} s)")
    path = save("recordio", {"settings": {"mib_per_case": args.mib, "repeat": args.repeat,
                                          "crc_backend": checksum.backend(),
                                          "chunk_bytes": rio.DEFAULT_MAX_CHUNK_BYTES},
                             "results": results, "targets": targets,
                             "go_bridge": "not yet measured: the Go RecordIO wrapper is not built yet"})
    print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
