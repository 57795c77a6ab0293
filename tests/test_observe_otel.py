"""OpenTelemetry metrics (pybridge/observe/otel.py): the same figures as the Prometheus
endpoint, exported over OTLP/HTTP to a collector (a small one here, decoding the requests
with OpenTelemetry's own protobuf classes) from a C program's ranks and from Python ranks
under `pybridge-launch --otel`; a program's own meter provider is used when it set one;
missing settings are named."""

import http.server
import os
import subprocess
import textwrap
import threading

import pytest

from capi_loader import LIB_PATH, ROOT, pybridge_flags, run_two_ranks
from launcher import launch

pytest.importorskip("opentelemetry.sdk.metrics")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")


class Collector:
    """An OTLP/HTTP metrics receiver on loopback: each request's data points as
    (metric name, attributes, value)."""

    def __init__(self):
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
        self.points, self.paths = [], []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportMetricsServiceRequest()
                req.ParseFromString(body)
                outer.paths.append(self.path)
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            data = m.sum.data_points if m.HasField("sum") else m.gauge.data_points
                            for dp in data:
                                attrs = {a.key: a.value.string_value for a in dp.attributes}
                                value = dp.as_int if dp.HasField("as_int") else dp.as_double
                                outer.points.append((m.name, attrs, value))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"

    def latest(self, metric, **attrs):
        """The last value received for `metric` with these attributes (None: never)."""
        found = [v for n, a, v in self.points if n == metric and all(a.get(k) == w for k, w in attrs.items())]
        return found[-1] if found else None

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.close()


def _env(collector):
    return {"PYBRIDGE_OTEL": "1", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": collector.url,
            "OTEL_METRIC_EXPORT_INTERVAL": "200", "OTEL_SERVICE_NAME": "pybridge-test"}


def test_the_same_figures_as_prometheus():
    """One table (families.py) for both exporters: what the SDK reads is what a scrape shows."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from pybridge.observe import otel, prometheus
    from pybridge.observe.metrics import Metrics
    m = Metrics(3, 4, None, 1)
    m.collective("all_reduce", 4096, 0.002, 4)
    m.collective("all_reduce", 4096, 0.001, 4)
    m.collective("broadcast", 100, 0.0005, 4)
    m.loader(32, 0.01)
    m.scalar("loss", 0.5, 1)
    m.step(1, {"step_us": 3000.0, "data_us": 100.0, "compute_us": 2000.0, "exposed_comm_us": 900.0,
               "comm_us": 1500.0, "forward_us": 500.0, "backward_us": 1200.0, "hidden_share": 0.4, "records": 32})
    reader = InMemoryMetricReader()
    otel.register(m, MeterProvider(metric_readers=[reader]))
    got = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "pybridge"
            for metric in sm.metrics:
                for dp in metric.data.data_points:
                    got[(metric.name, tuple(sorted(dp.attributes.items())))] = dp.value

    registry = CollectorRegistry(auto_describe=False)
    registry.register(prometheus.collector(m))
    scraped = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if not s.name.endswith("_created"):
                scraped[(fam.name, tuple(sorted(s.labels.items())))] = s.value
    assert got and got.keys() == scraped.keys()
    for key, value in got.items():
        assert value == pytest.approx(scraped[key]), key
    assert got[("pybridge_collectives", (("op", "all_reduce"), ("rank", "3")))] == 2
    assert got[("pybridge_scalar", (("name", "loss"), ("rank", "3")))] == 0.5
    assert got[("pybridge_hidden_share", (("rank", "3"),))] == 0.4


@pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")
def test_a_c_program_exports_its_metrics(tmp_path, collector):
    """tests/c/observe.c on two ranks with PYBRIDGE_OTEL=1: its scalars and the collectives
    reach the collector, per rank, with the counts the trace files hold."""
    import json
    exe, trace = tmp_path / "observe", tmp_path / "trace"
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", str(exe), os.path.join(ROOT, "tests/c/observe.c"),
                    *pybridge_flags()], check=True)
    ranks = run_two_ranks(exe, trace, env=_env(collector))
    for rank, (code, out) in enumerate(ranks):
        assert code == 0 and "observe: 0 failed checks" in out, f"rank {rank} exited {code}:\n{out}"
    assert collector.paths and set(collector.paths) == {"/v1/metrics"}
    for rank in (0, 1):
        r = str(rank)
        assert collector.latest("pybridge_scalar", rank=r, name="accuracy") == 0.875
        assert collector.latest("pybridge_scalar", rank=r, name="loss") == 1.5 + 2 + 0.25 * rank  # the last step's
        doc = json.load(open(trace / f"rank{rank}.trace.json"))
        tracks = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"
                  and e["name"] == "thread_name"}
        reduced = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "all_reduce"
                   and tracks[e["tid"]].startswith("collectives")]
        assert collector.latest("pybridge_collectives", rank=r, op="all_reduce") == len(reduced) > 0
        assert collector.latest("pybridge_steps", rank=r) == doc["otherData"]["pybridge"]["steps"]


def test_python_ranks_under_the_launcher(tmp_path, collector):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, pybridge
        from pybridge import observe
        g = pybridge.init()
        for step in range(5):
            pybridge.all_reduce(torch.ones(256))
            observe.scalar("loss", 1.0 / (step + 1))
        pybridge.finalize()
    """))
    env = {k: v for k, v in _env(collector).items() if k != "PYBRIDGE_OTEL"}  # --otel sets it
    code, out, _ = launch(["--nproc-per-node", "2", "--otel", str(script)], env=env, timeout=120)
    assert code == 0, out
    for rank in ("0", "1"):
        assert collector.latest("pybridge_collectives", rank=rank, op="all_reduce") >= 5
        assert collector.latest("pybridge_collective_bytes", rank=rank, op="all_reduce") >= 5 * 1024
        assert collector.latest("pybridge_scalar", rank=rank, name="loss") == pytest.approx(0.2)


def test_missing_settings_are_named(monkeypatch):
    from pybridge.errors import InvalidArgument
    from pybridge.observe import otel, start, stop
    from pybridge.observe.metrics import Metrics
    for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(InvalidArgument, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        otel.register(Metrics(0, 1, None, 1))  # no provider set in this process, no endpoint
    monkeypatch.setenv("PYBRIDGE_OTEL", "maybe")
    with pytest.raises(InvalidArgument, match="PYBRIDGE_OTEL='maybe'"):
        start("unused-dir")
    stop()
