"""Step time (forward + backward + gradient sync) of pybridge's reducer beside torch DDP,
a naive per-parameter allreduce and a flatten-then-one-allreduce, on 2 ranks over gloo.

    python bench/reducer.py [--quick] [--models a,b] [--rounds N] [--no-go]

Prints a table with ratios against torch DDP measured in the same run and writes
bench/results/reducer.json. Each method runs in its own pair of rank processes (so methods
cannot disturb each other's heap and caches), and the methods take turns in rounds so that
machine noise hits all.
The Go rows (model (a) only) come from bench/reducer_go, run as 2 Go ranks after the
Python ranks: forward and backward in plain Go loops, the Go reducer (C ABI) marking each
layer's gradients ready as backward produces them.
"""

import argparse
import multiprocessing as mp
import os
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, free_port, launch, save, table  # noqa: E402

WORLD = 2
MODELS = {
    "a": {"desc": "MLP, 50 layers of 256x256", "width": 256, "depth": 50, "batch": 32},
    "b": {"desc": "3 layers of 2048x2048", "width": 2048, "depth": 3, "batch": 32},
}
METHODS = ["pybridge", "torch_ddp", "naive", "flat"]
# Communication hooks, each beside torch DDP with the same hook: (hook, PowerSGD rank).
HOOKS = {"fp16": ("fp16", 0), "powersgd1": ("powersgd", 1), "powersgd4": ("powersgd", 4)}
HOOK_METHODS = [f"{who}_{h}" for h in HOOKS for who in ("pybridge", "torch_ddp")]
LABELS = {
    "pybridge": "pybridge reducer (DDP wrapper)",
    "torch_ddp": "torch DDP (bucket_cap_mb=25)",
    "naive": "naive per-parameter allreduce",
    "flat": "flatten + one allreduce",
    **{f"pybridge_{h}": f"pybridge, {h} hook" for h in HOOKS},
    **{f"torch_ddp_{h}": f"torch DDP, {h} hook" for h in HOOKS},
}


def build(cfg, seed=0):
    import torch
    from torch import nn
    torch.manual_seed(seed)
    layers = []
    for _ in range(cfg["depth"]):
        layers += [nn.Linear(cfg["width"], cfg["width"]), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def make_step(method, model, world):
    """A function running one training step's forward, backward and gradient sync."""
    import torch
    import torch.distributed as dist
    from pybridge.ddp import DistributedDataParallel as PDDP
    from torch.nn.parallel import DistributedDataParallel as TDDP

    params = list(model.parameters())
    base, hook = split_method(method)
    if base == "pybridge":
        wrapped = PDDP(model, bucket_cap_mb=25)
    elif base == "torch_ddp":
        wrapped = TDDP(model, bucket_cap_mb=25)
    else:
        wrapped = model
    if hook:  # torch's own hook on both wrappers, so the rows compare the reducers
        wrapped.register_comm_hook(*torch_hook(*HOOKS[hook]))

    def step(x):
        model.zero_grad()
        wrapped(x).square().mean().backward()
        if method == "naive":
            for p in params:
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        elif method == "flat":
            grads = [p.grad for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat.div_(world)
            offset = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[offset:offset + n].view_as(g))
                offset += n
    return step


def split_method(method):
    """(base method, hook name or '') of a method name such as 'torch_ddp_powersgd4'."""
    for base in ("torch_ddp", "pybridge", "naive", "flat"):
        if method == base or method.startswith(base + "_"):
            return base, method[len(base) + 1:]
    raise ValueError(method)


def torch_hook(name, rank):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if name == "fp16":
        return None, default_hooks.fp16_compress_hook
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                        start_powerSGD_iter=2)
    return state, powerSGD_hook.powerSGD_hook


def loopback_bytes():
    """Bytes sent over the loopback interface so far (the ranks talk over it), or None."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    return int(rest.split()[8])
    except OSError:
        pass
    return None


def method_rank(method, key, rank, port, threads, conn):
    """One rank of one method's own 2-rank job. Answers the parent over `conn`: first rank 0's
    gradients after one step (to check that every method computes the same thing), then, for
    each request of n, the times of n steps; None ends it."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": str(rank), "WORLD_SIZE": str(WORLD)})
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import pybridge
    torch.set_num_threads(threads)
    pybridge.init(backend="gloo", timeout=120)
    cfg = MODELS[key]
    x = torch.randn(cfg["batch"], cfg["width"], generator=torch.Generator().manual_seed(rank))
    model = build(cfg)
    step = make_step(method, model, WORLD)
    step(x)
    conn.send([p.grad.clone() for p in model.parameters()] if rank == 0 else None)
    while (n := conn.recv()) is not None:
        step(x)  # warm-up after the pause
        pybridge.barrier()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            step(x)
            times.append(time.perf_counter() - t0)
        conn.send(times)
    pybridge.barrier()
    pybridge.finalize()


def run_methods(key, threads, rounds, iters, deadline, methods):
    """{method: [rank 0's step seconds, rank 1's]} for model `key`.

    Each method runs in its own pair of processes, so that one method's heap and caches
    (freed gradients, trimmed or not; the other models' tensors) cannot slow another down:
    run in one process, methods moved page faults onto each other. They still take turns,
    round by round, so machine noise hits all of them; the idle pairs block on their pipes."""
    import torch
    ctx = mp.get_context("spawn")
    pairs = {}

    failed = {}  # hook method -> why its pair died (the table says so; the others go on)

    def recv(method, rank):
        proc, conn = pairs[method][rank]
        while not conn.poll(1):
            if proc.exitcode is not None:
                return died(method, rank, f"exit {proc.exitcode}")
            if time.monotonic() > deadline:
                sys.exit("benchmark did not finish within its time limit")
        try:
            return conn.recv()
        except EOFError:
            return died(method, rank, "connection lost")

    def died(method, rank, why):
        if method not in HOOK_METHODS:
            sys.exit(f"{method} rank {rank} died ({why}); see its traceback above")
        failed[method] = f"rank {rank} died ({why}; see the traceback above)"
        for proc, _ in pairs[method]:
            if proc.is_alive():
                proc.kill()
        return None

    try:
        grads = {}
        for m in methods:
            # One pair at a time, each up and running (its store bound, its first step done)
            # before the next picks a free port: started together, pairs could take each
            # other's ports and talk across (gloo aborted with a size mismatch).
            port = free_port()
            pairs[m] = []
            for r in range(WORLD):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=method_rank, args=(m, key, r, port, threads, child), daemon=True)
                proc.start()
                pairs[m].append((proc, parent))
            grads[m] = recv(m, 0)
            recv(m, 1)
        for m in methods:
            if m in failed:
                continue
            # Same work everywhere: after one step every method holds the same averaged gradients
            # (a hook's first step: fp16 rounding; PowerSGD starts compressing at step 2).
            tol = dict(rtol=1e-2, atol=1e-3) if m.endswith("fp16") else dict(rtol=1e-4, atol=1e-6)
            for g, ref in zip(grads[m], grads["torch_ddp"]):
                if not torch.allclose(g, ref, **tol):
                    sys.exit(f"{m} gradients differ from torch DDP's on model {key}")
        del grads
        times = {m: [[] for _ in range(WORLD)] for m in methods}
        sent = {m: [] for m in methods}
        for r in range(rounds):
            for m in methods[r % len(methods):] + methods[:r % len(methods)]:
                if m in failed:
                    continue
                before = loopback_bytes()
                for _, conn in pairs[m]:
                    conn.send(iters)
                for rank in range(WORLD):
                    got = None if m in failed else recv(m, rank)
                    times[m][rank].extend(got or [])
                after = loopback_bytes()
                if before is not None and after is not None:  # + 1: the warm-up step
                    sent[m].append((after - before) / (iters + 1) / WORLD)
        for m in methods:
            for proc, conn in pairs[m]:
                if m not in failed:
                    conn.send(None)
        for m in methods:
            for proc, _ in pairs[m]:
                proc.join(timeout=30)
        return times, sent, failed
    finally:
        for pair in pairs.values():
            for proc, _ in pair:
                if proc.is_alive():
                    proc.kill()


GO_DIR = os.path.join(ROOT, "bench", "reducer_go")
GO_BIN = os.path.join(ROOT, "build", "bench_reducer_go")


def run_go(threads, rounds, iters):
    """Model (a) trained by 2 Go ranks through the C ABI; per-rank lists of step seconds,
    or a string saying why it was not measured."""
    go = shutil.which("go")
    if go is None:
        return "not measured: go not on PATH"
    build = subprocess.run([go, "build", "-o", GO_BIN, "."], cwd=GO_DIR, capture_output=True, text=True)
    if build.returncode != 0:
        return "not measured: go build failed: " + (build.stderr.strip().splitlines() or ["?"])[-1]
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "go")
        launch([GO_BIN, prefix, str(rounds), str(iters), str(threads)], WORLD, 600)
        out = []
        for r in range(WORLD):
            with open(f"{prefix}-{r}.json") as f:
                out.append(json.load(f))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (default: cores / ranks)")
    ap.add_argument("--models", default=",".join(MODELS), help="which models, e.g. 'b' (default a,b)")
    ap.add_argument("--rounds", type=int, default=0, help="rounds of all methods (default 6, --quick 2)")
    ap.add_argument("--iters", type=int, default=0, help="timed steps per method per round (default a:10, b:5)")
    ap.add_argument("--no-go", action="store_true", help="skip the Go rows")
    ap.add_argument("--no-hooks", action="store_true", help="skip the fp16 and PowerSGD hook rows")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    threads = args.threads or max(1, cores // WORLD)
    rounds = args.rounds or (2 if args.quick else 6)
    models = args.models.split(",")
    if not models or any(m not in MODELS for m in models):
        ap.error(f"--models: choose from {', '.join(MODELS)}")
    iters = {"a": 3, "b": 2} if args.quick else {"a": 10, "b": 5}
    if args.iters:
        iters = {k: args.iters for k in iters}

    start = time.time()
    deadline = time.monotonic() + 900
    results, sent, failures = {}, {}, {}
    methods = METHODS + ([] if args.no_hooks else HOOK_METHODS)
    for key in models:
        print(f"model ({key}): {len(methods)} methods, each in its own pair of ranks, taking turns...", flush=True)
        results[key], sent[key], failures[key] = run_methods(key, threads, rounds, iters[key], deadline, methods)

    go_results = None
    if "a" in models and not args.no_go:
        print("Go ranks (plain-Go model (a), Go reducer through the C ABI)...", flush=True)
        go_results = run_go(threads, rounds, iters["a"])

    # A step ends in a collective, so ranks agree on its duration; take the slower rank.
    import torch
    report = {"world": WORLD, "backend": "gloo", "device": "cpu", "torch": torch.__version__,
              "threads_per_rank": threads, "rounds": rounds, "iterations_per_round": iters,
              "statistic": "median step time (zero_grad + forward + backward + gradient sync)",
              "models": {}}
    print(f"reducer benchmark: {WORLD} ranks, gloo, CPU, {threads} torch thread(s) per rank on "
          f"{cores} cores; median step time (zero_grad + forward + backward + sync)")
    for key in models:
        cfg = MODELS[key]
        ok = [m for m in methods if m not in failures[key]]
        med = {m: max(statistics.median(results[key][m][r]) for r in range(WORLD)) for m in ok}
        ddp = med["torch_ddp"]
        rows = {m: {"step_ms": None, "failed": failures[key][m]} for m in methods if m not in ok}
        for m in ok:  # a hook row is compared with torch DDP running the same hook (or plain DDP)
            who, hook = split_method(m)
            base = med.get(f"torch_ddp_{hook}", ddp) if who == "pybridge" and hook else ddp
            mib = statistics.median(sent[key][m]) / 2**20 if sent[key][m] else None
            rows[m] = {"step_ms": round(med[m] * 1e3, 3), "vs_torch_ddp": round(med[m] / base, 3),
                       "naive_over_this": round(med["naive"] / med[m], 3),
                       "sent_mib_per_rank_step": None if mib is None else round(mib, 3)}
        lines = [[LABELS[m], "failed", rows[m]["failed"], "", ""] if m not in ok else
                 [LABELS[m], f"{rows[m]['step_ms']:.2f}", f"{rows[m]['vs_torch_ddp']:.2f}x",
                  f"{rows[m]['naive_over_this']:.2f}x",
                  "" if rows[m]["sent_mib_per_rank_step"] is None else f"{rows[m]['sent_mib_per_rank_step']:.2f}"]
                 for m in methods]
        if key == "a" and go_results is not None:
            add_go_rows(go_results, med, rows, lines)
        report["models"][key] = {"desc": cfg["desc"], "batch_per_rank": cfg["batch"], "rows": rows}
        print(f"\n({key}) {cfg['desc']}, batch {cfg['batch']} per rank\n")
        print(table(["method", "step ms", "vs torch DDP", "naive / this", "MiB sent/rank/step"], lines))
    print("\nvs torch DDP: step time / DDP's, with the same hook for hook rows (< 1 is faster); naive / "
          "this: how many times faster than the per-parameter loop; MiB sent: loopback bytes during the "
          "timed steps / steps / ranks (TCP overhead included)")
    if go_results is not None:
        print("Go rows: forward and backward are plain scalar Go loops (no BLAS, no SIMD), so the Go "
              "step time mostly measures Go's matmul against torch's; 'exposed sync' is the time "
              "left in Wait after backward, 'sync only' marks all 100 gradients and waits, no compute.")
    # A partial run (--models, --no-go) must not overwrite the full results.
    partial = models != list(MODELS) or go_results is None or args.no_hooks
    path = save("reducer" + ("-" + "".join(models) if partial else ""), report)
    print(f"wrote {os.path.relpath(path)} in {time.time() - start:.0f} s")


def add_go_rows(go_results, med, rows, lines):
    if isinstance(go_results, str):
        rows["go_reducer"] = {"step_ms": None, "note": go_results}
        lines.append(["Go reducer (C ABI), plain-Go fwd+bwd", go_results, "", "", ""])
        return
    gmed = {k: max(statistics.median(go_results[r][k]) for r in range(WORLD))
            for k in ("step", "wait", "sync_only")}
    ddp, naive = med["torch_ddp"], med["naive"]
    rows["go_reducer"] = {
        "step_ms": round(gmed["step"] * 1e3, 3), "vs_torch_ddp": round(gmed["step"] / ddp, 3),
        "naive_over_this": round(naive / gmed["step"], 3),
        "exposed_sync_wait_ms": round(gmed["wait"] * 1e3, 3),
        "sync_only_ms": round(gmed["sync_only"] * 1e3, 3),
        "note": "forward/backward in plain scalar Go loops; the reducer marks each layer's "
                "gradients ready as backward produces them"}
    lines.append(["Go reducer (C ABI), plain-Go fwd+bwd", f"{gmed['step'] * 1e3:.2f}",
                  f"{gmed['step'] / ddp:.2f}x", f"{naive / gmed['step']:.2f}x", ""])
    lines.append(["  of which exposed sync (Wait after backward)", f"{gmed['wait'] * 1e3:.2f}", "", "", ""])
    lines.append(["Go reducer, sync only (mark 100 grads + Wait)", f"{gmed['sync_only'] * 1e3:.2f}", "", "", ""])


if __name__ == "__main__":
    main()
