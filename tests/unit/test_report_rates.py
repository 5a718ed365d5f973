"""`wattgate report`: rates over the data's real span, fixed-point numbers for people, and a
one-line failure (exit 1, no traceback) when the ledger is missing or unreachable."""

from __future__ import annotations

import asyncio
import csv
import io
from pathlib import Path

import pytest
from click.testing import CliRunner

from accounting.ledger.base import HOUR_S, RequestRow, UsageData
from accounting.ledger.sqlite import SqliteLedger
from accounting.report import build_report, fixed, positional, render
from gateway.report_cli import report as report_cmd

T0 = 1_800_000_000.0  # wall clock of the first arrival
HOUR = int(T0 // HOUR_S)
DAY_S = 86_400.0


def usage(first_s: float, last_s: float) -> UsageData:
    """Two tenants' requests between first_s and last_s, and a tiny idle account over
    intervals metered from 5 s before the first arrival to 5 s after the last finish."""
    return UsageData(
        energy=[("acme", "m", "fp8", "e1", HOUR, 300.0, 30.0, 0.03, 0.00000028, 0),
                ("globex", "m", "fp8", "e1", HOUR, 100.0, 10.0, 0.01, 0.00000009, 0)],
        requests=[("acme", "m", "fp8", "e1", HOUR, 6, 6, 600, 120, 5, first_s, last_s - 2.0),
                  ("globex", "m", "fp8", "e1", HOUR, 4, 4, 400, 80, 4, first_s + 1.0, last_s)],
        idle=[("e1", "m", "fp8", HOUR, 0.00001, 0.000001, 0.0000001, 0, first_s - 5.0,
               last_s + 5.0)])


def test_rates_divide_by_first_arrival_to_last_finish_not_the_query_window() -> None:
    """A day's window holding 10 s of traffic metered over 20 s: req/s and goodput over the
    10 s, J/s over the 20 s."""
    rep = build_report(usage(T0, T0 + 10.0), ["tenant"], T0 - DAY_S + 60.0, T0 + 60.0)
    assert rep.span_s == pytest.approx(10.0)
    acme = next(r for r in rep.rows if r["tenant"] == "acme")
    assert acme["requests_per_s"] == pytest.approx(0.6)
    assert acme["goodput_rps"] == pytest.approx(0.5)
    assert acme["power_w"] == pytest.approx(15.0)
    assert rep.total["requests_per_s"] == pytest.approx(1.0)
    assert rep.total["goodput_rps"] == pytest.approx(0.9)
    assert rep.total["power_w"] == pytest.approx((400.0 + 0.00001) / 20.0)
    assert rep.metered_s == pytest.approx(20.0)


def test_power_falls_back_to_the_requests_span_without_intervals() -> None:
    """A tenant filter selects no idle intervals: J/s over the requests' span."""
    data = usage(T0, T0 + 10.0)
    rep = build_report(UsageData(data.energy, data.requests, []), ["tenant"], T0, T0 + DAY_S)
    assert rep.total["power_w"] == pytest.approx(40.0)


def test_without_requests_the_rates_are_not_invented() -> None:
    empty = UsageData(energy=[], requests=[],
                      idle=[("e1", "m", "fp8", HOUR, 5.0, 0.1, 0.1, 0, T0, T0 + 5.0)])
    rep = build_report(empty, ["tenant"], T0, T0 + DAY_S)
    assert rep.span_s is None
    assert rep.total["requests_per_s"] is None and rep.total["goodput_rps"] is None
    assert rep.total["power_w"] == pytest.approx(1.0)
    assert "goodput: n/a" in render(rep, "table")
    nothing = build_report(UsageData([], [], []), ["tenant"], T0, T0 + DAY_S)
    assert nothing.total["power_w"] is None


@pytest.mark.parametrize(("value", "text"), [
    (0.00000028, "0.00000028"), (0.00001, "0.00001"), (0.5, "0.5"), (12.34567, "12.346"),
    (123456.78, "123456.8"), (0.0, "0"), (-0.0000125, "-0.0000125")])
def test_fixed_point_never_uses_exponent_notation(value: float, text: str) -> None:
    assert fixed(value) == text


def test_table_and_csv_print_small_values_in_fixed_point() -> None:
    rep = build_report(usage(T0, T0 + 10.0), ["tenant"], T0, T0 + DAY_S)
    table = render(rep, "table")
    assert "e-0" not in table and "0.00000028" in table
    assert "goodput over 10 s" in table.splitlines()[-2]
    assert "power_w over 20 s" in table.splitlines()[-1]
    rows = list(csv.DictReader(io.StringIO(render(rep, "csv"))))
    assert all("e-" not in v for r in rows for v in r.values())
    acme = next(r for r in rows if r["tenant"] == "acme")
    assert float(acme["cost_usd"]) == 0.00000028 and acme["cost_usd"] == positional(0.00000028)


def _fill(path: Path) -> None:
    """A real SQLite ledger with three requests: arrivals at T0, T0+1, T0+3; last finish T0+8."""
    async def go() -> None:
        ledger = SqliteLedger(path)
        await ledger.open()
        rows = [RequestRow(f"r{i}", "acme", "m", "e1", "fp8", "default", "ok", 1, T0 + a,
                           T0 + f, HOUR, 10, 5, 1, None, None, "rep") for i, (a, f) in
                enumerate([(0.0, 2.0), (1.0, 8.0), (3.0, 4.0)])]
        await ledger.append(rows, [])
        await ledger.close()
    asyncio.run(go())


def test_cli_reads_the_span_from_the_ledger(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    _fill(db)
    result = CliRunner().invoke(report_cmd, ["--sqlite", str(db), "--since", str(T0 - DAY_S),
                                             "--until", str(T0 + 60), "--format", "json"])
    assert result.exit_code == 0, result.output
    import orjson

    out = orjson.loads(result.output)
    assert out["span_s"] == pytest.approx(8.0)
    assert out["total"]["requests_per_s"] == pytest.approx(3 / 8.0)


@pytest.mark.parametrize("args", [
    ["--sqlite", "{tmp}/missing.db"],
    ["--config", "{tmp}/missing.yaml"],
    ["--config", "{tmp}/gw.yaml"],  # its ledger file does not exist
    ["--dsn", "postgresql://u:p@127.0.0.1:9/nodb"],  # nothing listens on the discard port
])
def test_cli_fails_in_one_line_when_the_ledger_is_not_there(tmp_path: Path,
                                                             args: list[str]) -> None:
    (tmp_path / "gw.yaml").write_text(
        "accounting: {ledger: {kind: sqlite, path: nowhere/ledger.db}}\n")
    argv = [a.format(tmp=tmp_path) for a in args]
    result = CliRunner().invoke(report_cmd, argv)
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert "Traceback" not in result.output
    assert not (tmp_path / "nowhere").exists()  # no empty ledger was created
