"""How long survivors take to get an error when rank 0, the store's host, is missing or goes
away (issue 13 item 8), beside torch's own rendezvous in the same run.

3 ranks on loopback, gloo. Scenarios:
  init, rank 0 never starts   ranks 1 and 2 call init (pybridge, and torch's
                              init_process_group(env://) as the baseline)
  rank 0 killed, all_reduce    rank 0 SIGKILLs itself after init; the others all_reduce
  rank 0 killed, store add     ... the others add to the group's store (dynamic loader's op)
  rank 0 stopped, all_reduce   rank 0 SIGSTOPs itself (a host that vanished without closing
                              its connections); the others all_reduce
  rank 0 stopped, store add    ... the others add to the store
  rank 0 stopped, new_group    ... ranks 1 and 2 make a subgroup (its rendezvous uses the store)
The figure is the slowest survivor's seconds from its call to its error. Goal: within the
timeout + 5 s in every scenario.
"""

import os
import signal
import subprocess
import sys
import time

from common import ROOT, free_port, save, table

TIMEOUTS = (5.0, 10.0)
WORLD = 3


def rank_main(scenario, timeout, impl):
    import datetime

    import torch
    import torch.distributed as dist

    import pybridge
    rank = int(os.environ["RANK"])
    t0 = time.monotonic()
    try:
        if scenario == "init-missing-rank0":
            if impl == "torch":
                dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=timeout))
            else:
                pybridge.init(backend="gloo", timeout=timeout)
            print("RESULT no-error", flush=True)
            return
        g = pybridge.init(backend="gloo", timeout=timeout)
        pybridge.all_reduce(torch.ones(1))
        if rank == 0:
            os.kill(os.getpid(), signal.SIGKILL if "killed" in scenario else signal.SIGSTOP)
        time.sleep(0.5)  # rank 0 is gone by now
        t0 = time.monotonic()
        if scenario.endswith("allreduce"):
            pybridge.all_reduce(torch.ones(1))
        elif scenario.endswith("new-group"):
            pybridge.new_group([1, 2])
        else:
            g.store.add("bench", 1)
        print("RESULT no-error", flush=True)
    except Exception as exc:  # noqa: BLE001 - the error is what is measured
        print(f"RESULT {time.monotonic() - t0:.3f} {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    finally:
        sys.stdout.flush()
        os._exit(0)


def run(scenario, timeout, impl="pybridge"):
    """Seconds until the slowest survivor got its error (None if one never did within the cap)."""
    port = str(free_port())
    ranks = range(1, WORLD) if scenario == "init-missing-rank0" else range(WORLD)
    procs = {}
    for r in ranks:
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(r),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "PYTHONPATH": ROOT}
        procs[r] = subprocess.Popen([sys.executable, __file__, "--rank", scenario, str(timeout), impl], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    cap = 4 * timeout + 30
    worst, texts = 0.0, []
    for r, p in procs.items():
        if r == 0 and scenario != "init-missing-rank0":
            continue
        try:
            out, _ = p.communicate(timeout=cap)
        except subprocess.TimeoutExpired:
            worst = None
            continue
        line = next((x for x in out.splitlines() if x.startswith("RESULT ")), "RESULT none")
        fields = line.split(" ", 2)
        texts.append(fields[-1])
        if worst is not None:
            worst = max(worst, float(fields[1])) if fields[1] not in ("none", "no-error") else None
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.wait()
    return worst, texts


def main():
    rows, results = [], []
    cases = [("init-missing-rank0", t, impl) for t in TIMEOUTS for impl in ("torch", "pybridge")]
    cases += [(s, TIMEOUTS[0], "pybridge") for s in ("killed-allreduce", "killed-store-add", "stopped-allreduce",
                                                     "stopped-store-add", "stopped-new-group")]
    for scenario, timeout, impl in cases:
        took, texts = run(scenario, timeout, impl)
        shown = "no error" if took is None else f"{took:.2f}"
        rows.append([scenario, impl, f"{timeout:g}", shown, "-" if took is None else f"{took / timeout:.2f}"])
        results.append({"scenario": scenario, "impl": impl, "timeout_s": timeout, "seconds": took,
                        "errors": texts})
        print(table(["scenario", "impl", "timeout s", "error after s", "x timeout"], rows[-1:]), flush=True)
    print()
    print(table(["scenario", "impl", "timeout s", "error after s", "x timeout"], rows))
    save("failures", {"world": WORLD, "results": results})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], float(sys.argv[3]), sys.argv[4])
    else:
        main()
