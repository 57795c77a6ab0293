"""A Prometheus endpoint per rank, over the `prometheus_client` package: a collector that
reads the rank's metrics (families.py) when scraped."""

from ..errors import InvalidArgument
from . import families


def collector(metrics):
    """A prometheus_client collector of `metrics` (ImportError without the package)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    kinds = {families.COUNTER: CounterMetricFamily, families.GAUGE: GaugeMetricFamily}

    class Collector:
        def collect(self):
            for f in families.families(metrics):
                out = kinds[f.kind](f.name, f.help, labels=list(f.labels))
                for labels, value in f.samples:
                    out.add_metric(list(labels), value)
                yield out
    return Collector()


def serve(metrics, port, addr):
    """Serve `metrics` on http://addr:port/metrics; returns (server, thread)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
        made = collector(metrics)
    except ImportError:
        raise InvalidArgument("a metrics port was given (PYBRIDGE_METRICS_PORT or --metrics-port) but the "
                              "prometheus_client package is not installed: pip install prometheus-client "
                              "(or pybridge[observe])") from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(made)
    try:
        return start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise InvalidArgument(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc} "
                              "(PYBRIDGE_METRICS_PORT / --metrics-port: each rank takes the port plus its local "
                              "rank)") from None
