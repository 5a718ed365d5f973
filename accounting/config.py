"""The `accounting:` section of the gateway config, parsed into a frozen dataclass.

    accounting:
      interval_s: 1           # wall-clock grid
      flush_s: 0.5            # ledger write batching (a crash loses at most this window)
      settle_s: 2             # an interval is apportioned this long after it ends
      hold_s: 60              # and once no request in flight over it is still being served,
                              # waiting at most this long (0: do not wait)
      behind_s: 2             # the accounting child of `wattgate serve` works in the core's
                              # idle time until its records wait this long (priority.py)
      ledger: {kind: sqlite, path: wattgate-ledger.db}   # or {kind: postgres, dsn_env: PGDSN}
                              # retention_days: 30 (per-request rows; hourly rollups are kept
                              # for ever; 0 or null: keep every row for ever)
      journal: {enabled: true, path: <ledger path>.journal, fsync_ms: 20}   # write-ahead
                              # journal of finished requests (journal.py); with postgres the
                              # default path is ./wattgate-journal, on each replica's local disk
      region: DE              # built-in grid intensity; or intensity: 381 | {csv: file}
      pue: 1.1
      price_usd_per_kwh: 0.08 # or {csv: file}
      gpu_hour_usd: 3.0
      embodied_g_per_gpu_s: 0.0
      fit: {enabled: false, window: 300}
      failed_energy: failed_account   # who pays a failed request's energy: the engine's
                              # `failed` account, or `tenant` (failed.py)
      meters:                 # keyed by endpoint name; endpoints not listed use `model`
        h100-bf16: {kind: sim, url: "http://127.0.0.1:8101", idle_power_w: 80}
        h100-fp8: {kind: nvml, gpus: [0, 1], alpha: 0.06, beta: 1.0}
        h200-fp8: {kind: agent, url: "http://node-7:9400", api_key_env: AGENT_KEY}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accounting.coefficients import Coefficients
from accounting.pricing import (
    REGION_INTENSITY,
    Pricing,
    Series,
    series_from_csv,
)
from core.config_fields import FieldReader as _Reader
from core.config_fields import postgres_url, section
from core.errors import ConfigError
from core.vocab import (
    APPORTIONER_MODES,
    FAILED_ENERGY,
    LEDGER_KINDS,
    METER_KIND_NAMES,
    ApportionerMode,
    FailedEnergy,
    LedgerKind,
)
from engines.meters.model import PowerModel
from engines.meters.registry import URL_KINDS, MeterSpec

# The nice value `wattgate serve` adds to its apportioner child (`accounting.apportioner:
# process`): where the two share a core, requests are served first and the bookkeeping takes
# the time between them.
CHILD_NICE = 10

# with a shared (postgres) ledger each replica journals to its own disk, in this directory
POSTGRES_JOURNAL_DIR = "wattgate-journal"


# How long a config file's ledger keeps per-request rows, by default (ledger/retention.py).
RETENTION_DAYS = 30.0
# Usage reads a window's partial hours from the per-request rows (ledger/rollups.py): under an
# hour's retention the hour under way, the last of every report until now, would read rows
# already pruned and count next to nothing.
MIN_RETENTION_DAYS = 1.0 / 24.0


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    kind: LedgerKind = "sqlite"
    path: str = "wattgate-ledger.db"
    dsn: str = field(default="", repr=False)
    # Days per-request rows are kept (None: for ever, as in a config built in code;
    # `parse_accounting` gives RETENTION_DAYS unless the section says otherwise).
    retention_days: float | None = None


@dataclass(frozen=True, slots=True)
class JournalConfig:
    """The write-ahead request journal (journal.py). Off in a config built in code (tests);
    `parse_accounting` turns it on unless the section says otherwise."""

    enabled: bool = False
    path: str = ""  # a directory; "": `<ledger path>.journal` (sqlite), ./wattgate-journal
    fsync_s: float = 0.02  # group-commit window: a SIGKILL loses about this much

    def directory(self, ledger: LedgerConfig) -> str:
        if self.path:
            return self.path
        return f"{ledger.path}.journal" if ledger.kind == "sqlite" else POSTGRES_JOURNAL_DIR


@dataclass(frozen=True, slots=True)
class EngineMeterConfig:
    meter: MeterSpec
    idle_power_w: float | None = None  # None: the meter's own value, else the model default
    coefficients: Coefficients | None = None  # None: defaults for the engine's precision


@dataclass(frozen=True, slots=True)
class FitConfig:
    enabled: bool = False
    window: int = 300  # recent intervals with work used by the fit
    every: int = 60  # refit after this many new intervals


@dataclass(frozen=True, slots=True)
class AccountingConfig:
    enabled: bool = True
    interval_s: float = 1.0
    flush_s: float = 0.5
    poll_s: float = 0.25
    settle_s: float = 2.0
    max_lag_s: float = 10.0
    hold_s: float = 60.0
    # The accounting child of `wattgate serve` works in the core's idle time (the idle
    # scheduling class) until its oldest record waits this long past a flush; then it takes
    # its share of a busy core at nice +10 until it has caught up (priority.py)
    behind_s: float = 2.0
    ledger: LedgerConfig = LedgerConfig()
    journal: JournalConfig = JournalConfig()
    region: str = "WORLD"
    pricing: Pricing = field(default_factory=Pricing)
    fit: FitConfig = FitConfig()
    meters: tuple[tuple[str, EngineMeterConfig], ...] = ()
    # Where apportioning runs: "process" (a child of `wattgate serve`), "inline" (on the
    # gateway's event loop) or "external" (`wattgate apportioner`, e.g. its own Deployment).
    apportioner: ApportionerMode = "process"
    # Who pays a failed request's energy: its engine's `failed` account (beside `idle`), or
    # its tenant, as for any other request (accounting/failed.py)
    failed_energy: FailedEnergy = "failed_account"

    def meter_for(self, endpoint: str) -> EngineMeterConfig:
        for name, cfg in self.meters:
            if name == endpoint:
                return cfg
        return EngineMeterConfig(MeterSpec(kind="model"))


def _series(r: _Reader, key: str, default: Series, base: Path) -> Series:
    raw = r.get(key)
    if raw is None:
        return default
    if isinstance(raw, bool):
        raise ConfigError(r.at(key), "must be a number or {csv: path}")
    if isinstance(raw, int | float):
        if raw < 0:
            raise ConfigError(r.at(key), "must be >= 0")
        return Series.constant(float(raw))
    sr = _Reader(raw, r.at(key))
    path = Path(sr.text("csv"))
    sr.finish()
    try:
        return series_from_csv(path if path.is_absolute() else base / path)
    except (OSError, ValueError) as exc:
        raise ConfigError(sr.at("csv"), str(exc)) from None


def _ledger(r: _Reader, env: Mapping[str, str]) -> LedgerConfig:
    d = LedgerConfig()
    kind = r.choice("kind", LEDGER_KINDS, d.kind)
    days = r.get("retention_days", RETENTION_DAYS)
    retention = (None if days is None or (days == 0 and not isinstance(days, bool))
                 else r.number("retention_days", RETENTION_DAYS))
    if retention is not None and retention < MIN_RETENTION_DAYS:
        raise ConfigError(r.at("retention_days"), "must be at least 1/24 (an hour): a report "
                          "until now reads the hour under way from the per-request rows")
    if kind == "sqlite":
        cfg = LedgerConfig(kind="sqlite", path=r.text("path", d.path), retention_days=retention)
    else:
        dsn = r.get("dsn")
        dsn_env = r.get("dsn_env")
        if bool(dsn) == bool(dsn_env):
            raise ConfigError(r.at("dsn"), "give exactly one of dsn or dsn_env")
        if dsn_env:
            value = env.get(str(dsn_env), "")
            if not value:
                raise ConfigError(r.at("dsn_env"), f"environment variable {dsn_env} is unset")
            dsn = postgres_url(r.at("dsn_env"), value)
        else:
            dsn = postgres_url(r.at("dsn"), dsn)
        cfg = LedgerConfig(kind="postgres", dsn=dsn, retention_days=retention)
    r.finish()
    return cfg


def _journal(r: _Reader, base: Path, ledger: LedgerConfig) -> JournalConfig:
    path = r.get("path")
    if path is not None and (not isinstance(path, str) or not path):
        raise ConfigError(r.at("path"), "must be a non-empty string (a directory)")
    if not path and ledger.kind == "postgres":
        path = POSTGRES_JOURNAL_DIR  # on this replica's own disk, next to its config
    if path and not Path(path).is_absolute():
        path = str(base / path)
    # on unless the section says otherwise (the dataclass's False is for configs built in code)
    cfg = JournalConfig(enabled=r.flag("enabled", True), path=path or "",
                        fsync_s=r.number("fsync_ms", JournalConfig().fsync_s * 1000.0) / 1000.0)
    r.finish()
    return cfg


def _gpus(r: _Reader) -> tuple[int, ...]:
    raw = r.get("gpus")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(g, int) and g >= 0 for g in raw):
        raise ConfigError(r.at("gpus"), "must be a list of GPU indices (integers >= 0)")
    return tuple(raw)


def _agent_key(r: _Reader, env: Mapping[str, str]) -> str:
    """The agent's key from the variable `api_key_env` names ("" where none is given)."""
    name = r.get("api_key_env")
    if name is None:
        return ""
    if not isinstance(name, str) or not name:
        raise ConfigError(r.at("api_key_env"), "must be an environment variable name")
    value = env.get(name, "")
    if not value:
        raise ConfigError(r.at("api_key_env"), f"environment variable {name} is unset")
    return value


def _meter(r: _Reader, env: Mapping[str, str]) -> EngineMeterConfig:
    kind = r.choice("kind", METER_KIND_NAMES)
    url = ""
    if kind in URL_KINDS:
        url = r.text("url").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(r.at("url"), "must start with http:// or https://")
    idle = r.opt_number("idle_power_w", inclusive=True)
    alpha, beta = r.get("alpha"), r.get("beta")
    coeffs = None
    if alpha is not None or beta is not None:
        coeffs = Coefficients(r.number("alpha", None, inclusive=True), r.number("beta", None))
    model = PowerModel()
    if kind == "model":
        model = PowerModel(
            idle_power_w=idle if idle is not None else model.idle_power_w,
            prefill_j_per_token=r.number("prefill_j_per_token", model.prefill_j_per_token,
                                      inclusive=True),
            decode_j_per_token=r.number("decode_j_per_token", model.decode_j_per_token,
                                     inclusive=True),
        )
    api_key = _agent_key(r, env) if kind == "agent" else ""
    spec = MeterSpec(kind=kind, url=url, gpus=_gpus(r), power_model=model, api_key=api_key)
    r.finish()
    return EngineMeterConfig(meter=spec, idle_power_w=idle, coefficients=coeffs)


def parse_accounting(raw: Any, env: Mapping[str, str] | None = None,
                     base_dir: Path | None = None) -> AccountingConfig:
    """Validate the `accounting:` mapping (None: defaults); raises ConfigError("accounting.x")."""
    env = os.environ if env is None else env
    base = base_dir or Path.cwd()
    r = _Reader(raw if raw is not None else {}, "accounting")
    d, dp = AccountingConfig(), Pricing()  # the defaults, written once in the dataclasses
    interval_s = r.number("interval_s", d.interval_s)
    flush_s = r.number("flush_s", d.flush_s)
    if flush_s > interval_s and flush_s > 1.0:
        raise ConfigError(r.at("flush_s"), "must be <= 1 s or <= interval_s")
    region = r.text("region", d.region).upper()
    if region not in REGION_INTENSITY and r.get("intensity") is None:
        raise ConfigError(r.at("region"), f"{region!r} has no built-in intensity; give "
                          f"intensity (one of {', '.join(sorted(REGION_INTENSITY))} is built in)")
    intensity = _series(r, "intensity", Series.constant(REGION_INTENSITY.get(region, 0.0)), base)
    pricing = Pricing(
        pue=r.number("pue", dp.pue, minimum=1.0, inclusive=True),
        intensity_g_per_kwh=intensity,
        price_usd_per_kwh=_series(r, "price_usd_per_kwh", dp.price_usd_per_kwh, base),
        gpu_hour_usd=r.number("gpu_hour_usd", dp.gpu_hour_usd, inclusive=True),
        embodied_g_per_gpu_s=r.number("embodied_g_per_gpu_s", dp.embodied_g_per_gpu_s,
                                      inclusive=True),
    )
    fit = section(r.sub("fit"), FitConfig, minimums={"window": 3})
    meters_raw = r.get("meters")
    meters_raw = {} if meters_raw is None else meters_raw  # `false` is refused, not read as none
    if not isinstance(meters_raw, Mapping):
        raise ConfigError(r.at("meters"), "must be a mapping of endpoint name -> meter")
    meters = tuple((str(name), _meter(_Reader(m, f"{r.at('meters')}.{name}"), env))
                   for name, m in meters_raw.items())
    ledger = _ledger(r.sub("ledger"), env)
    cfg = AccountingConfig(
        enabled=r.flag("enabled", d.enabled),
        interval_s=interval_s,
        flush_s=flush_s,
        poll_s=r.number("poll_s", min(d.poll_s, interval_s / 2)),
        settle_s=r.number("settle_s", d.settle_s, inclusive=True),
        max_lag_s=r.number("max_lag_s", d.max_lag_s),
        hold_s=r.number("hold_s", d.hold_s, inclusive=True),
        behind_s=r.number("behind_s", d.behind_s),
        apportioner=r.choice("apportioner", APPORTIONER_MODES, d.apportioner),
        failed_energy=r.choice("failed_energy", FAILED_ENERGY, d.failed_energy),
        ledger=ledger,
        journal=_journal(r.sub("journal"), base, ledger),
        region=region,
        pricing=pricing,
        fit=fit,
        meters=meters,
    )
    r.finish()
    return cfg


def paths_base(data: Any, base_dir: Path | None) -> Path | None:
    """The folder relative file paths of a config document are read from: its
    `paths_relative_to` (itself relative to `base_dir`), else `base_dir`."""
    moved = data.get("paths_relative_to") if isinstance(data, dict) else None
    if moved is None:
        return base_dir
    if not isinstance(moved, str) or not moved:
        raise ConfigError("paths_relative_to", "must be a folder path")
    return (base_dir or Path.cwd()) / moved
