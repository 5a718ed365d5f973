"""Telemetry put into a process: the gateway's record sink and trace starter, the
apportioner's energy export. Each imports the OpenTelemetry packages only when export is on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web

from core.trace_context import TraceStarter
from gateway.config import GatewayConfig
from gateway.pipeline.record import Sink
from gateway.telemetry.config import TelemetryConfig, check_packages
from gateway.telemetry.spans import engine_infos

if TYPE_CHECKING:
    from accounting.metrics import ApportionerMetrics
    from gateway.telemetry.energy import EnergyExport


def start_telemetry(app: web.Application, config: GatewayConfig, sinks: list[Sink],
                    apportioner_metrics: ApportionerMetrics | None) -> TraceStarter | None:
    """With `telemetry.otlp_endpoint` set: the OTLP export sink added to `sinks` (flushed when
    `app` stops), the energy export where this process apportions, and the trace starter the
    proxy gives each request. None, and nothing done, when telemetry is off. Raises
    ConfigError when the OpenTelemetry packages are missing."""
    telemetry = config.telemetry
    if not telemetry.enabled:
        return None
    check_packages(telemetry)
    from gateway.telemetry.export import OtelExport  # needs the `otel` extra

    export = OtelExport(telemetry, engine_infos(
        {ep.name: (ep.kind, ep.url) for _, ep in config.endpoints()}))
    sinks.append(export)
    app.cleanup_ctx.append(export.cleanup_ctx)
    energy = energy_export(telemetry, apportioner_metrics)
    if energy is not None:  # this process apportions (inline): its counters too

        async def energy_ctx(_app: web.Application) -> AsyncIterator[None]:
            yield
            await asyncio.to_thread(energy.shutdown)

        app.cleanup_ctx.append(energy_ctx)
    return TraceStarter(traces=telemetry.traces, sample_ratio=telemetry.sample_ratio)


def energy_export(telemetry: TelemetryConfig, metrics: ApportionerMetrics | None
                  ) -> EnergyExport | None:
    """The export of the apportioner's energy, carbon and cost counters (energy.py), started;
    None when metrics export is off or this process does not apportion (`metrics` None)."""
    if metrics is None or not (telemetry.enabled and telemetry.metrics):
        return None
    check_packages(telemetry)
    from gateway.telemetry.energy import EnergyExport  # needs the `otel` extra

    return EnergyExport(telemetry, metrics)
