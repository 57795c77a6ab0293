"""Helpers shared by the benchmarks: free ports, launching ranks, tables and JSON results."""

import json
import os
import platform
import select
import socket
import subprocess
import sys
import tempfile
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


class Ranks:
    """`world` rank processes of `cmd` kept alive between samples, so that several
    implementations can take turns sample by sample: each waits on its stdin, without
    using the CPU, while another one is timed.

    Protocol: `sample(line)` writes `line` to every rank; each rank runs that sample
    (the ranks synchronise among themselves) and answers with a line "sample SECONDS"
    (other output is passed through to stderr); rank 0's seconds are returned. Closing
    writes "quit" and waits for every rank to exit.
    """

    def __init__(self, cmd, world, timeout, extra_env=None):
        self.cmd, self.timeout = cmd, timeout
        port = str(free_port())
        self.logs = [tempfile.TemporaryFile("w+") for _ in range(world)]
        self.procs = []
        for rank in range(world):
            env = {**os.environ, **(extra_env or {}), "RANK": str(rank), "WORLD_SIZE": str(world),
                   "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            self.procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=self.logs[rank], text=True, bufsize=1))

    def sample(self, line):
        for p in self.procs:
            p.stdin.write(line + "\n")
            p.stdin.flush()
        answers = [self._answer(rank) for rank in range(len(self.procs))]
        return float(answers[0])

    def _answer(self, rank):
        p = self.procs[rank]
        while True:
            ready, _, _ = select.select([p.stdout], [], [], self.timeout)
            line = p.stdout.readline() if ready else ""
            if line.startswith("sample "):
                return line.split()[1]
            if not line:
                self.kill()
                why = f"timed out after {self.timeout}s" if not ready else f"exited ({p.wait()})"
                self.logs[rank].seek(0)
                raise SystemExit(f"rank {rank} of {self.cmd} {why}:\n{self.logs[rank].read()[-4000:]}")
            sys.stderr.write(line)

    def kill(self):
        for p in self.procs:
            p.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            try:
                p.stdin.write("quit\n")
                p.stdin.close()
            except OSError:
                pass  # already gone: its exit status tells
        deadline = time.monotonic() + self.timeout
        for rank, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise SystemExit(f"rank {rank} of {self.cmd} did not exit after quit") from None
            if p.returncode != 0 and exc[0] is None:
                self.logs[rank].seek(0)
                raise SystemExit(f"rank {rank} of {self.cmd} failed ({p.returncode}):\n"
                                 f"{self.logs[rank].read()[-4000:]}")
        return False


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
    return path


def human_bytes(n):
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} GiB"
