"""The ranks' output on the launcher's console: whole lines, each with its rank's prefix.

torchrun (`--tee 3`) writes each rank's stdout and stderr to its log files and copies them
to the console from there (torch.distributed.elastic.multiprocessing.tail_log), a line at a
time with the rank's prefix. Its copier reads up to the end of the file, which can end in
the middle of a line (a C program's stdio writes a file in 4 KiB blocks, a progress bar
its line in pieces): the piece went out with a prefix, another rank's line could follow,
and the rest of the line came later with a prefix of its own. Its console writes were also
left in the launcher's buffer (a pipe or a SLURM output file is block-buffered) until it
had 8 KiB or exited. install() puts in a copier that holds a piece until its line is
complete (or the rank has exited), writes under one lock, and flushes each time it has
caught up with the file; with prefix=False it copies the lines as the rank wrote them.
"""

import functools
import os
import threading
import time

_lock = threading.Lock()


def template(node=None):
    """torchrun's log-line prefix template (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE; torch
    fills in ${rank}): "[rank3]:" on one node, "[node1 rank3]:" across nodes, where node is
    the node rank, or this host's name when the rendezvous gives the node its rank later."""
    if node is None:
        return "[rank${rank}]:"
    return "[%s rank${rank}]:" % (f"node{node}" if isinstance(node, int) else str(node).replace("$", "$$"))


def copy_lines(header, file, dst, finished, interval_sec, log_line_filter=None, prefix=True):
    """torch's tail_logfile(), keeping lines whole (see the module's docstring)."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)
    header = header if prefix else ""
    piece = ""
    with open(file, errors="replace") as fp:
        while True:
            line = fp.readline()
            if line and not line.endswith("\n"):
                piece += line  # the rest of the line is not written yet
                line = ""
                if not finished.is_set():
                    time.sleep(interval_sec)
                    continue
            elif line:
                line, piece = piece + line, ""
            if line:
                if log_line_filter is None or log_line_filter(line):
                    with _lock:
                        dst.write(header + line)
                continue
            # caught up with the file
            if finished.is_set():
                if piece:  # the rank ended without a newline
                    with _lock:
                        dst.write(header + piece + "\n")
                break
            with _lock:
                dst.flush()
            time.sleep(interval_sec)
    with _lock:
        dst.flush()


def install(prefix=True):
    """Make torchrun's log tailer copy_lines (imports torch: call after the cheap checks)."""
    from torch.distributed.elastic.multiprocessing import tail_log
    tail_log.tail_logfile = functools.partial(copy_lines, prefix=prefix)
