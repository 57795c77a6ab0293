"""A Prometheus endpoint per rank, over the `prometheus_client` package: a collector that
reads the rank's `Metrics` when scraped, so nothing is kept twice and recording costs
nothing extra. Counters are totals since start; gauges the latest step and scalars."""

from ..errors import InvalidArgument

# the step's parts as the `part` label, and the breakdown field each is read from
_PARTS = (("total", "step_us"), ("data", "data_us"), ("compute", "compute_us"), ("exposed_comm", "exposed_comm_us"),
          ("comm", "comm_us"))


def serve(metrics, port, addr):
    """Serve `metrics` on http://addr:port/metrics; returns (server, thread)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError:
        raise InvalidArgument("a metrics port was given (PYBRIDGE_METRICS_PORT or --metrics-port) but the "
                              "prometheus_client package is not installed: pip install prometheus-client "
                              "(or pybridge[observe])") from None

    class Collector:
        def collect(self):
            rank = str(metrics.rank)
            labels = ["rank"]
            steps = CounterMetricFamily("pybridge_steps", "Steps ended (reducer iterations or the program's own)",
                                        labels=labels)
            steps.add_metric([rank], metrics.steps)
            yield steps
            spent = CounterMetricFamily("pybridge_step_seconds", "Seconds of steps, split by what they spent",
                                        labels=labels + ["part"])
            for part, key in _PARTS:
                spent.add_metric([rank, part], metrics.totals[key] / 1e6)
            yield spent
            last = GaugeMetricFamily("pybridge_last_step_seconds", "The latest step, split by what it spent",
                                     labels=labels + ["part"])
            hidden = GaugeMetricFamily("pybridge_hidden_share", "Share of the latest step's reduction hidden "
                                       "behind compute (0 to 1)", labels=labels)
            if metrics.last_step is not None:
                for part, key in _PARTS:
                    last.add_metric([rank, part], metrics.last_step[key] / 1e6)
                if "hidden_share" in metrics.last_step:
                    hidden.add_metric([rank], metrics.last_step["hidden_share"])
            yield last
            yield hidden
            calls = CounterMetricFamily("pybridge_collectives", "Collectives run", labels=labels + ["op"])
            nbytes = CounterMetricFamily("pybridge_collective_bytes", "Bytes of collectives' payloads",
                                         labels=labels + ["op"])
            secs = CounterMetricFamily("pybridge_collective_seconds", "Seconds from issue to completion",
                                       labels=labels + ["op"])
            bus = GaugeMetricFamily("pybridge_collective_busbw_bytes_per_second",
                                    "Bus bandwidth since start (nccl-tests' busbw)", labels=labels + ["op"])
            for op, c in metrics.collective_table().items():
                calls.add_metric([rank, op], c["count"])
                nbytes.add_metric([rank, op], c["bytes"])
                secs.add_metric([rank, op], c["seconds"])
                bus.add_metric([rank, op], c["busbw_GBps"] * 1e9)
            yield calls
            yield nbytes
            yield secs
            yield bus
            records = CounterMetricFamily("pybridge_loader_records", "Records the loader handed out", labels=labels)
            records.add_metric([rank], metrics.loader_records)
            yield records
            wait = CounterMetricFamily("pybridge_loader_wait_seconds", "Seconds the program waited for batches",
                                       labels=labels)
            wait.add_metric([rank], metrics.loader_seconds)
            yield wait
            scalars = GaugeMetricFamily("pybridge_scalar", "The program's scalars (the latest value)",
                                        labels=labels + ["name"])
            for name, (_, value) in metrics.scalars.items():
                scalars.add_metric([rank, name], value)
            yield scalars

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    try:
        return start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise InvalidArgument(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc} "
                              "(PYBRIDGE_METRICS_PORT / --metrics-port: each rank takes the port plus its local "
                              "rank)") from None
