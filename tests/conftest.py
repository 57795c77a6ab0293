"""Settings for the whole test session.

Each pytest worker picks rendezvous ports from its own range (PYBRIDGE_PORTS, which the
ranks, launchers and programs it starts inherit), and `make test` gives Go's tests another:
two tests running at once never pick the same port.

`make test` runs pytest on several workers (pytest-xdist, `--dist loadfile`): each file goes
whole to one worker, in collection order, as workers free up. A slow file that starts last
keeps its worker busy while the others sit idle, so the slowest files are collected first
(longest first: the usual greedy rule for spreading jobs over machines). Order inside a
file is kept. The list only orders: a file missing from it runs after these, as before.
"""
import os
import resource
import subprocess
import time

import pytest

# Ranges inside pybridge's default 20000-31999: Go's tests get 20000-21999 (Makefile), pytest
# worker gwN gets a 2000-port slice from 22000 (five slices; a sixth worker shares gw0's).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and _worker[2:].isdigit():
    _low = 22000 + 2000 * (int(_worker[2:]) % 5)
    os.environ["PYBRIDGE_PORTS"] = f"{_low}-{_low + 1999}"
else:
    os.environ.setdefault("PYBRIDGE_PORTS", "22000-31999")

# The slowest files of a full run, slowest first: `make test` prints the slowest tests at
# the end; move a file up here when it grows.
SLOW_FILES = (  # seconds in a clean-clone `make test` (--durations=0, summed per file), 2026-11-27
    "test_mnist.py",  # 219
    "test_gotorch.py",  # 146
    "test_launch.py",  # 111
    "test_outside_install.py",  # 80
    "test_federated.py",  # 76
    "test_checkpoint.py",  # 74
    "test_cluster.py",  # 73
    "test_docs.py",  # 71
    "test_elastic_survive.py",  # 71
    "test_etcd.py",  # 41 alone, 2026-11-28 (not yet in a clean-clone run)
    "test_elastic_mnist.py",  # 39
    "test_elastic_lost.py",  # 36
    "test_observe_straggler.py",  # 28 (two 4-rank runs, one at a 5% CPU quota; wall time, little CPU; 2026-11-28)
    "test_handles_cpp.py",  # 35 (two C++ programs compiled, then 4 launches; measured alone under load)
    "test_gossip.py",  # 33
    "test_join.py",  # 24
    "test_capi.py",  # 23
    "test_elastic_c.py",  # 22
    "test_ddp.py",  # 22
    "test_launch_failures.py",  # 19
    "test_no_hangs.py",  # 19
    "test_reliability.py",  # 18
    "test_capi_federated_faults.py",  # 16
    "test_group.py",  # 16
    "test_comm_hooks.py",  # 16
    "test_capi_reducer.py",  # 16
    "test_federated_integrity.py",  # 16
    "test_mnist_federated_go.py",  # 15
    # this session's files, by their wall time alone (2 files at a time, 2026-11-27)
    "test_outsiders.py",  # 18
    "test_jobenv.py",  # 15
    "test_preempt.py",  # 14
    "test_handles.py",  # 14
    "test_elastic.py",  # 13
    "test_local_sgd.py",  # 12
    "test_observe.py",  # 10 (2026-11-28, alone)
    "test_observe_report.py",  # 7
)


def pytest_collection_modifyitems(session, config, items):
    first = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(SLOW_FILES)))  # stable: keeps the rest in order


@pytest.fixture(scope="module")
def cluster_c_program(tmp_path_factory):
    """tests/c/cluster.c built against build/libpybridge.so (the srun and mpirun tests run it)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = str(tmp_path_factory.mktemp("c") / "cluster")
    from capi_loader import pybridge_flags
    flags = pybridge_flags(os.path.join(root, "build"))
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", exe, os.path.join(root, "tests", "c", "cluster.c"),
                    *flags], check=True, timeout=120)
    return exe


# PYBRIDGE_TEST_TIMELINE=FILE: each worker appends "worker file start end cpu" per test file
# it ran (start and end in seconds since the epoch; cpu: seconds of CPU the worker and the
# processes it waited for spent in the file's tests), to see where a run's time goes
# (docs/testing.md). On 2 cores the CPU, not the wall time, decides the suite's length.
_TIMELINE = os.environ.get("PYBRIDGE_TEST_TIMELINE")
_spans = {}
_cpu_at_start = [0.0]


def _cpu_seconds():
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


def pytest_runtest_logstart(nodeid, location):
    if _TIMELINE:
        name = nodeid.split("::", 1)[0]
        _spans.setdefault(name, [time.time(), None, 0.0])
        _cpu_at_start[0] = _cpu_seconds()


def pytest_runtest_logfinish(nodeid, location):
    if _TIMELINE:
        span = _spans[nodeid.split("::", 1)[0]]
        span[1] = time.time()
        span[2] += _cpu_seconds() - _cpu_at_start[0]


def pytest_sessionfinish(session):
    if _TIMELINE and _spans:
        with open(_TIMELINE, "a") as f:
            f.writelines(f"{_worker or 'main'} {name} {a:.2f} {b:.2f} {cpu:.1f}\n"
                         for name, (a, b, cpu) in _spans.items())
