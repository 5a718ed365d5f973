"""No energy lost across gateway restarts on a real PostgreSQL ledger: the counters' offsets
come back from PostgreSQL as they went in, the downtime is charged, and the check reports a
window deliberately lost (tests/accounting/test_accounting_restart.py has the SQLite runs)."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

import pytest

from accounting.ledger.base import Ledger
from accounting.ledger.postgres import PostgresLedger
from tests.accounting.test_accounting_restart import (
    assert_no_energy_lost,
    assert_the_check_fires,
    lost_window_scenario,
    scenario,
)
from tests.support.postgres import fresh_database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]
_names = itertools.count()


async def _ledgers(pg: str) -> Callable[[], Awaitable[Ledger]]:
    dsn = await fresh_database(pg, f"restart{next(_names)}")

    async def make() -> Ledger:
        return PostgresLedger(dsn)

    return make


async def test_restart_after_a_counter_reset_charges_the_downtime_on_postgres(pg: str) -> None:
    out = await scenario(await _ledgers(pg), seed=41, resets_at=[8.0], own_tracker=True,
                         stop_at=16.0, down_s=6.0)
    assert_no_energy_lost(out)
    await out.services[1].stop()


async def test_restart_without_a_reset_charges_the_downtime_on_postgres(pg: str) -> None:
    out = await scenario(await _ledgers(pg), seed=42, resets_at=[], own_tracker=True,
                         stop_at=14.0, down_s=5.0)
    assert_no_energy_lost(out)
    await out.services[1].stop()


async def test_reset_while_the_gateway_is_down_on_postgres(pg: str) -> None:
    out = await scenario(await _ledgers(pg), seed=43, resets_at=[17.5], own_tracker=False,
                         stop_at=15.0, down_s=6.0)
    assert_no_energy_lost(out)
    await out.services[1].stop()


async def test_the_check_reports_a_deliberately_lost_window_on_postgres(pg: str) -> None:
    out = await lost_window_scenario(await _ledgers(pg))
    assert_the_check_fires(out)
    await out.services[1].stop()
