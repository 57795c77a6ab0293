"""The metrics a rank exports, as one table both exporters read: the Prometheus endpoint
(prometheus.py) and OpenTelemetry (otel.py) show the same names, labels and values, read
from the rank's `Metrics` when collected (nothing is kept twice; recording costs nothing
extra). Counters are totals since start; gauges the latest step and scalars."""

from typing import Iterator, List, NamedTuple, Tuple

from .metrics import Metrics

COUNTER, GAUGE = "counter", "gauge"

# the step's parts as the `part` label, and the breakdown field each is read from
PARTS = (("total", "step_us"), ("data", "data_us"), ("compute", "compute_us"), ("exposed_comm", "exposed_comm_us"),
         ("comm", "comm_us"))


class Family(NamedTuple):
    """One metric: its name, kind (COUNTER or GAUGE), help text, label names and its
    samples as (label values, value), the rank's label first."""
    name: str
    kind: str
    help: str
    labels: Tuple[str, ...]
    samples: List[Tuple[Tuple[str, ...], float]]


def families(metrics: Metrics) -> Iterator[Family]:
    """Every metric of `metrics` as it is now."""
    rank = str(metrics.rank)
    yield Family("pybridge_steps", COUNTER, "Steps ended (reducer iterations or the program's own)", ("rank",),
                 [((rank,), metrics.steps)])
    yield Family("pybridge_step_seconds", COUNTER, "Seconds of steps, split by what they spent", ("rank", "part"),
                 [((rank, part), metrics.totals[key] / 1e6) for part, key in PARTS])
    last = metrics.last_step
    yield Family("pybridge_last_step_seconds", GAUGE, "The latest step, split by what it spent", ("rank", "part"),
                 [] if last is None else [((rank, part), last[key] / 1e6) for part, key in PARTS])
    yield Family("pybridge_hidden_share", GAUGE, "Share of the latest step's reduction hidden behind compute (0 to 1)",
                 ("rank",), [((rank,), last["hidden_share"])] if last is not None and "hidden_share" in last else [])
    table = metrics.collective_table()
    for name, key, kind, text, scale in (
            ("pybridge_collectives", "count", COUNTER, "Collectives run", 1),
            ("pybridge_collective_bytes", "bytes", COUNTER, "Bytes of collectives' payloads", 1),
            ("pybridge_collective_seconds", "seconds", COUNTER, "Seconds from issue to completion", 1),
            ("pybridge_collective_busbw_bytes_per_second", "busbw_GBps", GAUGE,
             "Bus bandwidth since start (nccl-tests' busbw)", 1e9)):
        yield Family(name, kind, text, ("rank", "op"), [((rank, op), c[key] * scale) for op, c in table.items()])
    yield Family("pybridge_loader_records", COUNTER, "Records the loader handed out", ("rank",),
                 [((rank,), metrics.loader_records)])
    yield Family("pybridge_loader_wait_seconds", COUNTER, "Seconds the program waited for batches", ("rank",),
                 [((rank,), metrics.loader_seconds)])
    yield Family("pybridge_scalar", GAUGE, "The program's scalars (the latest value)", ("rank", "name"),
                 [((rank, name), value) for name, (_, value) in metrics.scalars.items()])


def names() -> List[Tuple[str, str, str]]:
    """(name, kind, help) of every family, for exporters that declare instruments up front."""
    return [(f.name, f.kind, f.help) for f in families(Metrics(0, 1, None, 1))]


__all__ = ["COUNTER", "GAUGE", "PARTS", "Family", "families", "names"]
