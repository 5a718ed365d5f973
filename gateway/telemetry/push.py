"""The thread that pushes the gateway's histograms (histograms.py) over OTLP/HTTP every
`export_interval_s`, as cumulative explicit-bucket histograms, and once more at shutdown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from gateway.telemetry.histograms import HistogramSet

log = logging.getLogger("wattgate.telemetry")


class HistogramPusher:
    """Pushes `histograms` to `endpoint` (…/v1/metrics) from a daemon thread."""

    def __init__(self, histograms: HistogramSet, meta: Mapping[str, tuple[str, str]],
                 endpoint: str, interval_s: float, resource: Resource,
                 scope: InstrumentationScope, *, timeout_s: float):
        """`meta`: metric name -> (unit, description); `timeout_s`: one export, retries
        included."""
        self.histograms = histograms
        self.meta = dict(meta)
        self.exporter = OTLPMetricExporter(endpoint=endpoint, timeout=timeout_s)
        self.interval_s = interval_s
        self.resource = resource
        self.scope = scope
        self.start_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wattgate-otlp-metrics",
                                        daemon=True)
        self._thread.start()

    def data(self) -> MetricsData:
        """The histograms as OTLP metrics data, now."""
        now_ns = time.time_ns()
        by_name: dict[str, list[HistogramDataPoint]] = {}
        for p in self.histograms.snapshot():
            by_name.setdefault(p.name, []).append(HistogramDataPoint(
                dict(p.attributes), self.start_ns, now_ns, p.count, p.sum, p.bucket_counts,
                self.histograms.bounds(p.name), p.min, p.max))
        metrics = [Metric(name, self.meta[name][1], self.meta[name][0],
                          Histogram(points, AggregationTemporality.CUMULATIVE))
                   for name, points in by_name.items()]
        return MetricsData([ResourceMetrics(self.resource, [
            ScopeMetrics(self.scope, metrics, "")], "")])

    def push(self) -> None:
        data = self.data()
        if data.resource_metrics[0].scope_metrics[0].metrics:
            self.exporter.export(data)  # the exporter logs and retries what fails

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.push()
            except Exception:  # the thread must outlive one bad export; the next may work
                log.warning("OTLP metrics export failed", exc_info=True)

    def shutdown(self) -> None:
        """Stop the thread, push once more, close the exporter."""
        self._stop.set()
        self._thread.join()
        try:
            self.push()
        finally:
            self.exporter.shutdown()
