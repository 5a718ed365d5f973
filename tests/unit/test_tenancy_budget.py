"""Budget arithmetic: UTC periods, estimates and the admission check with a downgrade."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway.tenancy.budget import (
    Cost,
    Rates,
    choose_precision,
    first_over,
    period_start_hour,
    spends,
)
from gateway.tenancy.config import Budget


def hour_of(year: int, month: int, day: int, hour: int = 0) -> int:
    return int(datetime(year, month, day, hour, tzinfo=UTC).timestamp() // 3600)


def test_periods_start_at_utc_hour_day_and_calendar_month() -> None:
    now = datetime(2026, 3, 17, 13, 45, tzinfo=UTC).timestamp()
    assert period_start_hour("hour", now) == hour_of(2026, 3, 17, 13)
    assert period_start_hour("day", now) == hour_of(2026, 3, 17)
    assert period_start_hour("month", now) == hour_of(2026, 3, 1)


def test_spend_counts_only_hours_of_the_current_period_plus_what_is_held() -> None:
    now = datetime(2026, 3, 17, 13, 45, tzinfo=UTC).timestamp()
    hours = [(hour_of(2026, 3, 17, 13), 100.0, 1.0, 0.5),
             (hour_of(2026, 3, 17, 2), 50.0, 2.0, 0.25),
             (hour_of(2026, 2, 28, 23), 1000.0, 9.0, 9.0)]
    hour, day, month = spends([Budget("hour", "j", 500.0), Budget("day", "gco2e", 10.0),
                               Budget("month", "usd", 1.0)], hours, Cost(10.0, 0.5, 0.1), now)
    assert (hour.spent, hour.held, hour.remaining) == (100.0, 10.0, 390.0)
    assert (day.spent, day.held) == (3.0, 0.5)
    assert (month.spent, month.held) == (0.75, 0.1)


def test_a_request_fits_only_if_every_budget_has_room() -> None:
    now = 0.0
    standing = spends([Budget("hour", "j", 100.0), Budget("day", "usd", 1.0)],
                      [(0, 60.0, 0.0, 0.99)], Cost(), now)
    assert first_over(standing, Cost(j=40.0, usd=0.01)) is None
    assert first_over(standing, Cost(j=40.1)) is standing[0]
    assert first_over(standing, Cost(j=1.0, usd=0.02)) is standing[1]


def test_downgrade_picks_the_first_cheaper_precision_that_fits() -> None:
    standing = spends([Budget("hour", "j", 100.0)], [(0, 70.0, 0.0, 0.0)], Cost(), 0.0)
    rates = {p: Rates(Cost(j=j / 10), Cost(j=j))
             for p, j in (("bf16", 0.5), ("fp8", 0.35), ("int4", 0.3))}
    # 30 J left. 100 prompt + 70 output tokens: bf16 5 + 35 J does not fit; without a
    # downgrade that is a refusal
    assert choose_precision(standing, 100, 70, "bf16", [], rates) is None
    # 100 + 40: bf16 25 J fits; 100 + 70: fp8 3.5 + 24.5 J is the first cheaper one that fits
    assert choose_precision(standing, 100, 40, "bf16", ["fp8", "int4"], rates) == (
        "bf16", Cost(j=25.0))
    chosen = choose_precision(standing, 100, 70, "bf16", ["fp8", "int4"], rates)
    assert chosen is not None and chosen[0] == "fp8"
    assert choose_precision(standing, 100, 120, "bf16", ["fp8", "int4"], rates) is None
