"""The OTLP/HTTP export: a record sink that turns each finished request into GenAI metric
points (histograms.py, pushed by push.py) and its spans (spans.py, handed to the
OpenTelemetry SDK's batching span processor).

Imported only when telemetry is on (it needs the `otel` extra). On the event loop the sink
only adds histogram points and queues finished spans; export threads encode and send them
every `export_interval_s`, so a slow or absent collector never stalls a request.

Metric names follow the OpenTelemetry GenAI semantic conventions, with their advised bucket
boundaries: `gen_ai.client.token.usage` (`gen_ai.token.type` input/output),
`gen_ai.server.request.duration`, `gen_ai.server.time_to_first_token` and
`gen_ai.server.time_per_output_token` (the last two for served requests only).
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
from collections.abc import AsyncIterator, Mapping

from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from core.records import RequestRecord
from gateway.telemetry.config import TelemetryConfig
from gateway.telemetry.histograms import Attrs, AttrValue, HistogramSet, attrs_of
from gateway.telemetry.push import HistogramPusher
from gateway.telemetry.spans import EngineInfo, SpanPlan, base_attributes, request_spans

SCOPE = InstrumentationScope("wattgate")
TOKENS = "gen_ai.client.token.usage"
DURATION = "gen_ai.server.request.duration"
TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"
# the GenAI semantic conventions' advised boundaries
TOKEN_BUCKETS = [1.0, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864]
DURATION_BUCKETS_S = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                      20.48, 40.96, 81.92]
TTFT_BUCKETS_S = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0]
TPOT_BUCKETS_S = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
# name -> unit, description, bucket bounds
METRICS: dict[str, tuple[str, str, list[float]]] = {
    TOKENS: ("{token}", "Input and output tokens per request", TOKEN_BUCKETS),
    DURATION: ("s", "Request duration, arrival to last byte", DURATION_BUCKETS_S),
    TTFT: ("s", "Time to first token of served requests", TTFT_BUCKETS_S),
    TPOT: ("s", "Time per output token after the first, of served requests", TPOT_BUCKETS_S),
}
# one export, retries included: bounds what a collector that is down adds to a shutdown
EXPORT_TIMEOUT_S = 2.0
_KINDS = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET, _ERROR = Status(StatusCode.UNSET), Status(StatusCode.ERROR)  # immutable, shared


def resource_of(telemetry: TelemetryConfig, extra: Mapping[str, str] | None = None) -> Resource:
    """This process as an OpenTelemetry resource: the configured service name, and an instance
    id (host:pid) that keeps each process's cumulative series apart."""
    return Resource.create({"service.name": telemetry.service_name,
                            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
                            **(extra or {})})


def points(rec: RequestRecord, attrs: dict[str, AttrValue]) -> list[tuple[str, Attrs, float]]:
    """The histogram points of one finished request: its duration; its input and output
    tokens where an engine was asked; TTFT and TPOT where it was served and they exist."""
    key = attrs_of(attrs)
    out = [(DURATION, key, rec.finished_s - rec.arrived_s)]
    if rec.dispatched_s is not None:  # an engine read it (or may have): its tokens count
        out.append((TOKENS, attrs_of({**attrs, "gen_ai.token.type": "input"}),
                    float(rec.prompt_tokens)))
        out.append((TOKENS, attrs_of({**attrs, "gen_ai.token.type": "output"}),
                    float(rec.completion_tokens)))
    if rec.status == "ok":
        lat = rec.latency
        if lat.ttft_s is not None:
            out.append((TTFT, key, lat.ttft_s))
        if lat.tpot_s is not None:
            out.append((TPOT, key, lat.tpot_s))
    return out


class OtelExport:
    """A record sink exporting metrics and spans over OTLP/HTTP to `telemetry.otlp_endpoint`."""

    def __init__(self, telemetry: TelemetryConfig, engines: Mapping[str, EngineInfo]):
        self.engines = dict(engines)
        self.resource = resource_of(telemetry)
        interval_ms = telemetry.export_interval_s * 1000.0
        base = telemetry.otlp_endpoint
        self.spans: BatchSpanProcessor | None = None
        if telemetry.traces:
            self.spans = BatchSpanProcessor(
                OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=EXPORT_TIMEOUT_S),
                schedule_delay_millis=interval_ms,
                export_timeout_millis=EXPORT_TIMEOUT_S * 1000.0)
        self.histograms: HistogramSet | None = None
        self.pusher: HistogramPusher | None = None
        if telemetry.metrics:
            self.histograms = HistogramSet({name: b for name, (_, _, b) in METRICS.items()})
            self.pusher = HistogramPusher(
                self.histograms, {name: (unit, d) for name, (unit, d, _) in METRICS.items()},
                f"{base}/v1/metrics", telemetry.export_interval_s, self.resource, SCOPE,
                timeout_s=EXPORT_TIMEOUT_S)

    def __call__(self, rec: RequestRecord) -> None:
        trace = rec.trace
        if trace is None:  # not started by this process's proxy (nothing to say of it)
            return
        engine = self.engines.get(rec.engine)
        if self.histograms is not None:
            self.histograms.record(points(rec, base_attributes(rec, trace.operation, engine)))
        if self.spans is not None:
            for plan in request_spans(rec, trace, engine, random.getrandbits):
                self.spans.on_end(self._span(plan, trace.trace_id))

    def _span(self, plan: SpanPlan, trace_id: int) -> ReadableSpan:
        parent = (None if plan.parent_id is None
                  else SpanContext(trace_id, plan.parent_id, is_remote=plan.kind == "server",
                                   trace_flags=_SAMPLED))
        attrs = dict(plan.attributes)
        if plan.error is not None:
            attrs["error.type"] = plan.error
        return ReadableSpan(
            plan.name, SpanContext(trace_id, plan.span_id, is_remote=False, trace_flags=_SAMPLED),
            parent, self.resource, attrs, kind=_KINDS[plan.kind],
            status=_UNSET if plan.error is None else _ERROR,
            start_time=int(plan.start_s * 1e9), end_time=int(plan.end_s * 1e9),
            instrumentation_scope=SCOPE)

    def shutdown(self) -> None:
        """Send what is pending and stop the export threads (blocks up to their timeouts)."""
        if self.spans is not None:
            self.spans.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
        if self.pusher is not None:
            self.pusher.shutdown()

    async def cleanup_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        """Registered before the proxy's context: what in-flight requests emit is sent too."""
        yield
        await asyncio.to_thread(self.shutdown)
