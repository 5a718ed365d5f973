"""Budget 429s a client can act on, through the real gateway with a SQLite ledger: Retry-After
is when the reservations that block the request are billed (not the period's end) when the
charges alone leave room; the message says what is reserved; `on_budget: downgrade` changes
a pinned precision only where the tenant's policy allows it, and says so where it does not."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.integration.test_tenant_budgets import budget_config, post
from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import running_gateway

pytestmark = pytest.mark.timeout(90)


def error_of(raw: bytes) -> dict[str, Any]:
    err = orjson.loads(raw)["error"]
    assert isinstance(err, dict)
    return err


async def test_retry_after_is_when_the_finished_requests_are_billed(tmp_path: Path) -> None:
    """Two requests (105.7 J reserved each at the prior) fill a 220 J budget; once they have
    finished, a third is refused while their reservations wait for their bills, and told to
    come back in seconds, not at the end of the hour: then it is admitted."""
    async with fake_engine(FakeEngine(model="m")) as eng:
        config = budget_config(eng, tmp_path / "l.db", {"period": "hour", "j": 220})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            first = await asyncio.gather(*(post(s, gw + "/v1/completions") for _ in range(2)))
            assert [g[0] for g in first] == [200, 200]
            await asyncio.sleep(0.3)  # their settlements are written; their bills are not final
            status, raw, headers = await post(s, gw + "/v1/completions")
            assert status == 429, raw
            retry_s = int(headers["Retry-After"])
            message = error_of(raw)["message"]
            assert 1 <= retry_s <= 6, retry_s  # interval 1 s, settle 0.5 s: not the hour
            t0 = time.monotonic()
            await asyncio.sleep(retry_s)
            again = (await post(s, gw + "/v1/completions"))[0]
            waited_s = time.monotonic() - t0
    assert "reserved" in message and "in flight" not in message, message
    assert again == 200, f"refused again {waited_s:.1f} s later"


async def test_retry_after_is_the_period_end_when_the_charges_leave_no_room(tmp_path: Path
                                                                           ) -> None:
    async with fake_engine(FakeEngine(model="m")) as eng:
        config = budget_config(eng, tmp_path / "l.db", {"period": "hour", "j": 50})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            status, raw, headers = await post(s, gw + "/v1/completions")  # 105.7 J > 50 J
    now = time.time()
    assert status == 429 and error_of(raw)["code"] == "budget_exceeded"
    assert int(headers["Retry-After"]) == pytest.approx(3600 - now % 3600, abs=3)


async def test_downgrade_leaves_a_pinned_precision_and_says_so(tmp_path: Path) -> None:
    """Room for INT4 (52.92 J) but not BF16 (105.7 J): a request that pins BF16 is refused,
    the message naming the pin, unless budget_downgrade_pinned lets the downgrade apply."""
    got: dict[bool, tuple[int, bytes, dict[str, str]]] = {}
    for pinned_ok in (False, True):
        async with fake_engine(FakeEngine(model="m")) as eng:
            config = budget_config(eng, tmp_path / f"l{pinned_ok}.db", {"period": "day", "j": 60},
                                   ("bf16", "int4"), on_budget="downgrade",
                                   budget_downgrade_pinned=pinned_ok)
            async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
                got[pinned_ok] = await post(s, gw + "/v1/completions",
                                            {"x-wattgate-precision": "bf16"})
    status, raw, headers = got[False]
    assert status == 429 and headers["x-wattgate-budget"] == "exceeded"
    assert "pins precision 'bf16'" in error_of(raw)["message"]
    status, raw, headers = got[True]
    assert status == 200, raw
    assert headers["x-wattgate-precision"] == "int4"
    assert headers["x-wattgate-budget"] == "downgraded;from=bf16"
