"""The `telemetry:` config section: where OTLP goes and what is sent (off by default)."""

from __future__ import annotations

from dataclasses import dataclass

from core.config_fields import FieldReader, section
from core.errors import ConfigError

INSTALL_HINT = "pip install 'wattgate[otel]'"


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    otlp_endpoint: str = ""  # OTLP/HTTP base URL (…/v1/traces, …/v1/metrics); "": no export
    service_name: str = "wattgate"
    traces: bool = True
    metrics: bool = True
    export_interval_s: float = 10.0  # metrics pushed, and spans batched, this often
    sample_ratio: float = 1.0  # of new traces; a client's traceparent decides for its own

    @property
    def enabled(self) -> bool:
        return bool(self.otlp_endpoint) and (self.traces or self.metrics)


def parse_telemetry(r: FieldReader) -> TelemetryConfig:
    """The section at `r` (absent: off)."""
    raw = r.get("otlp_endpoint")
    endpoint = "" if raw is None or raw == "" else r.text("otlp_endpoint")
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(r.at("otlp_endpoint"), "must start with http:// or https:// "
                          "(the collector's OTLP/HTTP port, e.g. http://127.0.0.1:4318)")
    telemetry = section(r, TelemetryConfig, minimums={"sample_ratio": 0.0},
                        given={"otlp_endpoint": endpoint.rstrip("/")})
    if telemetry.sample_ratio > 1.0:
        raise ConfigError(r.at("sample_ratio"), "must be at most 1 (a share of new traces)")
    return telemetry


def check_packages(telemetry: TelemetryConfig) -> None:
    """Raises ConfigError (one line, naming the extra to install) when export is on and the
    OpenTelemetry packages are missing."""
    if not telemetry.enabled:
        return
    try:
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise ConfigError("telemetry.otlp_endpoint", "OTLP export needs the OpenTelemetry "
                          f"packages, which are not installed: {INSTALL_HINT}") from None
