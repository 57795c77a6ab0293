"""DiLoCo's quantized average on the wire: bytes each rank sends, time and error per format,
against pybridge's float32 all_reduce of the same tensor (the baseline), on loopback ranks.

    python bench/diloco_wire.py [--quick] [--worlds 2,4] [--elements N] [--block 128] [--iters N]

Each rank averages its own random float32 tensor of N elements (a pseudo-gradient's
size: N = 4M is a 16 MiB fragment) with quantized_average.average in every format
(pybridge.algorithms.quantize) and with all_reduce. Bytes are both counted (what the
algorithm hands to the all_to_all and the all_gather: 2 (p-1) chunk payloads) and
measured (each rank's `wchar` from /proc/self/io around the timed calls: gloo's socket
writes). The error is the average's against the exact float32 mean: the largest
|error| / the largest |mean|, and the largest |error| / the stated bound (quantize.py)
of both quantizations. On loopback with 2 shared cores the times measure the encoding
and decoding work beside the copies, not a slow link; the bytes are what a slow link
would carry.

Writes bench/results/diloco-wire.json.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import launch, reports, save, table  # noqa: E402
from gossip import written_bytes  # noqa: E402

RESULT = "DILOCO-WIRE "


def worker(n, block, iters):
    import torch

    import pybridge
    from pybridge.algorithms import quantized_average as qa
    from pybridge.algorithms.quantize import FORMATS, Codec
    torch.set_num_threads(1)
    g = pybridge.init(backend="gloo", timeout=600)
    x = torch.randn(n, generator=torch.Generator().manual_seed(g.rank)) * 1e-2
    every = torch.empty(g.size * n)
    pybridge.all_gather(x, every)
    xs = every.view(g.size, n)
    mean = xs.sum(0) / g.size
    out = {"rank": g.rank}

    def timed(fn):
        fn()  # warm-up
        pybridge.barrier()
        before, secs = written_bytes(), []
        for _ in range(iters):
            t0 = time.perf_counter()
            res = fn()
            secs.append(time.perf_counter() - t0)
        pybridge.barrier()
        return res, secs, (written_bytes() - before) / iters

    buf = x.clone()

    def allreduce():
        buf.copy_(x)
        pybridge.all_reduce(buf, pybridge.SUM)
        buf.div_(g.size)
        return buf
    res, secs, wrote = timed(allreduce)
    out["all_reduce"] = {"seconds": secs, "wrote": wrote, "counted": 2 * (g.size - 1) / g.size * 4 * n,
                         "rel_err": ((res - mean).abs().max() / mean.abs().max()).item(), "of_bound": 0.0}
    for name in FORMATS:
        c = Codec(name, block)
        res, secs, wrote = timed(lambda: qa.average(x, c))
        first = sum(c.bound(xs[r]) for r in range(g.size)) / g.size
        bound = first + c.bound(mean.abs() + first)
        err = (res.value - mean).abs()
        out[name] = {"seconds": secs, "wrote": wrote, "counted": res.sent_bytes,
                     "rel_err": (err.max() / mean.abs().max()).item(),
                     "of_bound": (err / bound.clamp_min(1e-30)).max().item() if name != "fp32" else 0.0}
    pybridge.finalize()
    print(RESULT + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 ranks, 256k elements, 2 calls")
    ap.add_argument("--worlds", default=None, help="rank counts (default 2,4; --quick 2)")
    ap.add_argument("--elements", type=int, default=0, help="elements averaged (default 4M; --quick 256k)")
    ap.add_argument("--block", type=int, default=128, help="quantization block (default 128)")
    ap.add_argument("--iters", type=int, default=0, help="timed calls per method (default 5; --quick 2)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--worker", nargs=3, metavar=("N", "BLOCK", "ITERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*map(int, args.worker))
    worlds = [int(w) for w in (args.worlds or ("2" if args.quick else "2,4")).split(",")]
    n = args.elements or (1 << 18 if args.quick else 1 << 22)
    iters = args.iters or (2 if args.quick else 5)
    import torch
    report = {"backend": "gloo", "device": "cpu", "torch": torch.__version__, "elements": n, "block": args.block,
              "iterations": iters, "command": "python bench/diloco_wire.py " + " ".join(sys.argv[1:]), "worlds": {}}
    for world in worlds:
        outs = launch([sys.executable, os.path.abspath(__file__), "--worker", str(n), str(args.block), str(iters)],
                      world, args.timeout, extra_env={"OMP_NUM_THREADS": "1"})
        ranks = reports(outs, RESULT, f"{world} ranks")
        rows, summary = [], {}
        for m in ["all_reduce", "fp32", "bf16", "fp8", "int8", "int4"]:
            wrote = statistics.mean(r[m]["wrote"] for r in ranks)
            counted = ranks[0][m]["counted"]
            ms = max(statistics.median(r[m]["seconds"]) for r in ranks) * 1e3
            summary[m] = {"counted_bytes_per_rank": counted, "measured_bytes_per_rank": round(wrote),
                          "per_element": round(counted / n, 4), "ms": round(ms, 2),
                          "rel_err": ranks[0][m]["rel_err"], "err_of_bound": round(ranks[0][m]["of_bound"], 3)}
            base = ranks[0]["all_reduce"]["counted"]
            rows.append([m if m != "all_reduce" else "all_reduce (baseline)", f"{counted / 2**20:.2f}",
                         f"{wrote / 2**20:.2f}", f"{counted / base:.3f}", f"{ms:.1f}",
                         f"{ranks[0][m]['rel_err']:.2e}", f"{ranks[0][m]['of_bound']:.2f}"])
        report["worlds"][str(world)] = summary
        print(f"\n{world} ranks, {n} float32 elements ({n * 4 / 2**20:.0f} MiB), block {args.block}:")
        print(table(["method", "MiB sent/rank (counted)", "MiB written/rank (measured)", "vs all_reduce",
                     "ms", "max err / max |mean|", "max err / bound"], rows))
    name = "diloco-wire" if not args.quick else "diloco-wire-quick"
    print("results:", save(name, report))


if __name__ == "__main__":
    main()
