"""Energy fetch and aggregation against a fake gateway admin API (a real aiohttp server on a
free port serving GET /admin/v1/requests/{id} in the gateway's shape)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from loadgen import energy
from loadgen.results import RequestResult


def rr(i: int, tenant: str, rid: str, status: str = "ok") -> RequestResult:
    return RequestResult(i, tenant, "s", 0.0, 0.0, 0.1, 0.2, ((0.1, 1),), 10, 20, status, 200,
                         rid)


RECORDS = {
    "g1": {"tenant": "acme", "precision": "fp8", "prompt_tokens": 10, "completion_tokens": 20,
           "energy_j": 4.0, "carbon_g": 0.002, "cost_usd": 0.0001, "estimated": False},
    "g2": {"tenant": "acme", "precision": "bf16", "prompt_tokens": 10, "completion_tokens": 20,
           "energy_j": 6.0, "carbon_g": 0.003, "cost_usd": 0.0002, "estimated": True},
    "g3": {"tenant": "globex", "precision": "fp8", "prompt_tokens": 30, "completion_tokens": 40,
           "energy_j": 8.0, "carbon_g": 0.004, "cost_usd": 0.0003, "estimated": False},
}


@contextlib.asynccontextmanager
async def fake_admin(final_after: int = 0) -> AsyncIterator[tuple[str, dict[str, int]]]:
    """Serves RECORDS; a record reads final only after `final_after` earlier reads of it."""
    seen: dict[str, int] = {}

    async def get(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer sk-admin":
            return web.json_response({"error": {"code": "invalid_admin_key"}}, status=401)
        rid = request.match_info["rid"]
        if rid not in RECORDS:
            return web.json_response({"error": {"code": "not_found"}}, status=404)
        seen[rid] = seen.get(rid, 0) + 1
        body = {"request_id": rid, "model": "m", "engine": "e", **RECORDS[rid],
                "final": seen[rid] > final_after}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get("/admin/v1/requests/{rid}", get)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


@pytest.mark.timeout(20)
async def test_energy_is_fetched_per_request_and_aggregated_per_tenant_and_precision() -> None:
    results = [rr(0, "acme", "g1"), rr(1, "acme", "g2"), rr(2, "globex", "g3"),
               rr(3, "globex", "")]
    async with fake_admin() as (url, _):
        session = energy.admin_session()
        try:
            fetch = await energy.fetch_energy(session, url, "sk-admin", results)
        finally:
            await session.close()
    assert set(fetch.rows) == {"g1", "g2", "g3"} and fetch.no_id == 1 and fetch.reason == ""
    total = energy.overall_energy(fetch, results)
    assert total is not None
    assert total.energy_j == 18.0
    assert total.j_per_request == pytest.approx(6.0)
    assert total.j_per_output_token == pytest.approx(18.0 / 80)
    assert total.carbon_g_per_1k_tokens == pytest.approx(1000 * 0.009 / 130)
    assert total.estimated == 1
    by_tenant = {e.name: e for e in energy.group_energy(fetch, results, "tenant")}
    assert by_tenant["acme"].energy_j == 10.0 and by_tenant["globex"].requests == 1
    by_prec = {e.name: e for e in energy.group_energy(fetch, results, "precision")}
    assert by_prec["fp8"].j_per_output_token == pytest.approx(12.0 / 60)


@pytest.mark.timeout(20)
async def test_records_not_final_yet_are_polled_again() -> None:
    async with fake_admin(final_after=1) as (url, seen):
        session = energy.admin_session()
        try:
            fetch = await energy.fetch_energy(session, url, "sk-admin", [rr(0, "acme", "g1")],
                                              wait_final_s=5.0)
        finally:
            await session.close()
    assert fetch.rows["g1"].final and seen["g1"] == 2


@pytest.mark.timeout(20)
async def test_energy_is_na_with_the_reason_when_there_is_no_accounting() -> None:
    async with fake_admin() as (url, _):
        session = energy.admin_session()
        try:
            unknown = await energy.fetch_energy(session, url, "sk-admin", [rr(0, "a", "zz")])
            refused = await energy.fetch_energy(session, url, "wrong", [rr(0, "a", "g1")])
            no_ids = await energy.fetch_energy(session, url, "", [rr(0, "a", "")])
        finally:
            await session.close()
    assert energy.overall_energy(unknown, [rr(0, "a", "zz")]) is None
    assert "404" in unknown.reason
    assert "401" in refused.reason
    assert "no gateway request ids" in no_ids.reason


@contextlib.asynccontextmanager
async def fake_sim(known: dict[str, float]) -> AsyncIterator[str]:
    """A simulated engine's truth endpoint: GET /sim/requests/{id} for the ids it served."""

    async def get(request: web.Request) -> web.Response:
        rid = request.match_info["rid"]
        if rid not in known:
            return web.json_response({"error": "unknown request id"}, status=404)
        return web.json_response({"request_id": rid, "prompt_tokens": 10,
                                  "completion_tokens": 20, "energy_j": known[rid]})

    app = web.Application()
    app.router.add_get("/sim/requests/{rid}", get)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.timeout(20)
async def test_simulator_truth_is_found_on_whichever_engine_served_the_request() -> None:
    """Through a gateway, each id is looked up on every engine until one knows it; energy is
    labelled as simulator ground truth with no carbon or cost."""
    results = [rr(0, "acme", "g1"), rr(1, "acme", "g2"), rr(2, "acme", "g9")]
    async with fake_sim({"g1": 3.0}) as a, fake_sim({"g2": 5.0}) as b:
        session = energy.admin_session()
        try:
            fetch = await energy.fetch_sim_energy(session, [a, b], results, by_gateway_id=True)
        finally:
            await session.close()
    assert fetch.source == "sim" and set(fetch.rows) == {"g1", "g2"}
    assert "1 of 3 requests without a simulator record" in fetch.reason
    total = energy.overall_energy(fetch, results)
    assert total is not None and total.energy_j == 8.0
    assert total.j_per_output_token == pytest.approx(8.0 / 40)
    assert math.isnan(total.carbon_g_per_1k_tokens)
