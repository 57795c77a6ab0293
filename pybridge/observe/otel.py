"""OpenTelemetry metrics: the rank's metrics (families.py, the names Prometheus shows) as
observable instruments of an OpenTelemetry meter, read when the SDK collects them (no cost
per event).

Which meter provider: the program's own when it set one (`metrics.set_meter_provider`, a
Python program); else, for any program (C and Go ones too), one pybridge makes from
OpenTelemetry's standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (OTLP over HTTP), `OTEL_METRIC_EXPORT_INTERVAL`
(ms), `OTEL_SERVICE_NAME`; it exports at finalize too, and is shut down by `observe.stop()`
(at exit).
Needs `opentelemetry-sdk`, and `opentelemetry-exporter-otlp-proto-http` for the exporter
pybridge makes (`pip install pybridge[otel]`)."""

import os

from ..errors import InvalidArgument
from . import families

_INSTALL = "pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http (or pybridge[otel])"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class Exporter:
    """The instruments registered on a meter; `owned`: the provider pybridge made (shut
    down by close()), else None."""

    def __init__(self, metrics, provider, owned):
        from opentelemetry.metrics import Observation
        from .._version import __version__
        self.owned = owned
        meter = provider.get_meter("pybridge", __version__)
        make = {families.COUNTER: meter.create_observable_counter, families.GAUGE: meter.create_observable_gauge}
        self.instruments = []
        for name, kind, text in families.names():
            def observe(_options, name=name):
                for f in families.families(metrics):
                    if f.name == name:
                        return [Observation(value, dict(zip(f.labels, labels))) for labels, value in f.samples]
                return []
            self.instruments.append(make[kind](name, callbacks=[observe], description=text))

    def flush(self):
        """Export now (the provider pybridge made; a program's own provider is the program's)."""
        if self.owned is not None:
            self.owned.force_flush()

    def close(self):
        if self.owned is not None:
            self.owned.shutdown()  # exports what was collected last


def _own_provider(rank):
    """A meter provider exporting over OTLP/HTTP as OpenTelemetry's variables say."""
    if not any(os.environ.get(k, "").strip() for k in _ENDPOINTS):
        raise InvalidArgument("OpenTelemetry was asked for (PYBRIDGE_OTEL, --otel or start(otel=True)) but the "
                              "program set no meter provider and neither OTEL_EXPORTER_OTLP_ENDPOINT nor "
                              "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT says where to send the metrics")
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
    except ImportError:
        raise InvalidArgument(f"OpenTelemetry export needs the SDK and its OTLP/HTTP exporter: {_INSTALL}") from None
    resource = Resource.create({"pybridge.rank": rank})  # service.name etc. from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES
    return MeterProvider(metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())], resource=resource)


def register(metrics, provider=None):
    """Export `metrics` through `provider` (default: the program's global meter provider,
    else one made from OpenTelemetry's variables). Returns the Exporter."""
    try:
        from opentelemetry import metrics as otel_metrics
    except ImportError:
        raise InvalidArgument(f"OpenTelemetry was asked for but is not installed: {_INSTALL}") from None
    owned = None
    if provider is None:
        provider = otel_metrics.get_meter_provider()
        # The API's stand-ins until a program sets a provider: nothing would be collected.
        if type(provider).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider"):
            provider = owned = _own_provider(metrics.rank)
    return Exporter(metrics, provider, owned)


__all__ = ["Exporter", "register"]
