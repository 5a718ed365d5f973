"""Prometheus series of accounting, created on a registry passed in: the recorder's (every
gateway process) and the apportioner's (the process that apportions: the gateway itself when
inline, else the apportioner process, whose series `wattgate serve` appends to its /metrics).

Per-tenant counters are incremented by the replica that apportions, as intervals are
apportioned; a revised interval adds the change. Counters never go down, so a tenant whose
share a revision lowered sees it netted against its next increments; the ledger is the bill.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LAG_NAME = "wattgate_accounting_lag_seconds"
LAG_HELP = ("Age of the end of the engine's last apportioned interval, at the scrape (only "
            "from the process that apportions): grows without bound when apportioning stalls")


class RecorderMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.ledger_errors = Counter("wattgate_ledger_errors", "Failed ledger operations",
                                     registry=registry)
        self.pending = Gauge("wattgate_accounting_pending_records", "Records not yet written "
                             "to the ledger", registry=registry)
        self.journal_failed = Gauge("wattgate_accounting_journal_failed", "1 once the request "
                                    "journal failed to write (a full disk) and stopped: "
                                    "records still go to the ledger, unjournalled",
                                    registry=registry)


class LagCollector(Collector):
    """`wattgate_accounting_lag_seconds{engine}`, computed when scraped: a gauge set by the
    apportioner's loop would freeze at its last value exactly when that loop is stuck."""

    def __init__(self, lag: Callable[[], dict[str, float]]):
        self._lag = lag

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(LAG_NAME, LAG_HELP, labels=["engine"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(LAG_NAME, LAG_HELP, labels=["engine"])
        for engine, lag_s in sorted(self._lag().items()):
            family.add_metric([engine], lag_s)
        yield family


class ApportionerMetrics:
    def __init__(self, registry: CollectorRegistry):
        self._registry = registry
        self.tenant_energy = Counter("wattgate_tenant_energy_joules", "Energy apportioned to a "
                                     "tenant's requests", ["tenant"], registry=registry)
        self.tenant_carbon = Counter("wattgate_tenant_carbon_grams", "Carbon (gCO2e) "
                                     "apportioned to a tenant", ["tenant"], registry=registry)
        self.tenant_cost = Counter("wattgate_tenant_cost_usd", "Cost apportioned to a tenant",
                                   ["tenant"], registry=registry)
        self.engine_energy = Counter("wattgate_engine_energy_joules", "Metered energy "
                                     "apportioned per engine", ["engine"], registry=registry)
        self.engine_idle = Counter("wattgate_engine_idle_energy_joules", "Energy of an engine's "
                                   "idle account", ["engine"], registry=registry)
        self.engine_failed = Counter("wattgate_engine_failed_energy_joules", "Energy of an "
                                     "engine's failed account: failed requests' energy not "
                                     "billed to their tenants (engine energy = tenants + idle "
                                     "+ failed)", ["engine"], registry=registry)
        self.residual = Gauge("wattgate_accounting_residual_joules", "Energy metered but not "
                              "yet apportioned (carried forward)", ["engine"], registry=registry)
        self.unaccounted = Gauge("wattgate_energy_unaccounted_joules", "Energy an engine's "
                                 "counters grew by that no apportioned interval holds and none "
                                 "will (0 unless joules were lost)", ["engine"],
                                 registry=registry)
        self.counter_step = Gauge("wattgate_meter_step_joules", "Largest growth of an engine's "
                                  "counters between two readings lately: the tolerance of "
                                  "wattgate_energy_unaccounted_joules", ["engine"],
                                  registry=registry)
        self.meter_errors = Counter("wattgate_meter_errors", "Failed meter reads",
                                    ["engine"], registry=registry)
        self.meter_resets = Gauge("wattgate_meter_resets", "Counter resets seen", ["engine"],
                                  registry=registry)
        self.estimated = Counter("wattgate_energy_estimated_joules", "Energy of counter-reset "
                                 "gaps the ledger holds as an estimate (idle power over the "
                                 "unread gap), not as measured", ["engine"], registry=registry)
        self.revisions = Counter("wattgate_accounting_revised_intervals", "Intervals "
                                 "re-apportioned because a record arrived late", ["engine"],
                                 registry=registry)
        self.held = Gauge("wattgate_accounting_held_seconds", "How long apportioning waits, "
                          "beyond settle_s, for requests still in flight (at most hold_s)",
                          registry=registry)
        self.ledger_errors = Counter("wattgate_apportioner_ledger_errors", "Failed ledger "
                                     "operations of the apportioner", registry=registry)
        self.leader = Gauge("wattgate_apportioner_leader", "1 while this process holds the "
                            "apportioner lock", registry=registry)

    def watch_lag(self, lag: Callable[[], dict[str, float]]) -> None:
        """Publish `lag()` (engine -> seconds) as wattgate_accounting_lag_seconds."""
        self._registry.register(LagCollector(lag))
