"""The server's aggregation arithmetic per result and per model step, beside FedAvg's.

    python bench/federated_strategies.py [--numel 1000000] [--repeat 20] [--quick]

No ranks: Results are built in memory (float32 model of --numel elements). Per result:
FedAvg.add (the baseline: what round-mode FedAvg did before) beside UpdateBuffer.add with
staleness weights and with central DP's clipping. Per step (one result added, then
applied): FedAvg with SGD (the baseline) beside FedAvgRounds' UpdateBuffer and strategies
(ServerSGD, FedAdagrad, FedAdam, FedYogi, and ServerSGD with central DP's noise). The median of three sweeps, each a case's median of --repeat calls in a row, one process. Writes
bench/results/federated-strategies.json and its chart.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import save, table  # noqa: E402


ADD_BASE, STEP_BASE = "add: FedAvg.add (baseline)", "step: FedAvg add + step, SGD (baseline)"


def timings(numel, repeat):
    import torch

    from pybridge.federated import TRAIN, CentralDP, FedAdagrad, FedAdam, FedAvg, FedYogi, Result, ServerSGD, staleness
    from pybridge.federated.buffered import UpdateBuffer
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    delta = torch.randn(numel, generator=gen)
    result = Result(TRAIN, 1, 0, 1, 10, delta, 0.0)
    cpu = torch.device("cpu")
    param = torch.nn.Parameter(torch.zeros(numel))
    fedavg, ids = FedAvg([param]), iter(range(1 << 30))
    cases = {
        ADD_BASE: lambda: fedavg.add(Result(TRAIN, 1, next(ids), 1, 10, delta, 0.0)),  # one round, new clients
        "add: UpdateBuffer, constant": (lambda b: lambda: b.add(result, 0))(UpdateBuffer(numel, cpu)),
        "add: UpdateBuffer, polynomial, tau 3": (lambda b: lambda: b.add(result, 3))(
            UpdateBuffer(numel, cpu, staleness.polynomial(0.5))),
        "add: UpdateBuffer, central DP clip": (lambda b: lambda: b.add(result, 0))(
            UpdateBuffer(numel, cpu, dp=CentralDP(1.0, 1.0))),
    }

    stepper, rounds = FedAvg([torch.nn.Parameter(torch.zeros(numel))]), iter(range(1, 1 << 30))

    def fedavg_step():  # one result per round: FedAvg is bound to rounds
        stepper.add(Result(TRAIN, next(rounds), 0, 1, 10, delta, 0.0))
        stepper.step()
    cases[STEP_BASE] = fedavg_step
    model = torch.zeros(numel)

    def step(buf, opt):  # what FedAvgRounds does per step: one result added, the mean taken, applied
        buf.add(result, 0)
        opt.step(model, buf.take()[0])
    for name, opt in (("ServerSGD (FedAvg)", ServerSGD()), ("FedAdagrad", FedAdagrad()), ("FedAdam", FedAdam()),
                      ("FedYogi", FedYogi())):
        cases[f"step: {name}"] = (lambda b, o: lambda: step(b, o))(UpdateBuffer(numel, cpu), opt)
    cases["step: ServerSGD + central DP"] = (lambda b, o: lambda: step(b, o))(
        UpdateBuffer(numel, cpu, dp=CentralDP(1.0, 1.0)), ServerSGD())
    out = {name: [] for name in cases}
    for _ in range(3):  # three sweeps; in each, a case runs `repeat` times in a row after a warm-up call
        for name, fn in cases.items():
            fn()
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            out[name].append(statistics.median(times))
    return {name: statistics.median(v) for name, v in out.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=1_000_000, help="model elements (default 1M)")
    p.add_argument("--repeat", type=int, default=20, help="timings per case (default 20)")
    p.add_argument("--quick", action="store_true", help="100k elements, 3 timings, nothing saved")
    args = p.parse_args()
    numel, repeat = (100_000, 3) if args.quick else (args.numel, args.repeat)
    med = timings(numel, repeat)
    rows = []
    for name, s in med.items():
        base = med[ADD_BASE if name.startswith("add") else STEP_BASE]
        rows.append([name, f"{s * 1e3:.2f} ms", f"{s / base:.2f}x"])
    print(f"\nserver aggregation, {numel} float32 elements, median of {repeat}, one thread:\n")
    print(table(["case", "time", "vs baseline"], rows))
    if not args.quick:
        print("wrote", save("federated-strategies", {"numel": numel, "repeat": repeat, "seconds": med,
                                                     "command": "python bench/federated_strategies.py"}))


if __name__ == "__main__":
    main()
