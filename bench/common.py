"""Helpers shared by the benchmarks: free ports, launching ranks, tables and JSON results."""

import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
if ROOT not in sys.path:  # benchmark this checkout, whatever an editable install points at
    sys.path.insert(1, ROOT)


from pybridge.base.netif import free_port  # noqa: E402,F401 - below the ephemeral range


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


def reports(outs, prefix, what):
    """Each rank's JSON report: the line of its output that starts with `prefix`."""
    ranks = []
    for rank, out in enumerate(outs):
        line = next((ln for ln in out.splitlines() if ln.startswith(prefix)), None)
        if line is None:
            raise SystemExit(f"rank {rank} of {what} reported nothing:\n{out}")
        ranks.append(json.loads(line[len(prefix):]))
    return ranks


class CaseFailed(Exception):
    """A benchmark case whose ranks died, raised or stopped answering; its ranks are gone.
    str() is one line saying why."""


class _Raised(str):
    """What a rank sends instead of an answer when its target raised."""


def _rank_main(target, rank, world, port, conn, log, args):
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)  # tracebacks and native aborts (gloo's 'terminate called') land in the log
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    try:
        target(rank, conn, *args)
    except BaseException as e:
        traceback.print_exc()
        try:
            conn.send(_Raised(f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        os._exit(1)  # not sys.exit: no waiting on threads that may sit in a dead collective


class Ranks:
    """One benchmark case: `world` spawned processes running target(rank, conn, *args) on a
    fresh port, each talking to the driver over its pipe `conn`. Every wait is bounded: a
    rank that exits, raises or does not answer in time ends the case (all its ranks are
    killed, so none stays stuck in a collective with a dead peer) with CaseFailed."""

    def __init__(self, target, world, args=(), name="case"):
        self.name = name
        self.logs = tempfile.mkdtemp(prefix="bench-ranks-")
        ctx = mp.get_context("spawn")
        port = free_port()
        self.ranks = []
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, daemon=True, args=(
                target, rank, world, port, child, os.path.join(self.logs, f"rank{rank}.log"), args))
            proc.start()
            child.close()  # the rank's end: closed here, so a dead rank reads as EOF
            self.ranks.append((proc, parent))

    def ask(self, timeout, message=None):
        """Send `message` (unless None) to every rank and return their answers, rank by rank."""
        deadline = time.monotonic() + timeout
        if message is not None:
            for rank, (_, conn) in enumerate(self.ranks):
                try:
                    conn.send(message)
                except OSError:
                    self.fail(f"rank {rank} is gone")
        return [self._answer(rank, deadline, timeout) for rank in range(len(self.ranks))]

    def _answer(self, rank, deadline, timeout):
        proc, conn = self.ranks[rank]
        while not conn.poll(0.2):
            for other, (p, _) in enumerate(self.ranks):  # any rank gone: the others may wait on it
                if p.exitcode is not None:
                    self._gone(other)
            if time.monotonic() > deadline:
                self.fail(f"no answer from rank {rank} within {timeout:.0f} s (hung)")
        try:
            got = conn.recv()
        except (EOFError, OSError):
            self._gone(rank)
        if isinstance(got, _Raised):
            self.fail(f"rank {rank} raised {tidy(got, 100)}")
        return got

    def _gone(self, rank):
        """Fail the case for a rank that exited, with its last words if it sent any."""
        proc, conn = self.ranks[rank]
        proc.join(timeout=5)
        try:
            last = conn.recv() if conn.poll(0) else None
        except (EOFError, OSError):
            last = None
        if isinstance(last, _Raised):
            self.fail(f"rank {rank} raised {tidy(last, 100)}")
        self.fail(f"rank {rank} {exit_words(proc.exitcode)}")

    def fail(self, why):
        detail = self.error_line()
        self.kill()
        raise CaseFailed(why + (f" (rank log: {detail})" if detail and detail not in why else ""))

    def error_line(self):
        """The ranks' logs' root cause in one short line, or '': a native abort's what() (an
        aborted rank's peers only see the connection drop), else the last error-like line."""
        found = {"what():": "", "rror": ""}
        for name in sorted(os.listdir(self.logs)):
            with open(os.path.join(self.logs, name), errors="replace") as f:
                for line in f:
                    for word in found:
                        if word in line:
                            found[word] = found[word] or line if word == "what():" else line
        return tidy(found["what():"] or found["rror"])

    def close(self, message=None, timeout=30):
        """Send the ranks `message` (their cue to finish), give them `timeout` s, then kill."""
        for _, conn in self.ranks:
            try:
                conn.send(message)
            except OSError:
                pass
        for proc, _ in self.ranks:
            proc.join(timeout=timeout)
        self.kill()

    def kill(self):
        for proc, _ in self.ranks:
            if proc.is_alive():
                proc.kill()
        for proc, conn in self.ranks:
            proc.join(timeout=10)
            conn.close()
        shutil.rmtree(self.logs, ignore_errors=True)


def tidy(message, limit=160):
    """An error message on one short line: torch's nested callback wrappers and C++ source
    locations dropped, whitespace collapsed, cut at `limit` characters."""
    text = str(message).replace("Got the following error when running the callback: ", "")
    text = re.sub(r"\[(enforce fail at )?[^\]]*\.(cc|cpp|h|hpp):\d+\] ", "", text)
    text = re.sub(r"(\b\w+Error: )(?:\w+Error: )+", r"\1", text)  # RuntimeError: RuntimeError: x
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def exit_words(code):
    """'exited with status 1' or 'was killed by SIGABRT' for a process's exit code."""
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exited with status {code}"


def progress(msg):
    """One line on stderr, so that a long benchmark is visibly alive."""
    print(msg, file=sys.stderr, flush=True)


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
