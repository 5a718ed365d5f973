"""Prometheus series of the accounting service, created on a registry passed in.

Per-tenant counters are incremented by the replica that apportions, as intervals are
apportioned; a revised interval adds the change. Counters never go down, so a tenant whose
share a revision lowered sees it netted against its next increments; the ledger is the bill.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class AccountingMetrics:
    def __init__(self, registry: CollectorRegistry):
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
        self.revisions = Counter("wattgate_accounting_revised_intervals", "Intervals "
                                 "re-apportioned because a record arrived late", ["engine"],
                                 registry=registry)
        self.held = Gauge("wattgate_accounting_held_seconds", "How long apportioning waits, "
                          "beyond settle_s, for requests still in flight (at most hold_s)",
                          registry=registry)
        self.ledger_errors = Counter("wattgate_ledger_errors", "Failed ledger operations",
                                     registry=registry)
        self.pending = Gauge("wattgate_accounting_pending_records", "Records not yet written "
                             "to the ledger", registry=registry)
