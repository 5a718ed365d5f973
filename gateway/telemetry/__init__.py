"""OpenTelemetry export: GenAI metrics and one trace per request, sent over OTLP/HTTP.

Off unless the config's `telemetry.otlp_endpoint` is set. The request path then only carries
a `RequestTrace` (context.py: the W3C trace context and the ids chosen at dispatch); the spans
and metric points are built after the request, from its record (spans.py, export.py). The
OpenTelemetry packages (the `otel` extra) are imported only when export is on.
"""
