"""Run a function on N real ranks (separate processes) with a fresh rendezvous, bounded in time.

A hang or crash fails the calling test within `timeout` seconds and shows every rank's output.

The ranks are forked from multiprocessing's fork server, which has imported torch (and
torch._dynamo, which torch.optim pulls in) once:
re-importing torch in every rank (what the "spawn" method does) costs about 1.5 s of CPU
a rank, most of a multi-rank test's time on 2 cores. Nothing else is shared: the fork
server is a fresh interpreter that has only imported torch (no threads, no process group),
and each rank imports pybridge and the test's module itself and gets the caller's
environment as it is when run_ranks is called, as a spawned rank would.
"""

import atexit
import gc
import multiprocessing as mp
import os
import tempfile
import traceback


from pybridge.base.netif import free_port  # noqa: E402,F401 - the tests' one port picker


class RanksFailed(AssertionError):
    pass


def _context():
    ctx = mp.get_context("forkserver")
    # The server imports these once; preloading is best effort. torch._dynamo too: a rank's
    # first optimizer (any torch function wrapped in torch._disable_dynamo) imports it, about
    # 1.2 s of CPU a rank (58 of a suite's 300 forked ranks: 52 s of its 2 cores, measured).
    ctx.set_forkserver_preload(["torch", "torch._dynamo"])
    return ctx


def _child(fn, rank, world, env, log_path, queue, args):
    # The objects the fork server made (torch's modules, about 285,000) are never garbage:
    # frozen, the collector skips them. Otherwise each full collection (finalize() runs one)
    # walked them all and wrote to each, copying the shared pages into this process: 0.16 s
    # of CPU and 16,000 page copies a rank, measured. Objects the rank makes are collected.
    gc.freeze()
    log = open(log_path, "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.environ.clear()  # the fork server's environment is the one it started with
    os.environ.update(env)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    try:
        result = fn(rank, world, *args)
        queue.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        traceback.print_exc()
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        # A forked process leaves with os._exit, which skips the atexit handlers that a
        # spawned one runs on its way out (pybridge's among them): run them here.
        atexit._run_exitfuncs()


def run_ranks(fn, world, *args, timeout=60.0, env=None, expect_fail=(), only=None):
    """Run fn(rank, world, *args) on `world` spawned ranks; return the results by rank.

    MASTER_ADDR/MASTER_PORT (a free port), RANK, WORLD_SIZE and LOCAL_RANK are set as a
    launcher would. Ranks in `expect_fail` may die or raise; their result is None.
    `only` starts just those ranks (to simulate peers that never join); the others' result is None.
    """
    started = sorted(only) if only is not None else list(range(world))
    ctx = _context()
    queue = ctx.Queue()
    base_env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **(env or {})}
    with tempfile.TemporaryDirectory() as tmp:
        logs = [os.path.join(tmp, f"rank{r}.log") for r in range(world)]
        procs = {r: ctx.Process(target=_child, args=(fn, r, world, base_env, logs[r], queue, args))
                 for r in started}
        for p in procs.values():
            p.start()
        results, errors = {}, {}
        import time
        deadline = time.monotonic() + timeout
        pending = set(started)
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RanksFailed(f"ranks {sorted(pending)} did not finish within {timeout}s"
                                      + _logs(logs))
                try:
                    rank, status, value = queue.get(timeout=min(left, 0.5))
                except Exception:  # queue.Empty
                    dead = [r for r in pending if not procs[r].is_alive() and procs[r].exitcode is not None]
                    for r in dead:
                        # Allow a moment for a result queued just before exit.
                        if r in expect_fail:
                            pending.discard(r)
                            results[r] = None
                        elif procs[r].exitcode != 0:
                            raise RanksFailed(f"rank {r} died with exit code {procs[r].exitcode}"
                                              + _logs(logs))
                    continue
                pending.discard(rank)
                if status == "ok":
                    results[rank] = value
                elif rank in expect_fail:
                    results[rank] = None
                else:
                    errors[rank] = value
            if errors:
                raise RanksFailed("".join(f"\n--- rank {r} raised:\n{e}" for r, e in sorted(errors.items()))
                                  + _logs(logs))
            return [results.get(r) for r in range(world)]
        finally:
            for p in procs.values():
                p.join(timeout=2)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=2)


def _logs(paths):
    out = []
    for r, path in enumerate(paths):
        if not os.path.exists(path):
            continue
        try:
            with open(path) as f:
                text = f.read()[-4000:]
        except OSError:
            text = "(no output)"
        out.append(f"\n--- rank {r} output:\n{text}")
    return "".join(out)
