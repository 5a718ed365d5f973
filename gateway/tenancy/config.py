"""Per-tenant limits and budgets as frozen config, read with the gateway's FieldReader.

A tenant's section:

    limits: {requests_per_second: 5, requests_per_minute: 120, tokens_per_minute: 40000,
             max_concurrent: 8}
    budgets:
      - {period: day, usd: 5.0}
      - {period: hour, kwh: 0.2}          # or j: 720000
      - {period: month, gco2e: 500}
    on_budget: reject                     # or downgrade: a cheaper allowed precision
    budget_downgrade_pinned: false        # downgrade a precision the request pinned too
    budget_soft_percent: 80               # the alert threshold (a metric, not a refusal)
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config_fields import FieldReader, default_of
from core.errors import ConfigError

PERIODS: tuple[str, ...] = ("hour", "day", "month")
ON_BUDGET: tuple[str, ...] = ("reject", "downgrade")
# budget units as written in the config -> (the unit kept, factor to it)
BUDGET_UNITS: dict[str, tuple[str, float]] = {
    "usd": ("usd", 1.0), "j": ("j", 1.0), "kwh": ("j", 3.6e6), "gco2e": ("gco2e", 1.0),
}


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """Rate limits and the concurrency cap of one tenant (None: no limit)."""

    requests_per_second: float | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None  # prompt + completion tokens
    max_concurrent: int | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.requests_per_second, self.requests_per_minute,
                                           self.tokens_per_minute, self.max_concurrent))


@dataclass(frozen=True, slots=True)
class Budget:
    """A spend limit over one UTC calendar period, in one unit: "usd", "j" or "gco2e"."""

    period: str
    unit: str
    limit: float


@dataclass(frozen=True, slots=True)
class TenantBudgets:
    budgets: tuple[Budget, ...] = ()
    on_budget: str = "reject"
    soft_percent: float = 80.0
    # on_budget: downgrade changes a precision the request pinned (`model@fp8`, the
    # x-wattgate-precision header) too; off, such a request is refused and told why
    downgrade_pinned: bool = False


@dataclass(frozen=True, slots=True)
class TenantControlsConfig:
    """Gateway-wide settings of tenant controls (section `tenant_controls`)."""

    default_max_tokens: int = 256  # reserved when a request gives no max_tokens
    reservation_ttl_s: float = 900.0  # a reservation nobody settled counts no longer after this
    refresh_s: float = 1.0  # live replicas, J/token and spend gauges are re-read this often


def parse_limits(r: FieldReader) -> TenantLimits:
    concurrent = r.get("max_concurrent")
    limits = TenantLimits(
        requests_per_second=r.opt_number("requests_per_second"),
        requests_per_minute=r.opt_number("requests_per_minute"),
        tokens_per_minute=r.opt_number("tokens_per_minute"),
        max_concurrent=None if concurrent is None else r.integer("max_concurrent", None),
    )
    r.finish()
    return limits


def parse_budgets(r: FieldReader) -> TenantBudgets:
    """From the tenant's section: `budgets`, `on_budget`, `budget_soft_percent`."""
    budgets: list[Budget] = []
    for path, raw in r.items("budgets", required=False):
        b = FieldReader(raw, path)
        period = b.choice("period", PERIODS)
        units = [u for u in BUDGET_UNITS if b.get(u) is not None]
        if len(units) != 1:
            raise ConfigError(path, f"give exactly one of {', '.join(BUDGET_UNITS)}")
        unit, factor = BUDGET_UNITS[units[0]]
        limit = b.number(units[0], None) * factor
        b.finish()
        if any(x.period == period and x.unit == unit for x in budgets):
            raise ConfigError(path, f"a second {period} budget in {unit}")
        budgets.append(Budget(period, unit, limit))
    return TenantBudgets(
        budgets=tuple(budgets),
        on_budget=r.choice("on_budget", ON_BUDGET, default_of(TenantBudgets, "on_budget")),
        soft_percent=r.number("budget_soft_percent", default_of(TenantBudgets, "soft_percent")),
        downgrade_pinned=r.flag("budget_downgrade_pinned",
                                default_of(TenantBudgets, "downgrade_pinned")),
    )
