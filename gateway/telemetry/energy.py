"""The accounting's energy, carbon and cost counters exported over OTLP, beside Prometheus.

The process that apportions (the accounting child, or the gateway itself when inline) keeps
them as Prometheus counters (accounting/metrics.py). Here each is also an
OpenTelemetry observable counter whose callback reads the Prometheus counter when the export
runs (in the SDK's thread; the Prometheus client copies a counter's series under its lock), so
apportioning does no extra work. No GenAI convention covers energy: the names are
`wattgate.*`, with `wattgate.tenant` or `wattgate.engine` as the one attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from prometheus_client import Counter

from accounting.metrics import ApportionerMetrics
from gateway.telemetry.config import TelemetryConfig
from gateway.telemetry.export import EXPORT_TIMEOUT_S, resource_of

# OpenTelemetry name, unit, description, the ApportionerMetrics counter it reads
SERIES: tuple[tuple[str, str, str, Callable[[ApportionerMetrics], Counter]], ...] = (
    ("wattgate.tenant.energy", "J", "Energy apportioned to a tenant's requests",
     lambda m: m.tenant_energy),
    ("wattgate.tenant.carbon", "g", "Carbon (gCO2e) apportioned to a tenant",
     lambda m: m.tenant_carbon),
    ("wattgate.tenant.cost", "USD", "Cost apportioned to a tenant", lambda m: m.tenant_cost),
    ("wattgate.engine.energy", "J", "Metered energy apportioned per engine",
     lambda m: m.engine_energy),
    ("wattgate.engine.idle_energy", "J", "Energy of an engine's idle account",
     lambda m: m.engine_idle),
)


def counter_values(counter: Counter) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each series of a Prometheus counter, its labels named
    `wattgate.<label>`."""
    out = []
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                out.append(({f"wattgate.{k}": v for k, v in sample.labels.items()}, sample.value))
    return out


def _observer(counter: Counter) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, labels) for labels, value in counter_values(counter)]

    return observe


class EnergyExport:
    """Exports the apportioner's counters to `telemetry.otlp_endpoint` until `shutdown()`."""

    def __init__(self, telemetry: TelemetryConfig, metrics: ApportionerMetrics,
                 extra_resource: Mapping[str, str] | None = None):
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{telemetry.otlp_endpoint}/v1/metrics",
                               timeout=EXPORT_TIMEOUT_S),
            export_interval_millis=telemetry.export_interval_s * 1000.0,
            export_timeout_millis=EXPORT_TIMEOUT_S * 1000.0)
        self.provider = MeterProvider(resource=resource_of(telemetry, extra_resource),
                                      metric_readers=[reader])
        meter = self.provider.get_meter("wattgate.accounting")
        for name, unit, description, counter_of in SERIES:
            meter.create_observable_counter(name, [_observer(counter_of(metrics))], unit,
                                            description)

    def shutdown(self) -> None:
        """Export once more and stop the export thread (blocks up to its timeout)."""
        self.provider.shutdown()
