"""Observability from a plain C program on two ranks (tests/c/observe.c): with recording off
every call is a no-op returning PB_OK; pb_observe_start before pb_init records from there;
the program's spans, instants, scalars and steps, the collectives (by sequence number) and a
reducer's buckets are in each rank's trace and metrics files; bad input is
PB_ERR_INVALID_ARGUMENT naming the problem in C's words."""

import json
import os
import subprocess

import pytest

from capi_loader import LIB_PATH, ROOT, pybridge_flags, run_two_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")

STEPS = 3  # tests/c/observe.c's training steps
ENDED = STEPS  # the first reducer iteration's step is the one the first pb_step_end ends


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("observe-c")
    exe, trace = d / "observe", d / "trace"
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", str(exe), os.path.join(ROOT, "tests/c/observe.c"),
                    *pybridge_flags()], check=True)
    return trace, run_two_ranks(exe, trace)  # a bare environment: no PYBRIDGE_TRACE


def test_calls_and_bad_input_from_c(run):
    _, ranks = run
    for rank, (code, out) in enumerate(ranks):
        assert code == 0 and "observe: 0 failed checks" in out, f"rank {rank} exited {code}:\n{out}"


@pytest.mark.parametrize("rank", [0, 1])
def test_the_rank_files_hold_what_c_recorded(run, rank):
    trace, ranks = run
    assert ranks[rank][0] == 0, ranks[rank][1]
    doc = json.load(open(trace / f"rank{rank}.trace.json"))
    header, events = doc["otherData"]["pybridge"], doc["traceEvents"]
    assert (header["rank"], header["world_size"], header["steps"], header["clock_synced"]) == (rank, 2, ENDED, True)
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    program = [e for e in events if e.get("tid") == 1 and e["ph"] != "M"]
    assert tracks[1] == "program"
    spans = [(e["name"], e["cat"]) for e in program if e["ph"] == "X" and e["name"] != "reducer.wait"]
    assert spans == [("forward", "forward"), ("backward", "compute"), ("train_step", "user")] * STEPS \
        + [("twice", "user")], spans
    assert [(e["name"], e["cat"]) for e in program if e["ph"] == "i"] == [("epoch_end", "user")]
    counters = [(e["name"], e["args"]) for e in program if e["ph"] == "C"]
    losses = [1.5 + s + 0.25 * rank for s in range(STEPS)]
    assert counters == [("loss", {"loss": v}) for v in losses] + [("accuracy", {"accuracy": 0.875})], counters
    steps = [e["args"]["step"] for e in events if e.get("tid") == 2 and e["name"] == "step"]
    assert steps == list(range(1, ENDED + 1))
    # The collectives, numbered in the order issued: no gap, no repeat. Each step: the
    # program's all_reduce and the reducer's bucket (also an all_reduce); then the barrier.
    comm = sorted((e for e in events if e["ph"] == "X" and tracks[e["tid"]].startswith("collectives")),
                  key=lambda e: e["args"]["seq"])
    assert [e["args"]["seq"] for e in comm] == list(range(1, len(comm) + 1))
    names = [e["name"] for e in comm]
    assert names.count("all_reduce") == 2 * STEPS and names[-1] == "barrier", names
    assert [e["args"]["bytes"] for e in comm if e["name"] == "all_reduce"] == [16, 32] * STEPS
    assert len([e for e in events if e.get("tid") == 3 and e["name"] == "bucket 0"]) == STEPS
    # The metrics: one row at finalize (fewer than 10 steps), the scalars' latest values.
    [row] = [json.loads(line) for line in open(trace / "metrics" / f"rank{rank}.jsonl")]
    assert (row["rank"], row["step"], row["steps"]) == (rank, ENDED, ENDED)
    assert row["scalars"] == {"loss": losses[-1], "accuracy": 0.875}
    assert row["collectives"]["all_reduce"]["count"] == 2 * STEPS and row["collectives"]["barrier"]["count"] == 1
    assert os.listdir(trace / "tensorboard" / f"rank{rank}")
