"""An in-process OTLP/HTTP receiver: accepts POST /v1/traces and /v1/metrics (protobuf, as
the OpenTelemetry exporters send them) and keeps what they carried, decoded with the
opentelemetry-proto classes."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.procs import free_port


@dataclass
class Received:
    spans: list[Any] = field(default_factory=list)  # opentelemetry.proto.trace.v1.Span
    resources: list[dict[str, Any]] = field(default_factory=list)  # each batch's resource
    metrics: list[Any] = field(default_factory=list)  # opentelemetry.proto.metrics.v1.Metric

    def span_trace_ids(self) -> set[str]:
        return {s.trace_id.hex() for s in self.spans}

    def histogram_points(self, name: str) -> list[Any]:
        """Every HistogramDataPoint of metric `name` received so far."""
        return [p for m in self.metrics if m.name == name for p in m.histogram.data_points]


def attributes(kvs: Any) -> dict[str, Any]:
    """An OTLP KeyValue list as a dict of plain values."""
    out: dict[str, Any] = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


def _body(request_bytes: bytes, encoding: str | None) -> bytes:
    return gzip.decompress(request_bytes) if encoding == "gzip" else request_bytes


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, Received]]:
    """(base URL, what arrived) of a receiver on a free 127.0.0.1 port; always stopped."""
    got = Received()

    async def traces(request: web.Request) -> web.Response:
        msg = ExportTraceServiceRequest.FromString(
            _body(await request.read(), request.headers.get("Content-Encoding")))
        for rs in msg.resource_spans:
            got.resources.append(attributes(rs.resource.attributes))
            for ss in rs.scope_spans:
                got.spans.extend(ss.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def metrics(request: web.Request) -> web.Response:
        msg = ExportMetricsServiceRequest.FromString(
            _body(await request.read(), request.headers.get("Content-Encoding")))
        for rm in msg.resource_metrics:
            got.resources.append(attributes(rm.resource.attributes))
            for sm in rm.scope_metrics:
                got.metrics.extend(sm.metrics)
        return web.Response(body=ExportMetricsServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    app.router.add_post("/v1/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}", got
    finally:
        await runner.cleanup()
