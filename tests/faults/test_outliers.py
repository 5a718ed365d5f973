"""Outlier detection through the real gateway: an engine that fails at the gateway (hangs, bad
HTTP, 5xx, resets) is ejected after consecutive failures although its /health says 200, for
base_ejection_s x its ejections; never more than max_ejection_percent of a pool, never the
last endpoint; a healthy engine keeps serving meanwhile."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import pytest

from tests.faults.helpers import (
    body,
    endpoints,
    ep,
    error_of,
    is_ejected,
    metrics_text,
    post,
    wait_for,
)
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway import make_config, running_gateway

pytestmark = pytest.mark.timeout(90)
# failures a gateway may answer without retrying elsewhere (the engine may be working on it)
UNRETRIED = {"hang-head": ("upstream_timeout",), "bad-status": ("upstream_protocol_error",)}
TIMEOUTS = {"connect_s": 2, "first_byte_s": 1.0, "read_s": 2, "total_s": 30}
# the success weighting off (floor 1: every endpoint always in the running), so that round
# robin alone decides which requests reach the failing engine (tests/faults/
# test_failing_peers.py has the two together)
ROUND_ROBIN = {"policy": "round_robin", "success_floor": 1.0}


def _healthy_gauge(text: str, engine: str) -> float:
    pattern = r'wattgate_endpoint_healthy\{engine="' + re.escape(engine) + r'"[^}]*\} ([0-9.]+)'
    match = re.search(pattern, text)
    assert match, f"no wattgate_endpoint_healthy for {engine}"
    return float(match.group(1))


@pytest.mark.parametrize("mode", ["hang-head", "bad-status", "500-text", "503-json", "reset"])
async def test_failing_engine_is_ejected_after_5_consecutive_failures_while_the_other_serves(
        mode: str) -> None:
    """Round robin over a failing and a good engine: every request succeeds, except those the
    gateway sent to the failing engine and did not retry (then the fault's own error: a hang
    may have started work on the engine); the failing engine gets exactly 5 requests,
    then it is ejected (admin ejected_until, healthy gauge 0) and stays out although its
    health checks keep passing."""
    async with fault_engine(FaultEngine(default=mode)) as bad, \
            fault_engine(FaultEngine()) as good:
        config = make_config([ep(bad, "bad"), ep(good, "good")], timeouts=TIMEOUTS,
                             routing=ROUND_ROBIN,
                             retries={"max_attempts": 3, "deadline_s": 10})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            for i in range(16):
                status, raw, headers = await post(s, gw, body(stream=i % 2 == 1))
                if status != 200:  # sent to the bad engine and not retried: its own error
                    assert bad.completions <= 5
                    assert error_of(raw)["code"] in UNRETRIED.get(mode, ()), raw
                    continue
                assert b"tok" in raw and headers["x-wattgate-endpoint"] == "good", (i, raw)
            assert bad.completions == 5
            rows = await endpoints(s, gw)
            assert is_ejected(rows["bad"]) and not is_ejected(rows["good"])
            text = await metrics_text(s, gw)
            assert _healthy_gauge(text, "bad") == 0.0 and _healthy_gauge(text, "good") == 1.0
            checks = bad.health_checks  # health checks pass meanwhile ...
            await wait_for(lambda: bad.health_checks >= checks + 3, 20, "3 more health checks")
            for _ in range(4):
                status, _, _ = await post(s, gw, body())
                assert status == 200
            assert bad.completions == 5  # ... and do not end the ejection
            assert is_ejected((await endpoints(s, gw))["bad"])


async def test_at_most_max_ejection_percent_of_a_pool_is_ejected() -> None:
    """Three of four engines answer 500: only two (50 %) are ejected; the third keeps getting
    requests although it fails every one; the good one is never ejected."""
    bads = [FaultEngine(default="500-text") for _ in range(3)]
    async with fault_engine(bads[0]), fault_engine(bads[1]), fault_engine(bads[2]), \
            fault_engine(FaultEngine()) as good:
        eps = [ep(b, f"b{i}") for i, b in enumerate(bads)] + [ep(good, "good")]
        config = make_config(eps, timeouts=TIMEOUTS, routing=ROUND_ROBIN,
                             outlier_detection={"consecutive_failures": 5, "base_ejection_s": 30,
                                                "max_ejection_s": 300,
                                                "max_ejection_percent": 50})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            for _ in range(40):
                await post(s, gw, body())
            rows = await endpoints(s, gw)
            ejected = sorted(name for name, row in rows.items() if is_ejected(row))
            assert len(ejected) == 2 and "good" not in ejected, rows
            kept = next(f"b{i}" for i in range(3) if f"b{i}" not in ejected)
            kept_engine = bads[int(kept[1])]
            assert kept_engine.completions > 5  # failing, but past the cap: still in the pool
            before = kept_engine.completions
            for _ in range(8):
                await post(s, gw, body())
            assert kept_engine.completions > before
            text = await metrics_text(s, gw)
            assert sorted(n for n in ("b0", "b1", "b2", "good")
                          if _healthy_gauge(text, n) == 0.0) == ejected


async def test_the_only_endpoint_of_a_pool_is_never_ejected() -> None:
    """Eight 500s in a row from the only engine: each client gets the engine's 500, the
    endpoint stays in, and the ninth request is served."""
    engine = FaultEngine(script=["500-text"] * 8)
    async with fault_engine(engine):
        config = make_config([ep(engine, "only")], timeouts=TIMEOUTS)
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            for _ in range(8):
                status, _, _ = await post(s, gw, body())
                assert status == 500
            assert not is_ejected((await endpoints(s, gw))["only"])
            status, raw, _ = await post(s, gw, body())
            assert status == 200 and b"tok" in raw


async def test_ejection_lasts_base_ejection_s_times_the_number_of_ejections() -> None:
    """base_ejection_s 1: the first ejection keeps the engine out at least ~1 s, the second
    (after 5 more failures once back) at least ~2 s. Only lower bounds: a busy machine can
    only make them longer."""
    bad = FaultEngine(default="500-text")
    async with fault_engine(bad), fault_engine(FaultEngine()) as good:
        config = make_config([ep(bad, "bad"), ep(good, "good")], timeouts=TIMEOUTS,
                             routing=ROUND_ROBIN,
                             outlier_detection={"consecutive_failures": 5, "base_ejection_s": 1,
                                                "max_ejection_s": 300,
                                                "max_ejection_percent": 50})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:

            async def until(cond: str, limit_s: float = 20.0) -> float:
                start = time.monotonic()
                seen = bad.completions
                while time.monotonic() - start < limit_s:
                    status, _, _ = await post(s, gw, body())
                    assert status == 200
                    ejected = is_ejected((await endpoints(s, gw))["bad"])
                    if (cond == "ejected" and ejected) or (cond == "back" and
                                                           bad.completions > seen):
                        return time.monotonic()
                    await asyncio.sleep(0.05)
                raise AssertionError(f"bad not {cond} within {limit_s}s")

            first = await until("ejected")
            assert bad.completions == 5
            back = await until("back")
            assert back - first >= 0.9
            second = await until("ejected")
            assert bad.completions == 10
            back = await until("back")
            assert back - second >= 1.8


@pytest.mark.parametrize("threshold", [50.0, 0.0])
async def test_an_engine_failing_every_other_request_is_ejected_by_its_failure_percentage(
        threshold: float) -> None:
    """An engine that answers 500 and 200 in turn never fails 5 times in a row. Round robin,
    40 requests, each 500 retried on the good peer: with failure_percentage_threshold 50 it is
    ejected once it has seen the request volume (10) at 50 % failures, and gets no more; with
    the threshold 0 (off) it keeps its half of the traffic."""
    bad = FaultEngine(script=["500-text", "ok"] * 40)
    async with fault_engine(bad), fault_engine(FaultEngine()) as good:
        config = make_config([ep(bad, "bad"), ep(good, "good")], timeouts=TIMEOUTS,
                             routing=ROUND_ROBIN, retries={"max_attempts": 3, "deadline_s": 10},
                             outlier_detection={"failure_percentage_threshold": threshold,
                                                "failure_percentage_request_volume": 10})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            for i in range(40):
                status, raw, _ = await post(s, gw, body(stream=i % 2 == 1))
                assert status == 200 and b"tok" in raw, (i, raw)
            ejected = is_ejected((await endpoints(s, gw))["bad"])
            if threshold:
                assert ejected and bad.completions <= 12, bad.completions
            else:
                assert not ejected and bad.completions >= 19, bad.completions
