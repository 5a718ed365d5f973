"""Budgets through the real gateway with a SQLite ledger: reservations refuse what does not
fit (429 budget_exceeded), `on_budget: downgrade` admits at a cheaper precision, and a tenant
reads its own bill, limits and what remains at /v1/usage (the charges the budget counts are
the bill's)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from gateway.config import parse_config
from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import KEY_A, KEY_B, raw_config, running_gateway

pytestmark = pytest.mark.timeout(90)
AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
# "hello" is 2 prompt tokens by the byte estimate; with 48 completion tokens, at the prior
# (2.2 J an output token and 0.05 J a prompt token at BF16, 1.1 J and 0.06 J at INT4)
# 105.7 J are reserved at BF16, 52.92 J at INT4
BODY = {"model": "m", "prompt": "hello", "max_tokens": 48}


def budget_raw(eng: FakeEngine, ledger: Path, budget: dict[str, Any],
               precisions: tuple[str, ...] = ("bf16",), **tenant: Any) -> dict[str, Any]:
    raw = raw_config([{"name": f"e-{p}", "url": eng.url, "precision": p} for p in precisions],
                     accounting={"ledger": {"kind": "sqlite", "path": str(ledger)},
                                 "flush_s": 0.1, "poll_s": 0.05, "settle_s": 0.5})
    raw["tenants"][0].update(budgets=[budget], **tenant)
    return raw


def budget_config(eng: FakeEngine, ledger: Path, budget: dict[str, Any],
                  precisions: tuple[str, ...] = ("bf16",), **tenant: Any) -> Any:
    return parse_config(budget_raw(eng, ledger, budget, precisions, **tenant), env={})


async def post(s: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
               ) -> tuple[int, Any, dict[str, str]]:
    async with s.post(url, data=orjson.dumps(BODY),
                      headers={"Content-Type": "application/json", **AUTH_A, **(headers or {})}
                      ) as r:
        return r.status, await r.read(), dict(r.headers)


async def test_concurrent_requests_past_a_joule_budget_are_refused(tmp_path: Path) -> None:
    async with fake_engine(FakeEngine(model="m", ttft_s=1.5)) as eng:
        config = budget_config(eng, tmp_path / "l.db", {"period": "hour", "j": 330})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            got = await asyncio.gather(*(post(s, gw + "/v1/completions") for _ in range(6)))
            async with s.get(gw + "/metrics") as r:
                text = await r.text()
    assert sorted(g[0] for g in got) == [200, 200, 200, 429, 429, 429]  # 3 x 105.7 J fit in 330
    refused = [g for g in got if g[0] == 429]
    for _, body, headers in refused:
        assert orjson.loads(body)["error"]["code"] == "budget_exceeded"
        assert 1 <= int(headers["Retry-After"]) <= 3600  # till the hour ends
        assert headers["x-wattgate-budget"] == "exceeded"
    assert 'wattgate_tenant_limited_total{reason="budget",tenant="tenant-a"} 3.0' in text
    assert 'wattgate_tenant_budget_limit{period="hour",tenant="tenant-a",unit="j"} 330.0' in text


async def test_downgrade_admits_at_a_cheaper_precision_when_the_budget_is_short(
        tmp_path: Path) -> None:
    async with fake_engine(FakeEngine(model="m", ttft_s=1.5)) as eng:
        config = budget_config(eng, tmp_path / "l.db", {"period": "day", "j": 170},
                               ("bf16", "int4"), on_budget="downgrade")
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            got = await asyncio.gather(*(post(s, gw + "/v1/completions") for _ in range(3)))
    by_status = sorted((g[0], g[2].get("x-wattgate-precision", ""),
                        g[2].get("x-wattgate-budget", "")) for g in got)
    # 105.7 J at BF16, then 64.3 J left: 52.92 J at INT4 fits, then nothing does
    assert by_status[0][0] == 200 and by_status[0][2] == ""
    assert by_status[1] == (200, "int4", "downgraded;from=bf16")
    assert by_status[2][0] == 429 and by_status[2][2] == "exceeded"


async def test_a_tenant_reads_its_own_bill_and_budget_at_v1_usage(tmp_path: Path) -> None:
    async with fake_engine(FakeEngine(model="m")) as eng:
        config = budget_config(eng, tmp_path / "l.db", {"period": "month", "kwh": 1.0})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            for _ in range(3):
                assert (await post(s, gw + "/v1/completions"))[0] == 200
            status_b = (await post(s, gw + "/v1/completions",
                                   {"Authorization": f"Bearer {KEY_B}"}))[0]
            deadline = time.monotonic() + 30.0
            while True:  # until the ledger has charged and the reservations are gone
                async with s.get(gw + "/v1/usage?group_by=tenant,precision",
                                 headers=AUTH_A) as r:
                    assert r.status == 200
                    usage = await r.json()
                b = usage["budgets"][0]
                if (b["held"] == 0 and b["spent"] > 0) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            async with s.get(gw + "/v1/usage") as r:
                anonymous = r.status
    assert status_b == 503 or status_b == 200
    assert {row["tenant"] for row in usage["rows"]} == {"tenant-a"}
    assert all(row["account"] == "requests" for row in usage["rows"])  # no idle rows
    assert usage["total"]["requests"] == 3
    assert b["period"] == "month" and b["unit"] == "j" and b["limit"] == 3.6e6
    assert b["held"] == 0
    # the budget counts what the bill charges
    assert b["spent"] == pytest.approx(usage["total"]["energy_j"], rel=1e-9)
    assert b["remaining"] == pytest.approx(3.6e6 - b["spent"])
    assert usage["on_budget"] == "reject"
    assert anonymous == 401


async def test_wattgate_report_budgets_shows_spend_against_budget(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gateway.report_cli import report

    ledger = tmp_path / "l.db"
    async with fake_engine(FakeEngine(model="m")) as eng:
        config = budget_config(eng, ledger, {"period": "day", "usd": 2.0})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            for _ in range(2):
                assert (await post(s, gw + "/v1/completions"))[0] == 200
            await asyncio.sleep(0.5)  # the settlements are written
        raw = budget_raw(eng, ledger, {"period": "day", "usd": 2.0})
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = await asyncio.to_thread(CliRunner().invoke, report,
                                     ["--config", str(path), "--budgets", "--format", "json"])
    assert result.exit_code == 0, result.output
    (row,) = orjson.loads(result.output)["budgets"]
    assert (row["tenant"], row["period"], row["unit"], row["budget"]) == (
        "tenant-a", "day", "usd", 2.0)
    # two requests, each 53 tokens at the BF16 default, charged or still held
    assert row["spent"] + row["held"] > 0
    assert row["remaining"] == pytest.approx(2.0 - row["spent"] - row["held"])
