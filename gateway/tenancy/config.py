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

and gateway-wide (`tenant_controls`), where the rate limits are kept when replicas share them:

    shared_store: {dsn_env: RATE_PG, on_store_down: open}   # no dsn: the ledger's PostgreSQL
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from core.config_fields import FieldReader, default_of, postgres_url, section
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


# what the gateway does with a rate-limited tenant's request while the shared store is down:
# admit it against this replica's share of the limit (limit / live replicas), or refuse it (503)
OnStoreDown = Literal["open", "closed"]
ON_STORE_DOWN: tuple[OnStoreDown, ...] = get_args(OnStoreDown)


@dataclass(frozen=True, slots=True)
class SharedStoreConfig:
    """The PostgreSQL database where every replica's rate limits are kept together
    (`tenant_controls.shared_store`; shared.py)."""

    dsn: str = field(default="", repr=False)  # resolved at load: the ledger's when not given
    on_store_down: OnStoreDown = "open"
    timeout_s: float = 0.5  # a lease the store has not answered by then: the store is down


@dataclass(frozen=True, slots=True)
class TenantControlsConfig:
    """Gateway-wide settings of tenant controls (section `tenant_controls`)."""

    default_max_tokens: int = 256  # reserved when a request gives no max_tokens
    reservation_ttl_s: float = 900.0  # a reservation nobody settled counts no longer after this
    refresh_s: float = 1.0  # live replicas, J/token and spend gauges are re-read this often
    shared_store: SharedStoreConfig | None = None  # None: each replica enforces limit / N


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


def parse_tenant_controls(r: FieldReader, env: Mapping[str, str], ledger_dsn: str
                          ) -> TenantControlsConfig:
    """The `tenant_controls` section. `ledger_dsn`: the PostgreSQL ledger's DSN ("" when the
    ledger is not PostgreSQL), which a `shared_store` without a DSN of its own shares."""
    store: SharedStoreConfig | None = None
    if r.get("shared_store") is not None:
        s = r.sub("shared_store")
        dsn = _dsn(s, env) or ledger_dsn
        if not dsn:
            raise ConfigError(s.at("dsn"), "give dsn or dsn_env, or configure a postgres "
                              "ledger (accounting.ledger) whose database it then shares")
        store = section(s, SharedStoreConfig, given={"dsn": dsn})
    return section(r, TenantControlsConfig, given={"shared_store": store})


def _dsn(r: FieldReader, env: Mapping[str, str]) -> str:
    """`dsn` or `dsn_env` (the name of a variable holding it), "" when neither is given."""
    dsn, name = r.get("dsn"), r.get("dsn_env")
    if dsn is not None and name is not None:
        raise ConfigError(r.at("dsn"), "give dsn or dsn_env, not both")
    if name is not None:
        if not isinstance(name, str) or not env.get(name):
            raise ConfigError(r.at("dsn_env"), f"environment variable {name} is unset")
        return postgres_url(r.at("dsn_env"), env[name])
    return "" if dsn is None else postgres_url(r.at("dsn"), dsn)
