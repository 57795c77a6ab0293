"""One whole line of a rank's result on stdout, whatever other ranks write beside it.

Ranks of one node share their launcher's stdout pipe. print() writes the text and its
newline in two system calls when stdout is unbuffered (as under torchrun), so another
rank's line could land between them (a cluster test once read two JSON objects on one
line). One os.write of a line shorter than PIPE_BUF (4096 bytes) is atomic on a pipe."""

import json
import os
import select

PIPE_BUF = getattr(select, "PIPE_BUF", 4096)


def emit(tag, obj):
    line = f"{tag} {json.dumps(obj)}\n".encode()
    if len(line) > PIPE_BUF:
        raise ValueError(f"a {tag} line of {len(line)} bytes would not be written atomically (max {PIPE_BUF})")
    os.write(1, line)
