"""Tenant rate limits, token limits, concurrency caps, /v1/models per tenant and the /metrics
key, through the real gateway (lean front and aiohttp) against a fake engine."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from core.records import RequestRecord
from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import KEY_A, KEY_B, digest, make_config, raw_config, running_gateway

pytestmark = pytest.mark.timeout(60)
AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
BODY = {"model": "m", "prompt": "hello", "max_tokens": 4}


def ep(engine: FakeEngine, name: str = "e1", precision: str = "int4") -> dict[str, Any]:
    return {"name": name, "url": engine.url, "precision": precision}


def limited(endpoints: list[dict[str, Any]], limits: dict[str, Any], **extra: Any
            ) -> dict[str, Any]:
    raw = raw_config(endpoints, **extra)
    raw["tenants"][0]["limits"] = limits
    return raw


async def post(s: aiohttp.ClientSession, url: str, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    async with s.post(url, data=orjson.dumps(body),
                      headers={"Content-Type": "application/json", **AUTH_A, **(headers or {})}
                      ) as r:
        raw = await r.read()
        return r.status, raw, dict(r.headers)


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
async def test_requests_past_the_per_minute_limit_get_openai_429s_and_are_recorded(
        front: bool) -> None:
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m")) as eng:
        from gateway.config import parse_config

        config = parse_config(limited([ep(eng)], {"requests_per_minute": 3}), env={})
        async with running_gateway(config, [records.append], front=front) as gw, \
                aiohttp.ClientSession() as s:
            got = [await post(s, gw + "/v1/completions", BODY) for _ in range(3)]
            stream = {**BODY, "stream": True}
            status, body, headers = await post(s, gw + "/v1/completions", stream)
            assert [g[0] for g in got] == [200, 200, 200]
            assert [g[2]["x-ratelimit-remaining-requests"] for g in got] == ["2", "1", "0"]
            assert got[0][2]["x-ratelimit-limit-requests"] == "3"
            assert got[0][2]["x-ratelimit-reset-requests"].endswith("s")
            assert status == 429
            err = orjson.loads(body)["error"]
            assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
            # one request comes back every 20 s: wait at least that, rounded up
            assert int(headers["Retry-After"]) == 20
            assert headers["x-ratelimit-remaining-requests"] == "0"
            # tenant-b has no limits: neither refused nor given rate-limit headers
            status_b, _, headers_b = await post(s, gw + "/v1/completions", BODY,
                                                {"Authorization": f"Bearer {KEY_B}"})
            assert status_b == 200 and "x-ratelimit-limit-requests" not in headers_b
            async with s.get(gw + "/metrics") as r:
                text = await r.text()
    assert 'wattgate_tenant_limited_total{reason="requests",tenant="tenant-a"} 1.0' in text
    refused = [r for r in records if r.http_status == 429]
    assert len(refused) == 1 and refused[0].status == "rate_limit_exceeded"
    assert refused[0].tenant == "tenant-a"


async def test_a_streamed_response_carries_the_rate_limit_headers_in_its_head() -> None:
    async with fake_engine(FakeEngine(model="m")) as eng:
        from gateway.config import parse_config

        config = parse_config(limited([ep(eng)], {"requests_per_second": 5,
                                                  "tokens_per_minute": 1000}), env={})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            status, body, headers = await post(s, gw + "/v1/completions",
                                               {**BODY, "stream": True})
    assert status == 200 and b"[DONE]" in body
    assert headers["x-ratelimit-limit-requests"] == "5"
    assert headers["x-ratelimit-remaining-requests"] == "4"
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    # "hello" is 2 tokens by the byte estimate, plus max_tokens 4
    assert headers["x-ratelimit-remaining-tokens"] == "994"


async def test_tokens_per_minute_reserve_max_tokens_and_settle_to_the_real_count() -> None:
    """Reserved: prompt estimate + max_tokens; settled: the engine's usage (prompt 5 + the
    completion). A request bigger than the whole limit is refused, never waits."""
    async with fake_engine(FakeEngine(model="m")) as eng:
        from gateway.config import parse_config

        config = parse_config(limited([ep(eng)], {"tokens_per_minute": 100}), env={})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            too_big = await post(s, gw + "/v1/completions", {**BODY, "max_tokens": 200})
            first = await post(s, gw + "/v1/completions", {**BODY, "max_tokens": 60})
            # 100 - (5 + 60) used = 35 left (plus a trickle of refill): 60 more do not fit
            second = await post(s, gw + "/v1/completions", {**BODY, "max_tokens": 60})
            third = await post(s, gw + "/v1/completions", {**BODY, "max_tokens": 20})
    assert too_big[0] == 429 and "Retry-After" not in too_big[2]
    assert b"more than the limit allows" in too_big[1]
    assert first[0] == 200
    assert second[0] == 429 and orjson.loads(second[1])["error"]["code"] == "rate_limit_exceeded"
    assert third[0] == 200
    assert 8 <= int(third[2]["x-ratelimit-remaining-tokens"]) <= 14  # 35 - 22 reserved


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
async def test_concurrent_requests_past_max_concurrent_are_refused(front: bool) -> None:
    async with fake_engine(FakeEngine(model="m", ttft_s=1.5)) as eng:
        from gateway.config import parse_config

        config = parse_config(limited([ep(eng)], {"max_concurrent": 2}), env={})
        async with running_gateway(config, front=front) as gw, aiohttp.ClientSession() as s:
            got = await asyncio.gather(*(post(s, gw + "/v1/completions", BODY)
                                         for _ in range(6)))
            after = await post(s, gw + "/v1/completions", BODY)
    statuses = sorted(g[0] for g in got)
    assert statuses == [200, 200, 429, 429, 429, 429]
    assert after[0] == 200  # the slots came back


async def test_models_list_only_what_the_tenant_may_use_and_metrics_need_their_key() -> None:
    async with fake_engine(FakeEngine(model="m")) as eng:
        from gateway.config import parse_config

        raw = raw_config([ep(eng, "e1", "bf16"), ep(eng, "e2", "int4")],
                         metrics={"api_key_sha256": digest("sk-scrape")})
        raw["models"].append({"name": "only-bf16", "endpoints": [
            {"name": "e3", "url": eng.url, "precision": "bf16"}]})
        config = parse_config(raw, env={})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            async with s.get(gw + "/v1/models", headers=AUTH_A) as r:
                a = await r.json()
            async with s.get(gw + "/v1/models",
                             headers={"Authorization": f"Bearer {KEY_B}"}) as r:
                b = await r.json()
            async with s.get(gw + "/metrics") as r:
                anonymous = r.status
            async with s.get(gw + "/metrics", headers=AUTH_A) as r:
                tenant = r.status
            async with s.get(gw + "/metrics", headers={"Authorization": "Bearer sk-scrape"}
                             ) as r:
                scraper, text = r.status, await r.text()
    assert {m["id"]: m["precisions"] for m in a["data"]} == {"m": ["bf16", "int4"],
                                                               "only-bf16": ["bf16"]}
    # tenant-b may use int4 and fp8 only
    assert {m["id"]: m["precisions"] for m in b["data"]} == {"m": ["int4"]}
    assert (anonymous, tenant, scraper) == (401, 401, 200)
    assert "wattgate_requests_total" in text or "wattgate_requests" in text


def test_limits_and_budgets_are_validated_with_field_paths() -> None:
    from core.errors import ConfigError
    from gateway.config import parse_config

    def bad(tenant_extra: dict[str, Any], accounting: bool = True) -> str:
        raw = raw_config([{"name": "e", "url": "http://127.0.0.1:1", "precision": "bf16"}])
        raw["tenants"][0].update(tenant_extra)
        if accounting:
            raw["accounting"] = {"ledger": {"kind": "sqlite", "path": "/tmp/x.db"}}
        with pytest.raises(ConfigError) as exc:
            parse_config(raw, env={})
        return exc.value.path

    assert bad({"limits": {"requests_per_minute": 0}}) == "tenants[0].limits.requests_per_minute"
    assert bad({"limits": {"rpm": 5}}) == "tenants[0].limits.rpm"
    assert bad({"budgets": [{"period": "week", "usd": 1}]}) == "tenants[0].budgets[0].period"
    assert bad({"budgets": [{"period": "day", "usd": 1, "j": 5}]}) == "tenants[0].budgets[0]"
    assert bad({"on_budget": "queue"}) == "tenants[0].on_budget"
    assert bad({"budgets": [{"period": "day", "usd": 1}]}, accounting=False) == \
        "tenants[0].budgets"
    ok = make_config([{"name": "e", "url": "http://127.0.0.1:1", "precision": "bf16"}])
    assert ok.tenants[0].limits.any is False
