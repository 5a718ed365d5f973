"""One `/metrics` for a node: the workers' expositions merged into one (a pure function).

Counters and histograms (their `_bucket`, `_count` and `_sum` samples) are summed over the
workers, label set by label set. Gauges follow a declared rule per name, as
prometheus_client's multiprocess modes do: in-flight-like gauges (what each worker holds)
are summed; `wattgate_apportioner_up` takes the minimum (down for the node if any worker
cannot reach the child); every other gauge is a node-wide reading that each worker makes
for itself (an engine's health, a tenant's budget from the ledger) and takes the maximum, as
does `wattgate_apportioner_restarts_total` (each worker shows the parent's count).

Each worker also gets `wattgate_worker_up{worker}` (it answered this scrape) and
`wattgate_worker_requests_total{worker}` (its completion requests): one series per worker,
bounded by `--workers`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

Rule = Literal["sum", "max", "min"]
GAUGE_SUM = frozenset({
    "wattgate_requests_in_flight", "wattgate_tenant_requests_active",
    "wattgate_accounting_unwritten_records", "wattgate_accounting_forgotten_records",
    "wattgate_accounting_pending_records",
})
GAUGE_MIN = frozenset({"wattgate_apportioner_up"})
# counters every worker reads from the node (the parent's count of the child's restarts)
COUNTER_MAX = frozenset({"wattgate_apportioner_restarts"})
REQUESTS = "wattgate_requests_total"  # the sample a worker's traffic is counted by


def gauge_rule(name: str) -> Rule:
    if name in GAUGE_SUM:
        return "sum"
    return "min" if name in GAUGE_MIN else "max"


def _combine(rule: Rule, a: float, b: float) -> float:
    if rule == "sum":
        return a + b
    return max(a, b) if rule == "max" else min(a, b)


def _rule(family: Metric, sample: Sample) -> Rule:
    if family.type == "gauge":
        return gauge_rule(family.name)
    if sample.name.endswith("_created"):
        return "min"  # the earliest worker's start
    return "max" if family.name in COUNTER_MAX else "sum"


class _Merged:
    """prometheus_client's collector interface over families already merged."""

    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(texts: Sequence[bytes | None]) -> bytes:
    """The workers' expositions (index: worker; None: it did not answer) as one."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    up = Metric("wattgate_worker_up", "1 when the worker answered this scrape", "gauge")
    per_worker = Metric("wattgate_worker_requests", "Completion requests this worker served",
                        "counter")
    for index, text in enumerate(texts):
        worker = str(index)
        up.add_sample("wattgate_worker_up", {"worker": worker}, 0.0 if text is None else 1.0)
        if text is None:
            continue
        served = 0.0
        for family in text_string_to_metric_families(text.decode()):
            merged = families.setdefault(family.name, Metric(
                family.name, family.documentation, family.type, family.unit))
            by_key = values.setdefault(family.name, {})
            for sample in family.samples:
                if sample.name == REQUESTS:
                    served += sample.value
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = by_key.get(key)
                by_key[key] = (sample.value if old is None
                               else _combine(_rule(merged, sample), old, sample.value))
        per_worker.add_sample("wattgate_worker_requests_total", {"worker": worker}, served)
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged([*families.values(), up, per_worker]))
    return generate_latest(registry)

