"""Typed, frozen gateway configuration, validated once at the edge.

`load_config(path)` reads YAML and returns a `GatewayConfig` or raises `ConfigError` naming the
field path (e.g. `models[0].endpoints[1].precision`) and the allowed values. Nothing here
touches the network; API keys are resolved from environment variables or stored as SHA-256
hashes and are never printed. Each default is written once, in its dataclass; the parsers
read it from there (`config_fields.section`, `default_of`). Tenants and SLO classes are read
in `config_tenants`, how engines are treated (timeouts, retries, outlier detection, health
checks) in `config_upstream`, the `accounting:` section in `accounting.config`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from accounting.config import AccountingConfig, parse_accounting, paths_base
from core.config_fields import FieldReader, default_of, hash_key, secret_hash, section
from core.errors import ConfigError
from core.quality import Quality, parse_quality
from core.vocab import (
    PRECISIONS,
    EngineKind,
    LogFormat,
    LogLevel,
    PolicyName,
    Precision,
    SloClass,
)
from gateway.config_tenants import PrecisionPolicy, Tenant, parse_slo_classes, parse_tenants
from gateway.config_upstream import (
    HealthCheck,
    OutlierDetection,
    Retries,
    Timeouts,
    parse_outlier_detection,
)
from gateway.telemetry.config import TelemetryConfig, parse_telemetry
from gateway.tenancy.config import TenantControlsConfig, parse_tenant_controls

# names other modules import from here
__all__ = [
    "PRECISIONS", "Endpoint", "FieldReader", "GatewayConfig", "HealthCheck", "Listen", "Logging",
    "ModelPool", "OutlierDetection", "PrecisionPolicy", "Retries", "Routing", "SloClass", "Tenant",
    "Timeouts", "hash_key", "load_config", "parse_config", "section",
]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One engine server behind a model alias."""

    name: str
    url: str
    precision: Precision
    kind: EngineKind = "vllm"
    gpus: int = 1
    upstream_model: str = ""  # model name the engine serves; the parser defaults it to the alias
    weight: float = 1.0
    # its output quality relative to 16-bit (core/quality.py); the parser defaults it to the
    # published figure for its precision
    quality: Quality | None = None


@dataclass(frozen=True, slots=True)
class ModelPool:
    name: str
    endpoints: tuple[Endpoint, ...]
    tokenizer: str = ""  # tokenizer.json, model folder or cached hub name ("": 4-byte estimate)
    # the engines' context length (vLLM's max_model_len): a budget reserves up to it for a
    # request without max_tokens (None: tenant_controls.default_max_tokens)
    max_model_len: int | None = None


@dataclass(frozen=True, slots=True)
class Routing:
    policy: PolicyName = "least_load"
    prefix_chars: int = 256
    load_bound: float = 1.25  # prefix_affinity: skip endpoints above bound x mean load
    # slo_energy: predicted TTFT/TPOT must stay under slo_margin x the SLO class's limits; an
    # endpoint found full stays so until its prediction falls below (1 - hysteresis) x that
    slo_margin: float = 0.8
    hysteresis: float = 0.15
    min_samples: int = 20  # latency samples before an endpoint's models are no longer cold
    # each endpoint's recent success ratio (its failures over about the last
    # success_window_s, decayed) weighs its chance to be chosen, never below success_floor
    # (1: no weighting)
    success_window_s: float = 30.0
    success_floor: float = 0.02
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
    # open client connections per process; past it 503. 0: derived from the file-descriptor
    # limit (gateway/front/fdbudget.py); a value above what the limit allows is lowered
    max_connections: int = 0
    max_inflight: int = 1024  # requests served at once per process; past it 503


@dataclass(frozen=True, slots=True)
class Logging:
    format: LogFormat = "text"
    level: LogLevel = "info"


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
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)  # OTLP export; off

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


# --- parsing ------------------------------------------------------------------------------


def _endpoint(path: str, raw: Any, alias: str) -> Endpoint:
    r = FieldReader(raw, path)
    url = r.text("url").rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(r.at("url"), "must start with http:// or https://")
    name = r.name("name", url.split("://", 1)[1])
    upstream_model = r.text("model", alias)
    precision = r.choice("precision", PRECISIONS)
    return section(r, Endpoint, given={"name": name, "url": url, "upstream_model": upstream_model,
                                       "precision": precision,
                                       "quality": parse_quality(r, precision)})


def _models(root: FieldReader) -> tuple[ModelPool, ...]:
    pools: list[ModelPool] = []
    seen_endpoints: set[str] = set()
    for path, raw in root.items("models"):
        r = FieldReader(raw, path)
        name = r.name("name")
        if "@" in name:
            raise ConfigError(r.at("name"), "must not contain '@' (it selects a precision)")
        endpoints = tuple(_endpoint(p, e, name) for p, e in r.items("endpoints"))
        tokenizer = (r.text("tokenizer") if r.get("tokenizer") is not None
                     else default_of(ModelPool, "tokenizer"))
        max_model_len = (r.integer("max_model_len", None) if r.get("max_model_len") is not None
                         else None)
        for i, ep in enumerate(endpoints):
            if ep.name in seen_endpoints:
                raise ConfigError(f"{r.at('endpoints')}[{i}].name", f"duplicate endpoint {ep.name!r}")
            seen_endpoints.add(ep.name)
        r.finish()
        if any(p.name == name for p in pools):
            raise ConfigError(r.at("name"), f"duplicate model {name!r}")
        pools.append(ModelPool(name=name, endpoints=endpoints, tokenizer=tokenizer,
                               max_model_len=max_model_len))
    return tuple(pools)


def _scores(r: FieldReader, key: str, names: set[str]) -> tuple[tuple[str, float], ...]:
    """A mapping name -> score in [0, 1] whose names are among `names` (routing.quality,
    routing.min_quality)."""
    raw = r.get(key)
    raw = {} if raw is None else raw  # `false` is refused, not read as no scores
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


def _routing(rr: FieldReader, slo_names: set[str]) -> Routing:
    scores = {"quality": _scores(rr, "quality", set(PRECISIONS)),
              "min_quality": _scores(rr, "min_quality", slo_names)}
    routing = section(rr, Routing, minimums={"load_bound": 1.0, "hysteresis": 0.0}, given=scores)
    too_big = [name for name, bad in (("slo_margin", routing.slo_margin > 1.0),
                                      ("hysteresis", routing.hysteresis >= 1.0),
                                      ("success_floor", routing.success_floor > 1.0)) if bad]
    if too_big:
        raise ConfigError(f"routing.{too_big[0]}", "must be at most 1 (a share)")
    return routing


def _accounting(root: FieldReader, env: Mapping[str, str], base_dir: Path | None,
                models: tuple[ModelPool, ...]) -> AccountingConfig | None:
    raw = root.get("accounting")
    if raw is None:
        return None
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


def _access_log(root: FieldReader, base_dir: Path | None) -> str:
    value = root.get("access_log")
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise ConfigError(root.at("access_log"), "must be a file path, or '-' for stderr")
    if value != "-" and base_dir is not None and not Path(value).is_absolute():
        return str(base_dir / value)
    return value


def _key(root: FieldReader, key: str, env: Mapping[str, str]) -> str:
    """The optional API key of section `key` (admin, metrics) as a SHA-256 digest, "" if none."""
    r = root.sub(key)
    digest = secret_hash(r, env, "api_key", required=False)
    r.finish()
    return digest


def parse_config(data: Any, env: Mapping[str, str] | None = None,
                 base_dir: Path | None = None) -> GatewayConfig:
    """Validate a decoded YAML document into a GatewayConfig (pure; env passed in).

    `base_dir` resolves relative file paths (CSV series, SQLite file, journal, access log); a
    top-level `paths_relative_to` moves it (a copy of a config written elsewhere, e.g. by
    `wattgate sim fleet --write-gateway-config`, keeps its paths).
    """
    env = os.environ if env is None else env
    root = FieldReader(data if data is not None else {}, "")
    base_dir = paths_base(data, base_dir)
    slo_classes = parse_slo_classes(root)
    slo_names = {s.name for s in slo_classes}
    default_slo = root.text("default_slo_class", slo_classes[0].name)
    if default_slo not in slo_names:
        raise ConfigError("default_slo_class",
                          f"{default_slo!r} is not one of {', '.join(sorted(slo_names))}")
    tenants = parse_tenants(root, env, slo_names, default_slo)
    models = _models(root)
    accounting = _accounting(root, env, base_dir, models)
    ledger_dsn = accounting.ledger.dsn if accounting is not None and accounting.enabled else ""
    config = GatewayConfig(
        models=models,
        tenants=tenants,
        slo_classes=slo_classes,
        default_slo_class=default_slo,
        max_body_bytes=root.integer("max_body_bytes", default_of(GatewayConfig, "max_body_bytes")),
        drain_timeout_s=root.number("drain_timeout_s", default_of(GatewayConfig, "drain_timeout_s")),
        admin_key_sha256=_key(root, "admin", env),
        auth_required=root.flag("auth_required", default_of(GatewayConfig, "auth_required")),
        accounting=accounting,
        access_log=_access_log(root, base_dir),
        metrics_key_sha256=_key(root, "metrics", env),
        listen=section(root.sub("listen"), Listen, minimums={"port": 0, "max_connections": 0}),
        routing=_routing(root.sub("routing"), slo_names),
        timeouts=section(root.sub("timeouts"), Timeouts),
        retries=section(root.sub("retries"), Retries, minimums={"min_retry_concurrency": 0}),
        outlier_detection=parse_outlier_detection(root.sub("outlier_detection")),
        health=section(root.sub("health"), HealthCheck),
        logging=section(root.sub("logging"), Logging),
        tenant_controls=parse_tenant_controls(root.sub("tenant_controls"), env, ledger_dsn),
        telemetry=parse_telemetry(root.sub("telemetry")),
    )
    budgeted = [i for i, t in enumerate(tenants) if t.budgets.budgets]
    if budgeted and (config.accounting is None or not config.accounting.enabled):
        raise ConfigError(f"tenants[{budgeted[0]}].budgets",
                          "budgets are kept in the ledger: configure accounting")
    if config.auth_required and not tenants:
        raise ConfigError("tenants", "at least one tenant is required when auth_required is true")
    root.get("paths_relative_to")  # read by paths_base
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
    if isinstance(data, dict) and "engines" in data and "models" not in data:
        raise ConfigError(str(p), "a simulator fleet file (it lists `engines`), not a gateway "
                                  "config: `wattgate sim fleet` reads it; a gateway config lists "
                                  "`models` (deploy/examples/local.yaml)")
    return parse_config(data, env, p.resolve().parent)
