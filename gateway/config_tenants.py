"""Who may call the gateway: tenants (API key, SLO class, precision policy, limits, budgets)
and the SLO classes they name, as frozen config read from the `tenants:` and `slo_classes:`
sections. `gateway.config` re-exports these names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from core.config_fields import FieldReader, default_of, secret_hash
from core.errors import ConfigError
from core.vocab import PRECISIONS, Precision, SloClass
from gateway.tenancy.config import TenantBudgets, TenantLimits, parse_budgets, parse_limits


@dataclass(frozen=True, slots=True)
class PrecisionPolicy:
    allowed: tuple[Precision, ...] = PRECISIONS
    preferred: tuple[Precision, ...] = ()


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    key_sha256: str = field(repr=False)
    slo_class: str
    precision: PrecisionPolicy = PrecisionPolicy()
    limits: TenantLimits = field(default_factory=TenantLimits)
    budgets: TenantBudgets = field(default_factory=TenantBudgets)


def precision_list(r: FieldReader, key: str, default: tuple[Precision, ...]
                   ) -> tuple[Precision, ...]:
    """A list of precisions, each one of `PRECISIONS` (absent: `default`)."""
    value = r.get(key)
    if value is None:
        return default
    if not isinstance(value, list):
        raise ConfigError(r.at(key), "must be a list of precisions")
    out: list[Precision] = []
    for i, p in enumerate(value):
        if p not in PRECISIONS:
            raise ConfigError(f"{r.at(key)}[{i}]", f"{p!r} is not one of {', '.join(PRECISIONS)}")
        out.append(p)
    return tuple(out)


def parse_slo_classes(root: FieldReader) -> tuple[SloClass, ...]:
    raw = root.get("slo_classes") or {"default": {}}
    if not isinstance(raw, Mapping):
        raise ConfigError(root.at("slo_classes"), "must be a mapping of name -> limits")
    out = []
    for name, limits in raw.items():
        r = FieldReader(limits or {}, f"{root.at('slo_classes')}.{name}")
        out.append(
            SloClass(
                name=str(name), ttft_s=r.opt_number("ttft_s"), tpot_s=r.opt_number("tpot_s"),
                e2e_s=r.opt_number("e2e_s"),
            )
        )
        r.finish()
    return tuple(out)


def _precision_policy(pr: FieldReader) -> PrecisionPolicy:
    allowed = precision_list(pr, "allowed", default_of(PrecisionPolicy, "allowed"))
    preferred = precision_list(pr, "preferred", default_of(PrecisionPolicy, "preferred"))
    bad = [p for p in preferred if p not in allowed]
    if bad:
        raise ConfigError(pr.at("preferred"), f"{bad[0]!r} is not in allowed")
    pr.finish()
    return PrecisionPolicy(allowed=allowed, preferred=preferred)


def parse_tenants(root: FieldReader, env: Mapping[str, str], slo_names: set[str],
                  default_slo: str) -> tuple[Tenant, ...]:
    """The `tenants:` list; a tenant without `slo_class` gets `default_slo`."""
    tenants: list[Tenant] = []
    for path, raw in root.items("tenants", required=False):
        r = FieldReader(raw, path)
        name = r.name("name")
        slo = r.text("slo_class", default_slo)
        if slo not in slo_names:
            raise ConfigError(r.at("slo_class"), f"{slo!r} is not one of {', '.join(sorted(slo_names))}")
        tenant = Tenant(
            name=name, key_sha256=secret_hash(r, env, "api_key", required=True), slo_class=slo,
            precision=_precision_policy(r.sub("precisions")),
            limits=parse_limits(r.sub("limits")), budgets=parse_budgets(r),
        )
        r.finish()
        if any(t.key_sha256 == tenant.key_sha256 for t in tenants):
            raise ConfigError(path, "two tenants share one API key")
        if any(t.name == name for t in tenants):  # limits, budgets and bills go by name
            raise ConfigError(r.at("name"), f"{name!r} names two tenants; each tenant is one "
                              "entry (its limits, budgets and bills are kept by its name)")
        tenants.append(tenant)
    return tuple(tenants)
