"""The accounting config section, pricing series and query times."""

from __future__ import annotations

from pathlib import Path

import pytest

from accounting.config import parse_accounting
from accounting.ledger.base import LedgerError
from accounting.ledger.postgres import PostgresLedger
from accounting.pricing import J_PER_KWH, Pricing, Series
from accounting.timeparse import parse_time
from core.errors import ConfigError


def test_defaults_need_no_section() -> None:
    cfg = parse_accounting(None)
    assert cfg.interval_s == 1.0 and cfg.flush_s <= 1.0
    assert cfg.ledger.kind == "sqlite"
    assert cfg.meter_for("anything").meter.kind == "model"


def test_full_section_parses_meters_ledger_and_prices(tmp_path: Path) -> None:
    (tmp_path / "grid.csv").write_text("timestamp,g_per_kwh\n0,100\n1000,300\n")
    cfg = parse_accounting({
        "interval_s": 2, "flush_s": 0.5, "region": "de", "intensity": {"csv": "grid.csv"},
        "pue": 1.2, "price_usd_per_kwh": 0.1, "gpu_hour_usd": 3.6, "embodied_g_per_gpu_s": 0.01,
        "behind_s": 30,
        "ledger": {"kind": "postgres", "dsn_env": "PGDSN"},
        "meters": {"a": {"kind": "sim", "url": "http://127.0.0.1:1/", "idle_power_w": 70},
                   "b": {"kind": "nvml", "gpus": [0, 1], "alpha": 0.1, "beta": 1},
                   "c": {"kind": "model", "decode_j_per_token": 0.3}},
    }, env={"PGDSN": "postgresql://x@127.0.0.1/db"}, base_dir=tmp_path)
    assert cfg.ledger.dsn == "postgresql://x@127.0.0.1/db"
    assert cfg.behind_s == 30.0
    assert cfg.meter_for("a").meter.url == "http://127.0.0.1:1"
    assert cfg.meter_for("a").idle_power_w == 70
    assert cfg.meter_for("b").meter.gpus == (0, 1)
    assert cfg.meter_for("b").coefficients is not None
    assert cfg.meter_for("c").meter.power_model.decode_j_per_token == 0.3
    assert cfg.pricing.intensity_g_per_kwh.at(500) == 100
    assert cfg.pricing.intensity_g_per_kwh.at(1500) == 300


@pytest.mark.parametrize(("raw", "path"), [
    ({"interval_s": 0}, "accounting.interval_s"),
    ({"meters": {"a": {"kind": "magic"}}}, "accounting.meters.a.kind"),
    ({"meters": {"a": {"kind": "dcgm"}}}, "accounting.meters.a.url"),
    ({"meters": {"a": {"kind": "nvml", "gpus": "0"}}}, "accounting.meters.a.gpus"),
    ({"ledger": {"kind": "postgres"}}, "accounting.ledger.dsn"),
    ({"ledger": {"kind": "postgres", "dsn_env": "NOPE"}}, "accounting.ledger.dsn_env"),
    # URLs asyncpg cannot parse: `serve` failed at start with a traceback
    ({"ledger": {"kind": "postgres", "dsn": "mysql://u@db/x"}}, "accounting.ledger.dsn"),
    ({"ledger": {"kind": "postgres", "dsn": "postgresql://u@db:pg/x"}}, "accounting.ledger.dsn"),
    ({"pue": 0.5}, "accounting.pue"),
    ({"region": "ATLANTIS"}, "accounting.region"),
    ({"intensity": {"csv": "missing.csv"}}, "accounting.intensity.csv"),
    ({"flush_s": 5}, "accounting.flush_s"),
    ({"behind_s": 0}, "accounting.behind_s"),
    ({"colour": 1}, "accounting.colour"),
])
def test_bad_values_name_the_field(raw: dict[str, object], path: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_accounting(raw, env={})
    assert err.value.path == path


def test_carbon_and_cost_follow_pue_intensity_price_and_gpu_time() -> None:
    p = Pricing(pue=1.5, intensity_g_per_kwh=Series.constant(400.0),
                price_usd_per_kwh=Series.constant(0.1), gpu_hour_usd=3.6,
                embodied_g_per_gpu_s=0.002)
    assert p.carbon_g(J_PER_KWH, 10.0, 0.0) == pytest.approx(1.5 * 400 + 0.02)
    assert p.cost_usd(J_PER_KWH, 10.0, 0.0) == pytest.approx(1.5 * 0.1 + 0.01)


def test_query_times_accept_epoch_iso_and_relative() -> None:
    assert parse_time("100", 0) == 100
    assert parse_time("-2h", 10_000) == 10_000 - 7200
    assert parse_time("1970-01-01T00:01:00Z", 0) == 60
    with pytest.raises(ValueError, match="relative"):
        parse_time("yesterday", 0)
    for bad in ("nan", "inf", "-inf", "NaN"):
        with pytest.raises(ValueError, match="not a time"):
            parse_time(bad, 0)


def test_the_apportioner_runs_in_a_process_unless_told_and_bad_modes_are_named() -> None:
    assert parse_accounting(None).apportioner == "process"
    assert parse_accounting({"apportioner": "external"}).apportioner == "external"
    with pytest.raises(ConfigError) as err:
        parse_accounting({"apportioner": "sidecar"})
    assert err.value.path == "accounting.apportioner" and "inline" in err.value.message


def test_failed_energy_goes_to_the_failed_account_unless_told_and_bad_values_are_named() -> None:
    assert parse_accounting(None).failed_energy == "failed_account"
    assert parse_accounting({"failed_energy": "tenant"}).failed_energy == "tenant"
    with pytest.raises(ConfigError) as err:
        parse_accounting({"failed_energy": "nobody"})
    assert err.value.path == "accounting.failed_energy"
    assert "failed_account" in err.value.message and "tenant" in err.value.message


async def test_a_postgres_url_asyncpg_refuses_is_a_ledger_error_not_a_traceback() -> None:
    """Query parameters the config does not check (`sslmode`) are asyncpg's to refuse:
    `wattgate serve` prints one line for a LedgerError, a traceback for anything else."""
    ledger = PostgresLedger("postgresql://u@127.0.0.1:1/db?sslmode=bogus")
    with pytest.raises(LedgerError, match="sslmode"):
        await ledger.open()
