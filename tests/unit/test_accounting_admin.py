"""Admin handlers and `wattgate report` read the same ledger the service wrote."""

from __future__ import annotations

import math
from pathlib import Path

import aiohttp
import orjson
import pytest
import uvloop
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from accounting.admin import admin_routes
from accounting.ledger.sqlite import SqliteLedger
from gateway.report_cli import report
from tests.accounting.test_accounting_accuracy import T0_WALL, run_engine
from tests.accounting.test_ledger_sqlite import Clock, conservation, drive, make_service


@pytest.mark.timeout(60)
async def test_admin_usage_and_request_detail_read_the_ledger(tmp_path: Path) -> None:
    run = run_engine(21, duration_s=12.0)
    clock = Clock(T0_WALL)
    svc = make_service(SqliteLedger(tmp_path / "l.db"), run, clock)
    await svc.ledger.open()
    await drive(svc, run, clock, run.readings[-1][0])
    intervals_j, _, _, _ = await conservation(svc.ledger)
    app = web.Application()
    app.router.add_routes(admin_routes(svc, clock=clock))
    rid = run.records[len(run.records) // 2].request_id
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as http:
        url = server.make_url
        async with http.get(url("/admin/v1/usage"),
                            params={"since": str(T0_WALL - 10), "group_by": "tenant"}) as resp:
            assert resp.status == 200
            usage = orjson.loads(await resp.read())
        async with http.get(url(f"/admin/v1/requests/{rid}")) as resp:
            assert resp.status == 200
            detail = orjson.loads(await resp.read())
        async with http.get(url("/admin/v1/requests/nope")) as resp:
            assert resp.status == 404
            assert orjson.loads(await resp.read())["error"]["code"] == "request_not_found"
        async with http.get(url("/admin/v1/usage"), params={"group_by": "colour"}) as resp:
            assert resp.status == 400
    assert math.fsum(r["energy_j"] for r in usage["rows"]) == pytest.approx(intervals_j, rel=1e-9)
    assert {"t0", "t1", "t2", "(idle)"} == {r["tenant"] for r in usage["rows"]}
    for key in ("request_id", "tenant", "model", "engine", "precision", "prompt_tokens",
                "completion_tokens", "energy_j", "carbon_g", "cost_usd", "final", "estimated"):
        assert key in detail
    assert detail["energy_j"] == pytest.approx(run.truth_j[rid], rel=0.15)
    assert detail["carbon_g"] > 0 and detail["cost_usd"] > 0
    await svc.stop()


async def _populate(path: Path) -> float:
    run = run_engine(22, duration_s=10.0)
    clock = Clock(T0_WALL)
    svc = make_service(SqliteLedger(path), run, clock)
    await svc.ledger.open()
    await drive(svc, run, clock, run.readings[-1][0])
    intervals_j, _, _, _ = await conservation(svc.ledger)
    await svc.stop()
    return intervals_j


@pytest.mark.timeout(60)
def test_report_command_prints_tenant_bills_in_each_format(tmp_path: Path) -> None:
    intervals_j = uvloop.run(_populate(tmp_path / "l.db"))
    runner = CliRunner()
    base = ["--sqlite", str(tmp_path / "l.db"), "--since", str(T0_WALL - 5), "--until",
            str(T0_WALL + 3600)]
    as_json = runner.invoke(report, [*base, "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    doc = orjson.loads(as_json.output)
    assert doc["total"]["energy_j"] == pytest.approx(intervals_j, rel=1e-9)
    table = runner.invoke(report, [*base, "--group-by", "tenant,engine"])
    assert table.exit_code == 0 and "(idle)" in table.output and "TOTAL" in table.output
    csv_out = runner.invoke(report, [*base, "--format", "csv", "--tenant", "t1"])
    assert csv_out.output.splitlines()[0].startswith("tenant,account,requests")
    assert "t0" not in csv_out.output
    bad = runner.invoke(report, [*base, "--group-by", "colour"])
    assert bad.exit_code != 0 and "colour" in bad.output


def test_report_table_numbers_are_fixed_point() -> None:
    from accounting.report import _fmt

    assert [_fmt(v) for v in (7932.149, 1.45384, 0.00220337, 2.0e-7, 0.0, 12.0)] == [
        "7932.1", "1.454", "0.002203", "0.0000002", "0", "12"]  # a tiny cost is not 0
