"""Typed, frozen gateway configuration, validated once at the edge.

`load_config(path)` reads YAML and returns a `GatewayConfig` or raises `ConfigError` naming the
field path (e.g. `models[0].endpoints[1].precision`) and the allowed values. Nothing here
touches the network; API keys are resolved from environment variables or stored as SHA-256
hashes and are never printed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from gateway.errors import ConfigError
from gateway.tenancy.config import (
    TenantBudgets,
    TenantControlsConfig,
    TenantLimits,
    parse_budgets,
    parse_limits,
)

if TYPE_CHECKING:
    from gateway.accounting.config import AccountingConfig

PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "int8", "int4")
ENGINE_KINDS: tuple[str, ...] = ("vllm", "trtllm", "openai")
ROUTING_POLICIES: tuple[str, ...] = ("round_robin", "least_load", "prefix_affinity", "slo_energy")
LOG_FORMATS: tuple[str, ...] = ("text", "json")
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One engine server behind a model alias."""

    name: str
    url: str
    kind: str
    precision: str
    gpus: int = 1
    upstream_model: str = ""  # model name the engine serves; defaults to the alias
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class ModelPool:
    name: str
    endpoints: tuple[Endpoint, ...]
    tokenizer: str = ""  # tokenizer.json, model folder or cached hub name ("": 4-byte estimate)


@dataclass(frozen=True, slots=True)
class PrecisionPolicy:
    allowed: tuple[str, ...] = PRECISIONS
    preferred: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    key_sha256: str = field(repr=False)
    slo_class: str
    precision: PrecisionPolicy = PrecisionPolicy()
    limits: TenantLimits = field(default_factory=TenantLimits)
    budgets: TenantBudgets = field(default_factory=TenantBudgets)


@dataclass(frozen=True, slots=True)
class SloClass:
    name: str
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 2.0
    first_byte_s: float = 60.0  # request sent -> response headers
    read_s: float = 30.0  # longest silence between two reads of a stream
    total_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Retries:
    max_attempts: int = 3
    deadline_s: float = 10.0  # no new attempt starts after this many seconds
    # Envoy's retry budget: retries in flight stay within this share of the requests in
    # flight (but min_retry_concurrency are always allowed), so a failing fleet is not
    # hammered with retries on top of its load
    budget_percent: float = 20.0
    min_retry_concurrency: int = 3


@dataclass(frozen=True, slots=True)
class OutlierDetection:
    """Envoy-style passive ejection: an engine that keeps failing requests (connect errors,
    first-byte timeouts, invalid HTTP, 5xx, broken streams) leaves the pool for a while,
    whatever its health endpoint says."""

    consecutive_failures: int = 5
    base_ejection_s: float = 30.0  # times the number of times it was ejected
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 50.0  # of a pool at once (one may always be ejected)


@dataclass(frozen=True, slots=True)
class HealthCheck:
    interval_s: float = 2.0
    timeout_s: float = 1.0
    unhealthy_after: int = 2  # consecutive failures before ejection
    healthy_after: int = 1  # consecutive successes before recovery
    scrape_metrics: bool = True


@dataclass(frozen=True, slots=True)
class Routing:
    policy: str = "least_load"
    prefix_chars: int = 256
    load_bound: float = 1.25  # prefix_affinity: skip endpoints above bound x mean load
    # slo_energy: predicted TTFT/TPOT must stay under slo_margin x the SLO class's limits; an
    # endpoint found full stays so until its prediction falls below (1 - hysteresis) x that
    slo_margin: float = 0.8
    hysteresis: float = 0.15
    min_samples: int = 20  # latency samples before an endpoint's models are no longer cold
    # assumed output tokens of a request that sets no max_tokens
    default_output_tokens: int = 256
    # quality score per precision (e.g. an eval's accuracy relative to BF16) and the least
    # score each SLO class accepts; precisions below it are not routed to for that class
    quality: tuple[tuple[str, float], ...] = ()
    min_quality: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8080
    keepalive_s: float = 75.0  # idle client connections close after this (nginx's default)
    header_timeout_s: float = 10.0  # a whole request head, from connect or the last response
    body_timeout_s: float = 30.0  # a whole body, after its head, plus size / min rate:
    body_min_bytes_per_s: float = 65536.0
    max_connections: int = 4096  # open client connections per process; past it 503
    max_inflight: int = 1024  # requests served at once per process; past it 503


@dataclass(frozen=True, slots=True)
class Logging:
    format: str = "text"  # "text" or "json" (one JSON object per line)
    level: str = "info"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    listen: Listen
    models: tuple[ModelPool, ...]
    tenants: tuple[Tenant, ...]
    slo_classes: tuple[SloClass, ...]
    default_slo_class: str
    routing: Routing = Routing()
    timeouts: Timeouts = Timeouts()
    retries: Retries = Retries()
    outlier_detection: OutlierDetection = OutlierDetection()
    health: HealthCheck = HealthCheck()
    logging: Logging = Logging()
    max_body_bytes: int = 4 * 1024 * 1024
    drain_timeout_s: float = 30.0
    admin_key_sha256: str = field(default="", repr=False)
    auth_required: bool = True
    accounting: AccountingConfig | None = None  # None: no energy accounting
    access_log: str = ""  # JSON lines, one per finished request: a file path, "-" (stderr), "" off
    tenant_controls: TenantControlsConfig = field(default_factory=TenantControlsConfig)
    metrics_key_sha256: str = field(default="", repr=False)  # "": /metrics needs no key

    def endpoints(self) -> tuple[tuple[str, Endpoint], ...]:
        """(model alias, endpoint) for every endpoint of every pool."""
        return tuple((pool.name, ep) for pool in self.models for ep in pool.endpoints)

    def model(self, name: str) -> ModelPool | None:
        for pool in self.models:
            if pool.name == name:
                return pool
        return None

    def slo(self, name: str) -> SloClass:
        for slo in self.slo_classes:
            if slo.name == name:
                return slo
        raise KeyError(name)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# --- validation helpers -------------------------------------------------------------------


class FieldReader:
    """Reads one mapping of the YAML tree, remembering its path for error messages."""

    def __init__(self, data: Any, path: str):
        if not isinstance(data, Mapping):
            raise ConfigError(path or "<root>", f"expected a mapping, got {type(data).__name__}")
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def text(self, key: str, default: str | None = None) -> str:
        value = self.get(key, default)
        if value is None:
            raise ConfigError(self.at(key), "is required")
        if not isinstance(value, str) or not value:
            raise ConfigError(self.at(key), "must be a non-empty string")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str | None = None) -> str:
        value = self.text(key, default)
        if value not in allowed:
            raise ConfigError(self.at(key), f"{value!r} is not one of {', '.join(allowed)}")
        return value

    def number(self, key: str, default: float | None, *, minimum: float = 0.0,
            inclusive: bool = False) -> float:
        """A number > minimum (>= minimum when inclusive)."""
        value = self.get(key, default)
        if value is None:
            raise ConfigError(self.at(key), "is required")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(self.at(key), "must be a finite number")
        if value < minimum or (value == minimum and not inclusive):
            raise ConfigError(self.at(key), f"must be {'>=' if inclusive else '>'} {minimum:g}")
        return float(value)

    def opt_number(self, key: str, *, inclusive: bool = False) -> float | None:
        if self.get(key) is None:
            return None
        return self.number(key, None, inclusive=inclusive)

    def integer(self, key: str, default: int | None, *, minimum: int = 1) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.at(key), "must be an integer")
        if value < minimum:
            raise ConfigError(self.at(key), f"must be >= {minimum}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.at(key), "must be true or false")
        return value

    def sub(self, key: str) -> FieldReader:
        return FieldReader(self.get(key) or {}, self.at(key))

    def items(self, key: str, *, required: bool = True) -> list[tuple[str, Any]]:
        value = self.get(key)
        if value is None and not required:
            return []
        if not isinstance(value, list) or (required and not value):
            raise ConfigError(self.at(key), "must be a non-empty list")
        return [(f"{self.at(key)}[{i}]", item) for i, item in enumerate(value)]

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ConfigError(self.at(str(unknown[0])), "unknown field")


def _secret_hash(r: FieldReader, env: Mapping[str, str], prefix: str, *, required: bool) -> str:
    """A key given as `<prefix>_env` (env var name) or `<prefix>_sha256` (hex digest)."""
    env_name = r.get(f"{prefix}_env")
    digest = r.get(f"{prefix}_sha256")
    if env_name and digest:
        raise ConfigError(r.at(f"{prefix}_env"), f"give {prefix}_env or {prefix}_sha256, not both")
    if digest:
        if not isinstance(digest, str) or len(digest) != 64:
            raise ConfigError(r.at(f"{prefix}_sha256"), "must be 64 hex digits (sha256)")
        try:
            int(digest, 16)
        except ValueError:
            raise ConfigError(r.at(f"{prefix}_sha256"), "must be 64 hex digits") from None
        return digest.lower()
    if env_name:
        if not isinstance(env_name, str):
            raise ConfigError(r.at(f"{prefix}_env"), "must be an environment variable name")
        value = env.get(env_name)
        if not value:
            raise ConfigError(r.at(f"{prefix}_env"), f"environment variable {env_name} is unset")
        return hash_key(value)
    if required:
        raise ConfigError(r.at(f"{prefix}_env"), f"one of {prefix}_env or {prefix}_sha256 is required")
    return ""


def _precisions(r: FieldReader, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = r.get(key)
    if value is None:
        return default
    if not isinstance(value, list):
        raise ConfigError(r.at(key), "must be a list of precisions")
    for i, p in enumerate(value):
        if p not in PRECISIONS:
            raise ConfigError(f"{r.at(key)}[{i}]", f"{p!r} is not one of {', '.join(PRECISIONS)}")
    return tuple(value)


def _endpoint(path: str, raw: Any, alias: str) -> Endpoint:
    r = FieldReader(raw, path)
    url = r.text("url").rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(r.at("url"), "must start with http:// or https://")
    ep = Endpoint(
        name=r.text("name", url.split("://", 1)[1]),
        url=url,
        kind=r.choice("kind", ENGINE_KINDS, "vllm"),
        precision=r.choice("precision", PRECISIONS),
        gpus=r.integer("gpus", 1),
        upstream_model=r.text("model", alias),
        weight=r.number("weight", 1.0),
    )
    r.finish()
    return ep


def _models(root: FieldReader) -> tuple[ModelPool, ...]:
    pools: list[ModelPool] = []
    seen_endpoints: set[str] = set()
    for path, raw in root.items("models"):
        r = FieldReader(raw, path)
        name = r.text("name")
        if "@" in name:
            raise ConfigError(r.at("name"), "must not contain '@' (it selects a precision)")
        endpoints = tuple(_endpoint(p, e, name) for p, e in r.items("endpoints"))
        tokenizer = r.text("tokenizer") if r.get("tokenizer") is not None else ""
        for i, ep in enumerate(endpoints):
            if ep.name in seen_endpoints:
                raise ConfigError(f"{r.at('endpoints')}[{i}].name", f"duplicate endpoint {ep.name!r}")
            seen_endpoints.add(ep.name)
        r.finish()
        if any(p.name == name for p in pools):
            raise ConfigError(r.at("name"), f"duplicate model {name!r}")
        pools.append(ModelPool(name=name, endpoints=endpoints, tokenizer=tokenizer))
    return tuple(pools)


def _scores(r: FieldReader, key: str, names: set[str]) -> tuple[tuple[str, float], ...]:
    """A mapping name -> score in [0, 1] whose names are among `names` (routing.quality,
    routing.min_quality)."""
    raw = r.get(key) or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(r.at(key), "must be a mapping of name -> score")
    out = []
    for name, value in raw.items():
        if name not in names:
            raise ConfigError(f"{r.at(key)}.{name}", f"not one of {', '.join(sorted(names))}")
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
            raise ConfigError(f"{r.at(key)}.{name}", "must be a number from 0 to 1")
        out.append((str(name), float(value)))
    return tuple(out)


def _slo_classes(root: FieldReader) -> tuple[SloClass, ...]:
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


def _tenants(root: FieldReader, env: Mapping[str, str], slo_names: set[str], default_slo: str
             ) -> tuple[Tenant, ...]:
    tenants: list[Tenant] = []
    for path, raw in root.items("tenants", required=False):
        r = FieldReader(raw, path)
        name = r.text("name")
        slo = r.text("slo_class", default_slo)
        if slo not in slo_names:
            raise ConfigError(r.at("slo_class"), f"{slo!r} is not one of {', '.join(sorted(slo_names))}")
        pr = r.sub("precisions")
        allowed = _precisions(pr, "allowed", PRECISIONS)
        preferred = _precisions(pr, "preferred", ())
        bad = [p for p in preferred if p not in allowed]
        if bad:
            raise ConfigError(pr.at("preferred"), f"{bad[0]!r} is not in allowed")
        pr.finish()
        tenant = Tenant(
            name=name, key_sha256=_secret_hash(r, env, "api_key", required=True), slo_class=slo,
            precision=PrecisionPolicy(allowed=allowed, preferred=preferred),
            limits=parse_limits(r.sub("limits")), budgets=parse_budgets(r),
        )
        r.finish()
        if any(t.key_sha256 == tenant.key_sha256 for t in tenants):
            raise ConfigError(path, "two tenants share one API key")
        tenants.append(tenant)
    return tuple(tenants)


def _accounting(root: FieldReader, env: Mapping[str, str], base_dir: Path | None,
                models: tuple[ModelPool, ...]) -> AccountingConfig | None:
    raw = root.get("accounting")
    if raw is None:
        return None
    from gateway.accounting.config import parse_accounting

    acct = parse_accounting(raw, env, base_dir)
    ledger = acct.ledger
    if ledger.kind == "sqlite" and base_dir is not None and not Path(ledger.path).is_absolute():
        # a relative ledger path is relative to the config file, like every other path in it
        path = str((base_dir / ledger.path).resolve())
        acct = dataclasses.replace(acct, ledger=dataclasses.replace(ledger, path=path))
    names = {ep.name for pool in models for ep in pool.endpoints}
    for name, _ in acct.meters:
        if name not in names:
            raise ConfigError(f"accounting.meters.{name}",
                              f"no endpoint named {name!r}; endpoints: {', '.join(sorted(names))}")
    return acct


_Section = TypeVar("_Section")


def section(r: FieldReader, cls: type[_Section], *, minimums: Mapping[str, float] | None = None,
            choices: Mapping[str, tuple[str, ...]] | None = None) -> _Section:
    """A flat config section read into its dataclass, each default written once (in the
    dataclass): numbers are > 0 unless `minimums` says otherwise, integers >= 1, strings
    one of `choices` where given. Unknown keys are refused, naming the field."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        default = f.default
        low = (minimums or {}).get(f.name)
        if isinstance(default, bool):
            values[f.name] = r.flag(f.name, default)
        elif isinstance(default, int):
            values[f.name] = r.integer(f.name, default, minimum=int(1 if low is None else low))
        elif isinstance(default, float):
            values[f.name] = r.number(f.name, default, minimum=0.0 if low is None else low)
        elif choices and f.name in choices:
            values[f.name] = r.choice(f.name, choices[f.name], str(default))
        else:
            values[f.name] = r.text(f.name, str(default))
    r.finish()
    return cls(**values)


def _access_log(root: FieldReader, base_dir: Path | None) -> str:
    value = root.get("access_log")
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise ConfigError(root.at("access_log"), "must be a file path, or '-' for stderr")
    if value != "-" and base_dir is not None and not Path(value).is_absolute():
        return str(base_dir / value)
    return value


def parse_config(data: Any, env: Mapping[str, str] | None = None,
                 base_dir: Path | None = None) -> GatewayConfig:
    """Validate a decoded YAML document into a GatewayConfig (pure; env passed in).

    `base_dir` resolves relative file paths (CSV series, SQLite file) of the accounting section.
    """
    env = os.environ if env is None else env
    root = FieldReader(data if data is not None else {}, "")
    listen = section(root.sub("listen"), Listen, minimums={"port": 0})
    slo_classes = _slo_classes(root)
    slo_names = {s.name for s in slo_classes}
    default_slo = root.text("default_slo_class", slo_classes[0].name)
    if default_slo not in slo_names:
        raise ConfigError("default_slo_class",
                          f"{default_slo!r} is not one of {', '.join(sorted(slo_names))}")
    tenants = _tenants(root, env, slo_names, default_slo)
    rr = root.sub("routing")
    routing = Routing(
        policy=rr.choice("policy", ROUTING_POLICIES, "least_load"),
        prefix_chars=rr.integer("prefix_chars", 256),
        load_bound=rr.number("load_bound", 1.25, minimum=1.0, inclusive=True),
        slo_margin=rr.number("slo_margin", 0.8),
        hysteresis=rr.number("hysteresis", 0.15, minimum=0.0, inclusive=True),
        min_samples=rr.integer("min_samples", 20),
        default_output_tokens=rr.integer("default_output_tokens", 256),
        quality=_scores(rr, "quality", set(PRECISIONS)),
        min_quality=_scores(rr, "min_quality", slo_names),
    )
    rr.finish()
    if routing.slo_margin > 1.0 or routing.hysteresis >= 1.0:
        raise ConfigError("routing.slo_margin" if routing.slo_margin > 1.0
                          else "routing.hysteresis", "must be at most 1 (a share)")
    tr = root.sub("timeouts")
    timeouts = Timeouts(
        connect_s=tr.number("connect_s", 2.0), first_byte_s=tr.number("first_byte_s", 60.0),
        read_s=tr.number("read_s", 30.0), total_s=tr.number("total_s", 600.0),
    )
    tr.finish()
    retries = section(root.sub("retries"), Retries, minimums={"min_retry_concurrency": 0})
    outlier = section(root.sub("outlier_detection"), OutlierDetection)
    log_cfg = section(root.sub("logging"), Logging,
                      choices={"format": LOG_FORMATS, "level": LOG_LEVELS})
    hr = root.sub("health")
    health = HealthCheck(
        interval_s=hr.number("interval_s", 2.0), timeout_s=hr.number("timeout_s", 1.0),
        unhealthy_after=hr.integer("unhealthy_after", 2), healthy_after=hr.integer("healthy_after", 1),
        scrape_metrics=hr.flag("scrape_metrics", True),
    )
    hr.finish()
    ar = root.sub("admin")
    admin_hash = _secret_hash(ar, env, "api_key", required=False)
    ar.finish()
    mr = root.sub("metrics")
    metrics_hash = _secret_hash(mr, env, "api_key", required=False)
    mr.finish()
    controls = section(root.sub("tenant_controls"), TenantControlsConfig)
    models = _models(root)
    config = GatewayConfig(
        listen=listen,
        models=models,
        tenants=tenants,
        slo_classes=slo_classes,
        default_slo_class=default_slo,
        routing=routing,
        timeouts=timeouts,
        retries=retries,
        outlier_detection=outlier,
        health=health,
        logging=log_cfg,
        max_body_bytes=root.integer("max_body_bytes", 4 * 1024 * 1024),
        drain_timeout_s=root.number("drain_timeout_s", 30.0),
        admin_key_sha256=admin_hash,
        auth_required=root.flag("auth_required", True),
        accounting=_accounting(root, env, base_dir, models),
        access_log=_access_log(root, base_dir),
        tenant_controls=controls,
        metrics_key_sha256=metrics_hash,
    )
    budgeted = [i for i, t in enumerate(tenants) if t.budgets.budgets]
    if budgeted and (config.accounting is None or not config.accounting.enabled):
        raise ConfigError(f"tenants[{budgeted[0]}].budgets",
                          "budgets are kept in the ledger: configure accounting")
    if config.auth_required and not tenants:
        raise ConfigError("tenants", "at least one tenant is required when auth_required is true")
    root.finish()
    return config


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and validate a YAML config file; raises ConfigError naming the bad field."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), f"cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(p), f"invalid YAML: {exc}") from None
    return parse_config(data, env, p.resolve().parent)


def normalised(config: GatewayConfig) -> dict[str, Any]:
    """The config as plain data for `wattgate config check`; secrets shown only as present."""
    from dataclasses import asdict

    data = asdict(config)
    for tenant in data["tenants"]:
        tenant["key_sha256"] = "<set>"
    data["admin_key_sha256"] = "<set>" if config.admin_key_sha256 else "<unset>"
    data["metrics_key_sha256"] = "<set>" if config.metrics_key_sha256 else "<unset>"
    if config.accounting is not None:
        ledger = data["accounting"]["ledger"]
        ledger["dsn"] = "<set>" if ledger.get("dsn") else ""
    return data
