"""The federated server's per-result integrity check beside its baseline, FedAvg's add.

    python bench/federated_integrity.py [--quick]

Every training result the server takes is checked (pybridge/federated/integrity.py: one
L2-norm pass, which is NaN or Inf exactly when an element is) before it is yielded; the
baseline is FedAvg.add, the float64 weighted sum every result goes through anyway. Also the
metrics' wire text (encode + decode of two metrics). One process, no ranks: the cost is
the server's CPU per result. Median of repeats per model size; writes
bench/results/federated-integrity.json.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import save, table  # noqa: E402

from pybridge.federated import TRAIN, FedAvg, Result  # noqa: E402
from pybridge.federated import metrics as fed_metrics  # noqa: E402
from pybridge.federated.integrity import refusal  # noqa: E402

SIZES = (100_000, 1_000_000, 10_000_000)


def _median_us(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def measure(size, repeats):
    update = torch.randn(size, generator=torch.Generator().manual_seed(0))
    avg = FedAvg([torch.nn.Parameter(torch.zeros(size))])
    clients = iter(range(1 << 30))

    def add():
        avg.add(Result(TRAIN, 1, next(clients), 1, 10, update, 0.0))
    text = fed_metrics.encode(fed_metrics.check({"loss": 0.25, "accuracy": 0.875}))
    return {"elements": size,
            "fedavg_add_us": _median_us(add, repeats),
            "check_us": _median_us(lambda: refusal(update, max_norm=1e9), repeats),
            "metrics_us": _median_us(lambda: fed_metrics.decode(text), repeats)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, nothing saved")
    args = parser.parse_args()
    repeats = 5 if args.quick else 21
    torch.set_num_threads(1)  # the server's thread, on a shared machine
    rows = [measure(n, repeats) for n in SIZES]
    print(table(["float32 elements", "FedAvg.add (baseline)", "integrity check", "check / add",
                 "metrics decode"],
                [[f"{r['elements']:,}", f"{r['fedavg_add_us']:.0f} us", f"{r['check_us']:.0f} us",
                  f"{r['check_us'] / r['fedavg_add_us']:.2f}", f"{r['metrics_us']:.1f} us"] for r in rows]))
    if not args.quick:
        save("federated-integrity", {"threads": 1, "repeats": repeats, "rows": rows})


if __name__ == "__main__":
    main()
