"""The OTLP/HTTP export: a record sink that turns each finished request into GenAI metric
points and its spans (spans.py), handed to the OpenTelemetry SDK's batching exporters.

Imported only when telemetry is on (it needs the `otel` extra). On the event loop the sink
only records histogram points and queues finished spans; the SDK's own threads encode and
send them every `export_interval_s`, so a slow or absent collector never stalls a request.

Metric names follow the OpenTelemetry GenAI semantic conventions, with their advised bucket
boundaries: `gen_ai.client.token.usage` (`gen_ai.token.type` input/output),
`gen_ai.server.request.duration`, `gen_ai.server.time_to_first_token` and
`gen_ai.server.time_per_output_token` (the last two for served requests only).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from collections.abc import AsyncIterator, Mapping

from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from gateway.records import RequestRecord
from gateway.telemetry.config import TelemetryConfig
from gateway.telemetry.spans import EngineInfo, SpanPlan, base_attributes, request_spans

log = logging.getLogger("wattgate.telemetry")

SCOPE = InstrumentationScope("wattgate")
# the GenAI semantic conventions' advised boundaries
TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864]
DURATION_BUCKETS_S = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                      20.48, 40.96, 81.92]
TTFT_BUCKETS_S = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0]
TPOT_BUCKETS_S = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
_KINDS = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def resource_of(telemetry: TelemetryConfig, extra: Mapping[str, str] | None = None) -> Resource:
    """This process as an OpenTelemetry resource: the configured service name, and an instance
    id (host:pid) that keeps each process's cumulative series apart."""
    return Resource.create({"service.name": telemetry.service_name,
                            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
                            **(extra or {})})


class OtelExport:
    """A record sink exporting metrics and spans over OTLP/HTTP to `telemetry.otlp_endpoint`."""

    def __init__(self, telemetry: TelemetryConfig, engines: Mapping[str, EngineInfo]):
        self.engines = dict(engines)
        self.resource = resource_of(telemetry)
        interval_ms = telemetry.export_interval_s * 1000.0
        base = telemetry.otlp_endpoint
        self.spans: BatchSpanProcessor | None = None
        if telemetry.traces:
            self.spans = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces"),
                                            schedule_delay_millis=interval_ms)
        self.meters: MeterProvider | None = None
        if telemetry.metrics:
            reader = PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=f"{base}/v1/metrics"),
                export_interval_millis=interval_ms)
            self.meters = MeterProvider(resource=self.resource, metric_readers=[reader])
            meter = self.meters.get_meter("wattgate")
            self.token_usage = meter.create_histogram(
                "gen_ai.client.token.usage", "{token}", "Input and output tokens per request",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
            self.duration = meter.create_histogram(
                "gen_ai.server.request.duration", "s", "Request duration, arrival to last byte",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S)
            self.ttft = meter.create_histogram(
                "gen_ai.server.time_to_first_token", "s", "Time to first token of served "
                "requests", explicit_bucket_boundaries_advisory=TTFT_BUCKETS_S)
            self.tpot = meter.create_histogram(
                "gen_ai.server.time_per_output_token", "s", "Time per output token after the "
                "first, of served requests", explicit_bucket_boundaries_advisory=TPOT_BUCKETS_S)

    def __call__(self, rec: RequestRecord) -> None:
        trace = rec.trace
        if trace is None:  # not started by this process's proxy (nothing to say of it)
            return
        engine = self.engines.get(rec.engine)
        if self.meters is not None:
            self._measure(rec, base_attributes(rec, trace.operation, engine))
        if self.spans is not None:
            for plan in request_spans(rec, trace, engine, random.getrandbits):
                self.spans.on_end(self._span(plan, trace.trace_id))

    def _measure(self, rec: RequestRecord, attrs: dict[str, str | int | float | bool]) -> None:
        self.duration.record(rec.finished_s - rec.arrived_s, attrs)
        if rec.dispatched_s is not None:  # an engine read it (or may have): its tokens count
            self.token_usage.record(rec.prompt_tokens, {**attrs, "gen_ai.token.type": "input"})
            self.token_usage.record(rec.completion_tokens,
                                    {**attrs, "gen_ai.token.type": "output"})
        if rec.status == "ok":
            lat = rec.latency
            if lat.ttft_s is not None:
                self.ttft.record(lat.ttft_s, attrs)
            if lat.tpot_s is not None:
                self.tpot.record(lat.tpot_s, attrs)

    def _span(self, plan: SpanPlan, trace_id: int) -> ReadableSpan:
        parent = (None if plan.parent_id is None
                  else SpanContext(trace_id, plan.parent_id, is_remote=plan.kind == "server",
                                   trace_flags=_SAMPLED))
        attrs = dict(plan.attributes)
        if plan.error is not None:
            attrs["error.type"] = plan.error
        status = Status(StatusCode.ERROR) if plan.error is not None else Status(StatusCode.UNSET)
        return ReadableSpan(
            plan.name, SpanContext(trace_id, plan.span_id, is_remote=False, trace_flags=_SAMPLED),
            parent, self.resource, attrs, kind=_KINDS[plan.kind], status=status,
            start_time=int(plan.start_s * 1e9), end_time=int(plan.end_s * 1e9),
            instrumentation_scope=SCOPE)

    def shutdown(self) -> None:
        """Send what is pending and stop the export threads (blocks up to their timeouts)."""
        if self.spans is not None:
            self.spans.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
        if self.meters is not None:
            self.meters.shutdown()

    async def cleanup_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        """Registered before the proxy's context: what in-flight requests emit is sent too."""
        yield
        await asyncio.to_thread(self.shutdown)
