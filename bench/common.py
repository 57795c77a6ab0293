"""Helpers shared by the benchmarks: free ports, launching ranks, tables and JSON results."""

import json
import os
import platform
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
if ROOT not in sys.path:  # benchmark this checkout, whatever an editable install points at
    sys.path.insert(1, ROOT)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd, world, timeout, extra_env=None):
    """Run `cmd` as `world` ranks on loopback; fail loudly (with output) if any rank fails."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {**os.environ, **(extra_env or {}), "RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"benchmark ranks {cmd} timed out after {timeout}s")
        outputs.append(out)
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            raise SystemExit(f"rank {rank} of {cmd} failed ({p.returncode}):\n{out}")
    return outputs


def table(headers, rows):
    """A plain-text (and Markdown) table."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in cells])


def save(name, payload):
    os.makedirs(RESULTS, exist_ok=True)
    payload = {"benchmark": name, "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                              "python": sys.version.split()[0]},
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **payload}
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    import charts  # bench/ is on sys.path: benchmarks run as scripts from it
    chart = charts.draw(name, payload)
    if chart:
        print("chart:", chart)
    return path


def human_bytes(n):
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} GiB"
