"""Step time (forward + backward + gradient sync) of pybridge's reducer beside torch DDP,
a naive per-parameter allreduce and a flatten-then-one-allreduce, on 2 ranks over gloo.

    python bench/reducer.py [--quick] [--models a,b] [--rounds N] [--no-go] [--no-hooks] [--no-join]

Prints a table with ratios against torch DDP measured in the same run and writes
bench/results/reducer.json. Each method runs in its own pair of rank processes (so methods
cannot disturb each other's heap and caches), and the methods take turns in rounds so that
machine noise hits all. A method whose pair dies, raises or hangs (--case-timeout) is killed
and shown as failed with a one-line reason; the others go on. Progress lines go to stderr.
The Go rows (model (a) only) come from bench/reducer_go, run as 2 Go ranks after the
Python ranks: forward and backward in plain Go loops, the Go reducer (C ABI) marking each
layer's gradients ready as backward produces them. The Join rows run pybridge's wrapper and
torch DDP inside a Join context (even steps): what uneven-input support costs the ranks
still training; the Go "WithJoin" row is the reducer's per-iteration count beside its
baseline, the same sync-only loop.
"""

import argparse
import os
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, CaseFailed, Ranks, launch, progress, save, table  # noqa: E402

WORLD = 2
MODELS = {
    "a": {"desc": "MLP, 50 layers of 256x256", "width": 256, "depth": 50, "batch": 32},
    "b": {"desc": "3 layers of 2048x2048", "width": 2048, "depth": 3, "batch": 32},
}
METHODS = ["pybridge", "torch_ddp", "naive", "flat"]
# Communication hooks, each beside torch DDP with the same hook: (hook, PowerSGD rank).
HOOKS = {"fp16": ("fp16", 0), "powersgd1": ("powersgd", 1), "powersgd4": ("powersgd", 4)}
HOOK_METHODS = [f"{who}_{h}" for h in HOOKS for who in ("pybridge", "torch_ddp")]
# Inside a Join context (every rank has the same steps: what joining costs those training).
JOIN_METHODS = ["pybridge_join", "torch_ddp_join"]
LABELS = {
    "pybridge": "pybridge reducer (DDP wrapper)",
    "torch_ddp": "torch DDP (bucket_cap_mb=25)",
    "naive": "naive per-parameter allreduce",
    "flat": "flatten + one allreduce",
    **{f"pybridge_{h}": f"pybridge, {h} hook" for h in HOOKS},
    **{f"torch_ddp_{h}": f"torch DDP, {h} hook" for h in HOOKS},
    "pybridge_join": "pybridge, in a Join context",
    "torch_ddp_join": "torch DDP, in a Join context",
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
    from pybridge.ddp.wrapper import DistributedDataParallel as PDDP
    from torch.nn.parallel import DistributedDataParallel as TDDP

    params = list(model.parameters())
    base, hook = split_method(method)
    if base == "pybridge":
        wrapped = PDDP(model, bucket_cap_mb=25)
    elif base == "torch_ddp":
        wrapped = TDDP(model, bucket_cap_mb=25)
    else:
        wrapped = model
    if hook == "join":  # what torch's Join context sets up on entry; steps stay even
        from torch.distributed.algorithms.join import Join
        Join([wrapped])
    elif hook:  # torch's own hook on both wrappers, so the rows compare the reducers
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


def method_rank(rank, conn, method, key, threads):
    """One rank of one method's own 2-rank job (bench/common.py's Ranks). Answers the parent
    over `conn`: first (rank 0's gradients after one step, to check that every method computes
    the same thing; that step's seconds), then, for each request of n, the times of n steps;
    None ends it."""
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
    t0 = time.perf_counter()
    step(x)
    first = time.perf_counter() - t0
    conn.send(([p.grad.clone() for p in model.parameters()] if rank == 0 else None, first))
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


# Seconds a method's pair may take to start (import torch, rendezvous, first step) on a
# loaded machine; after that a request of n steps may take 10x the first step's time per
# step, and at least --case-timeout: a pair that exceeds it is recorded as failed, killed.
START_TIMEOUT = 300


def run_methods(key, threads, rounds, iters, methods, case_timeout):
    """({method: [rank 0's step seconds, rank 1's]}, {method: bytes sent per step}, {method:
    why it failed}) for model `key`.

    Each method runs in its own pair of processes, so that one method's heap and caches
    (freed gradients, trimmed or not; the other models' tensors) cannot slow another down:
    run in one process, methods moved page faults onto each other. They still take turns,
    round by round, so machine noise hits all of them; the idle pairs block on their pipes.
    A pair that dies, raises or hangs is killed and its row recorded as failed; the rest go on."""
    import torch
    cases, grads, first, failed = {}, {}, {}, {}

    def fail(m, why):
        failed[m] = str(why)
        progress(f"({key}) {m}: FAILED: {why}")
        cases.pop(m, None)

    try:
        for m in methods:
            # One pair at a time, each up and running (its store bound, its first step done)
            # before the next picks a free port: started together, pairs could take each
            # other's ports and talk across (gloo aborted with a size mismatch).
            t0 = time.monotonic()
            cases[m] = Ranks(method_rank, WORLD, (m, key, threads), name=m)
            try:
                answers = cases[m].ask(START_TIMEOUT)
            except CaseFailed as e:
                fail(m, e)
                continue
            grads[m], first[m] = answers[0][0], max(a[1] for a in answers)
            progress(f"({key}) {m}: started, first step {first[m] * 1e3:.0f} ms "
                     f"({time.monotonic() - t0:.1f} s)")
        for m in list(cases):
            # Same work everywhere: after one step every method holds the same averaged gradients
            # (a hook's first step: fp16 rounding; PowerSGD starts compressing at step 2).
            if "torch_ddp" not in grads:
                break  # nothing to compare with: its row says why
            tol = dict(rtol=1e-2, atol=1e-3) if m.endswith("fp16") else dict(rtol=1e-4, atol=1e-6)
            if not all(torch.allclose(g, ref, **tol) for g, ref in zip(grads[m], grads["torch_ddp"])):
                cases[m].kill()
                fail(m, f"gradients differ from torch DDP's on model {key}")
        del grads
        times = {m: [[] for _ in range(WORLD)] for m in methods}
        sent = {m: [] for m in methods}
        for r in range(rounds):
            for m in methods[r % len(methods):] + methods[:r % len(methods)]:
                if m not in cases:
                    continue
                before, t0 = loopback_bytes(), time.monotonic()
                try:
                    got = cases[m].ask(max(case_timeout, 10 * first[m] * (iters + 1)), iters)
                except CaseFailed as e:
                    fail(m, e)
                    continue
                after = loopback_bytes()
                for rank in range(WORLD):
                    times[m][rank].extend(got[rank])
                if before is not None and after is not None:  # + 1: the warm-up step
                    sent[m].append((after - before) / (iters + 1) / WORLD)
                slower = max(statistics.median(t) for t in got)
                progress(f"({key}) round {r + 1}/{rounds} {m}: {iters} steps, median {slower * 1e3:.1f} ms "
                         f"({time.monotonic() - t0:.1f} s)")
        for case in cases.values():
            case.close()
        return times, sent, failed
    finally:
        for case in cases.values():
            case.kill()


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
        try:
            launch([GO_BIN, prefix, str(rounds), str(iters), str(threads)], WORLD, 600)
        except SystemExit as e:  # launch's one way to fail (ranks died or timed out)
            return "failed: " + str(e).strip().splitlines()[0]
        out = []
        for r in range(WORLD):
            with open(f"{prefix}-{r}.json") as f:
                out.append(json.load(f))
    return out


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (default: cores / ranks)")
    ap.add_argument("--models", default=",".join(MODELS), help="which models, e.g. 'b' (default a,b)")
    ap.add_argument("--rounds", type=int, default=0, help="rounds of all methods (default 6, --quick 2)")
    ap.add_argument("--iters", type=int, default=0, help="timed steps per method per round (default a:10, b:5)")
    ap.add_argument("--no-go", action="store_true", help="skip the Go rows")
    ap.add_argument("--no-hooks", action="store_true", help="skip the fp16 and PowerSGD hook rows")
    ap.add_argument("--no-join", action="store_true", help="skip the rows in a Join context")
    ap.add_argument("--case-timeout", type=float, default=30,
                    help="seconds a method's pair may take for one round before its row is recorded "
                         "as failed and its ranks killed (at least 10x its first step; default 30)")
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
    results, sent, failures = {}, {}, {}
    methods = METHODS + ([] if args.no_hooks else HOOK_METHODS) + ([] if args.no_join else JOIN_METHODS)
    for key in models:
        print(f"model ({key}): {len(methods)} methods, each in its own pair of ranks, taking turns "
              "(progress on stderr)...", flush=True)
        results[key], sent[key], failures[key] = run_methods(key, threads, rounds, iters[key], methods,
                                                             args.case_timeout)

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
        ddp = med.get("torch_ddp")
        rows = {m: {"step_ms": None, "failed": failures[key][m]} for m in methods if m not in ok}
        ratio = lambda a, b: None if a is None or b is None else round(a / b, 3)  # noqa: E731
        for m in ok:  # a hook row is compared with torch DDP running the same hook (or plain DDP)
            who, hook = split_method(m)
            base = med.get(f"torch_ddp_{hook}") if who == "pybridge" and hook else ddp
            mib = statistics.median(sent[key][m]) / 2**20 if sent[key][m] else None
            rows[m] = {"step_ms": round(med[m] * 1e3, 3), "vs_torch_ddp": ratio(med[m], base),
                       "naive_over_this": ratio(med.get("naive"), med[m]),
                       "sent_mib_per_rank_step": None if mib is None else round(mib, 3)}
        fmt = lambda v, f: "" if v is None else f.format(v)  # noqa: E731
        lines = [[LABELS[m], "failed", "", "", ""] if m not in ok else
                 [LABELS[m], f"{rows[m]['step_ms']:.2f}", fmt(rows[m]["vs_torch_ddp"], "{:.2f}x"),
                  fmt(rows[m]["naive_over_this"], "{:.2f}x"), fmt(rows[m]["sent_mib_per_rank_step"], "{:.2f}")]
                 for m in methods]
        if key == "a" and go_results is not None:
            add_go_rows(go_results, med, rows, lines)
        report["models"][key] = {"desc": cfg["desc"], "batch_per_rank": cfg["batch"], "rows": rows}
        print(f"\n({key}) {cfg['desc']}, batch {cfg['batch']} per rank\n")
        print(table(["method", "step ms", "vs torch DDP", "naive / this", "MiB sent/rank/step"], lines))
        for m in methods:
            if m not in ok:
                print(f"failed: {LABELS[m]}: {rows[m]['failed']}")
    print("\nvs torch DDP: step time / DDP's, with the same hook for hook rows (< 1 is faster); naive / "
          "this: how many times faster than the per-parameter loop; MiB sent: loopback bytes during the "
          "timed steps / steps / ranks (TCP overhead included)")
    if go_results is not None:
        print("Go rows: forward and backward are plain scalar Go loops (no BLAS, no SIMD), so the Go "
              "step time mostly measures Go's matmul against torch's; 'exposed sync' is the time "
              "left in Wait after backward, 'sync only' marks all 100 gradients and waits, no compute.")
    # A partial run (--models, --no-go) or a smoke run (--quick) must not overwrite the full results.
    partial = models != list(MODELS) or go_results is None or args.no_hooks or args.no_join
    path = save("reducer" + ("-" + "".join(models) if partial else "") + ("-quick" if args.quick else ""), report)
    print(f"wrote {os.path.relpath(path)} in {time.time() - start:.0f} s")


def add_go_rows(go_results, med, rows, lines):
    if isinstance(go_results, str):
        rows["go_reducer"] = {"step_ms": None, "note": go_results}
        lines.append(["Go reducer (C ABI), plain-Go fwd+bwd", go_results, "", "", ""])
        return
    gmed = {k: max(statistics.median(go_results[r][k]) for r in range(WORLD))
            for k in ("step", "wait", "sync_only", "sync_only_join")}
    ddp, naive = med.get("torch_ddp"), med.get("naive")  # None: that row failed
    vs = None if ddp is None else gmed["step"] / ddp
    naive_over = None if naive is None else naive / gmed["step"]
    rows["go_reducer"] = {
        "step_ms": round(gmed["step"] * 1e3, 3), "vs_torch_ddp": None if vs is None else round(vs, 3),
        "naive_over_this": None if naive_over is None else round(naive_over, 3),
        "exposed_sync_wait_ms": round(gmed["wait"] * 1e3, 3),
        "sync_only_ms": round(gmed["sync_only"] * 1e3, 3),
        "sync_only_join_ms": round(gmed["sync_only_join"] * 1e3, 3),
        "note": "forward/backward in plain scalar Go loops; the reducer marks each layer's "
                "gradients ready as backward produces them"}
    lines.append(["Go reducer (C ABI), plain-Go fwd+bwd", f"{gmed['step'] * 1e3:.2f}",
                  "" if vs is None else f"{vs:.2f}x", "" if naive_over is None else f"{naive_over:.2f}x", ""])
    lines.append(["  of which exposed sync (Wait after backward)", f"{gmed['wait'] * 1e3:.2f}", "", "", ""])
    lines.append(["Go reducer, sync only (mark 100 grads + Wait)", f"{gmed['sync_only'] * 1e3:.2f}", "", "", ""])
    lines.append(["  the same WithJoin (+ the count allreduce)", f"{gmed['sync_only_join'] * 1e3:.2f}", "", "", ""])


if __name__ == "__main__":
    main()
