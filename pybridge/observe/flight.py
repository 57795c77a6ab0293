"""Hang dumps in the format of torch's Flight Recorder, so that torch's own analyzer
(`python -m torch.distributed.flight_recorder.fr_trace DIR/fr -p rank_`) reads a pybridge
job, Go and C ranks included.

The recorder keeps the latest collectives of every group (`Recorder.flight`, a ring); on a
hang (the watchdog sees a collective stuck, or a rank asks the others where they are) each
live rank writes `DIR/fr/rank_<R>`: a pickle of {version, pg_config, pg_status, entries}
with one entry per collective as torch's recorder writes them (profiling_name
"gloo:all_reduce", collective_seq_id = pybridge's #seq, sizes, dtypes, state). torch's
recorder also records gloo in this torch, but its dump names the group '' in pg_config
and '0' in the entries, and its analyzer then fails with a KeyError: pybridge writes its
own.
"""

import os
import pickle
import threading

VERSION = "2.10"  # the dump format torch 2.13 writes and fr_trace reads
_DTYPE_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                "int8": "Char", "uint8": "Byte", "int32": "Int", "int64": "Long"}


def _dtype_name(op):
    from ..base import dtypes
    dt = dtypes.BY_CODE.get(op.dtype)
    return _DTYPE_NAMES.get(str(dt).replace("torch.", ""), "Float") if dt is not None else "Float"


def _sizes(op):
    """(input sizes, output sizes) as torch's recorder lists them."""
    if op.count2 >= 0:
        return [[op.count]], [[op.count2]]
    return ([[op.count]], [[op.count]]) if op.count else ([], [])


def entries(ring, pg_ids, anchor):
    """The ring's entries ([group, seq, op, issued µs, done µs or None]) as torch's recorder
    writes them; `anchor` (monotonic µs, wall µs read together) gives each its wall time."""
    mono, wall = anchor
    out = []
    for record_id, (g, seq, op, issued, done) in enumerate(list(ring)):
        wall_ns = int((issued - mono + wall) * 1000)
        ins, outs = _sizes(op)
        dtype = _dtype_name(op) if op.count else None
        out.append({
            "record_id": record_id, "pg_id": pg_ids.setdefault(g.uid, len(pg_ids)),
            "process_group": (g.uid, g.describe()), "thread_name": "pybridge", "thread_id": str(threading.get_ident()),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"{g.backend}:{op.name}", "time_created_ns": wall_ns,
            "input_sizes": ins, "input_dtypes": [dtype] * len(ins), "output_sizes": outs,
            "output_dtypes": [dtype] * len(outs), "state": "completed" if done is not None else "started",
            "time_discovered_started_ns": wall_ns, "time_discovered_completed_ns": None,
            "retired": done is not None, "timeout_ms": int(g.timeout * 1000), "is_p2p": False, "frames": []})
    return out


def dump(rec, reason):
    """Write this rank's dump into rec.dir/fr/rank_<R>; returns its path."""
    ring = list(rec.flight)
    pg_ids = {}
    groups = {}
    for g, *_ in ring:
        groups.setdefault(g.uid, g)
    data = {"version": VERSION, "comm_lib_version": "pybridge", "reason": reason,
            "entries": entries(ring, pg_ids, rec.anchor),
            "pg_config": {uid: {"name": uid, "desc": g.describe(), "ranks": str(list(g.ranks))}
                          for uid, g in groups.items()},
            "pg_status": {}}
    folder = os.path.join(rec.dir, "fr")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank_{rec.rank}")
    with open(f"{path}.tmp", "wb") as f:
        pickle.dump(data, f)
    os.replace(f"{path}.tmp", path)
    return path
