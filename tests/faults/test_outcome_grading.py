"""One outcome taxonomy on both sides of a real gateway process: the load generator grades
each request as the gateway's /metrics counts it. Refusals (a tenant past its rate limit, a
bad key) are `outcome="refused"` and out of attainment's denominator; an engine's own 429,
relayed with its own string code, is a failure on both sides; a client that leaves mid-stream
is `outcome="cancelled"`, also out of the denominator."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.vocab import SloClass
from loadgen.client import ClientOptions, Target, run_plan
from loadgen.run_summary import summarize
from loadgen.workload import PlannedRequest
from tests.faults.helpers import body, ep, gateway_process, metrics_text, wait_for, write_config
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway import KEY_A, KEY_B, raw_config

pytestmark = pytest.mark.timeout(120)

# Limits generous enough that every served request meets them on a loaded machine: what is
# checked is who is counted, not how fast the engine is.
LENIENT = SloClass("interactive", ttft_s=60.0, tpot_s=10.0)


def plan() -> list[PlannedRequest]:
    """tenant-a: 8 requests against 2 a minute (the rest 429 rate_limit_exceeded); a client
    with a wrong key: 3 (401); tenant-b: 4 served and 2 the engine answers with its own 429."""
    who = ([("tenant-a", KEY_A, ())] * 8 + [("unauthenticated", "sk-wrong", ())] * 3
           + [("tenant-b", KEY_B, ())] * 4 + [("tenant-b", KEY_B, (("x-fault", "429"),))] * 2)
    return [PlannedRequest(index=i, intended_s=0.0, tenant=tenant, api_key=key,
                           slo_class="interactive", prompt="hello there", prompt_tokens=2,
                           max_tokens=4, headers=headers)
            for i, (tenant, key, headers) in enumerate(who)]


def requests_by(text: str, *labels: str) -> Counter[tuple[str, ...]]:
    out: Counter[tuple[str, ...]] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "wattgate_requests_total":
                out[tuple(s.labels[k] for k in labels)] += int(s.value)
    return out


def slo_met(text: str) -> int:
    return sum(int(s.value) for family in text_string_to_metric_families(text)
               for s in family.samples if s.name == "wattgate_slo_met_total")


async def leave_mid_stream(s: aiohttp.ClientSession, gw: str) -> None:
    """tenant-b opens a stream the engine stalls after two tokens, reads its head, leaves."""
    headers = {"Authorization": f"Bearer {KEY_B}", "x-fault": "hang-mid"}
    async with s.post(gw + "/v1/completions", json=body(stream=True), headers=headers) as r:
        assert r.status == 200
        await r.content.readany()
        r.close()


async def cancelled_in(text: Awaitable[str]) -> str | None:
    got = await text
    return got if 'outcome="cancelled"' in got else None


def without_the_cancelled(text: str) -> str:
    """/metrics less the one request that left, so what remains is the load run's."""
    return "\n".join(line for line in text.splitlines() if 'outcome="cancelled"' not in line)


async def test_refusals_are_graded_apart_by_the_loadgen_and_the_gateways_metrics(
        tmp_path: Path) -> None:
    async with fault_engine(FaultEngine(tokens=4)) as eng:
        tenants = raw_config([])["tenants"]
        tenants[0]["limits"] = {"requests_per_minute": 2}  # tenant-a
        config, port = write_config(tmp_path, [ep(eng, precision="int4")], tenants=tenants,
                                    slo_classes={name: {"ttft_s": LENIENT.ttft_s,
                                                        "tpot_s": LENIENT.tpot_s}
                                                 for name in ("interactive", "batch")})
        with gateway_process(config, port, tmp_path / "gateway.log") as gw:
            results = await run_plan(plan(), Target(gw, "m", api="completions"),
                                     t0=time.monotonic(), concurrency=1,
                                     opts=ClientOptions())
            async with aiohttp.ClientSession() as s:
                await leave_mid_stream(s, gw)
                text = await wait_for(lambda: cancelled_in(metrics_text(s, gw)), 30,
                                      "the client that left counted as cancelled")

    cancelled = requests_by(text, "tenant", "status", "outcome")
    assert cancelled[("tenant-b", "client_disconnected", "cancelled")] == 1
    text = without_the_cancelled(text)

    graded = Counter((r.tenant, r.outcome) for r in results)
    assert graded == {("tenant-a", "served"): 2, ("tenant-a", "refused"): 6,
                      ("unauthenticated", "refused"): 3, ("tenant-b", "served"): 4,
                      ("tenant-b", "failed"): 2}, [(r.tenant, r.status, r.code) for r in results]
    assert {r.code for r in results if r.outcome != "served"} == {
        "rate_limit_exceeded", "invalid_api_key", "upstream_http_429"}

    # the gateway counts the same requests in the same classes, each with its status
    assert requests_by(text, "tenant", "outcome") == graded
    statuses = requests_by(text, "status", "outcome")
    assert statuses == {("ok", "served"): 6, ("rate_limit_exceeded", "refused"): 6,
                        ("invalid_api_key", "refused"): 3, ("upstream_http_429", "failed"): 2}
    # attainment, as the recording rule computes it: refusals are not in the denominator
    by_outcome = requests_by(text, "outcome")
    assert slo_met(text) == 6
    assert slo_met(text) / (by_outcome[("served",)] + by_outcome[("failed",)]) == 6 / 8

    summary, _ = summarize(results, lambda _: LENIENT, requested_rate_rps=0.0, closed_loop=True)
    assert (summary.ok, summary.refused, summary.failed, summary.cancelled) == (6, 9, 2, 0)
    assert summary.attainment == pytest.approx(6 / 8)
    tenants = {g.name: g for g in summary.per_tenant}
    assert tenants["tenant-a"].attainment == 1.0 and tenants["tenant-a"].refused == 6
    assert tenants["unauthenticated"].attainment is None  # nothing to judge, not 0 %
    assert tenants["tenant-b"].attainment == pytest.approx(4 / 6)
