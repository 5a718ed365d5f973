"""The request path against real HTTP engines on 127.0.0.1: relay, timing, errors, resilience."""

from __future__ import annotations

import asyncio
import socket
import statistics
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from core.records import RequestRecord
from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import KEY_A, KEY_B, make_config, running_gateway
from tests.support.procs import free_port, running

AUTH = {"Authorization": f"Bearer {KEY_A}"}
pytestmark = pytest.mark.timeout(60)


def ep(engine: FakeEngine | str, name: str = "e1", precision: str = "bf16", kind: str = "vllm"
       ) -> dict[str, Any]:
    url = engine if isinstance(engine, str) else engine.url
    return {"name": name, "url": url, "precision": precision, "kind": kind}


async def post(s: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
               ) -> tuple[int, bytes, dict[str, str]]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    hdrs = {"Content-Type": "application/json", **AUTH, **(headers or {})}
    async with s.post(url, data=data, headers=hdrs) as r:
        return r.status, await r.read(), dict(r.headers)


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
async def test_stream_is_byte_identical_to_direct_except_the_usage_chunk(front: bool) -> None:
    """Through the lean front and through aiohttp (connections the front hands over)."""
    async with fake_engine(FakeEngine(tokens=6, tokens_per_event=2, model="m")) as eng, \
            running_gateway(make_config([ep(eng)]), front=front) as gw, \
            aiohttp.ClientSession() as s:
        body = {"model": "m", "prompt": "hello there", "max_tokens": 6, "stream": True}
        _, direct, _ = await post(s, eng.url + "/v1/completions", body)
        status, proxied, headers = await post(s, gw + "/v1/completions", body)
        assert status == 200 and headers["Content-Type"] == "text/event-stream"
        assert proxied == direct  # the client did not ask for usage: none either way
        # the engine was asked for usage although the client was not
        assert eng.bodies[-1]["stream_options"] == {"include_usage": True}
        asked = {**body, "stream_options": {"include_usage": True}}
        _, direct_u, _ = await post(s, eng.url + "/v1/completions", asked)
        _, proxied_u, _ = await post(s, gw + "/v1/completions", asked)
        assert proxied_u == direct_u and b'"usage"' in proxied_u
        assert len(headers["x-wattgate-request-id"]) == 24


async def test_measured_ttft_tpot_match_known_engine_delays() -> None:
    """Engine: first token 150 ms after the request, then one every 20 ms (16 tokens). The
    gateway's TTFT/TPOT match what the engine did on the wire (median within 5 ms / 1 ms) and
    the nominal delays within the machine's scheduling noise."""
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(ttft_s=0.15, itl_s=0.02, model="m")) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append]) as gw, \
            aiohttp.ClientSession() as s:
        for path in ("/v1/completions", "/v1/chat/completions") * 3:
            body = {"model": "m", "max_tokens": 16, "stream": True, "prompt": "x",
                    "messages": [{"role": "user", "content": "x"}]}
            status, _, _ = await post(s, gw + path, body)
            assert status == 200
    assert len(records) == len(eng.wire) == 6
    ttft_diffs, tpot_diffs = [], []
    for i, (rec, (received, first, last)) in enumerate(zip(records, eng.wire, strict=True)):
        assert rec.status == "ok" and rec.completion_tokens == 16
        # chat: the role chunk is a token event too, as `vllm bench serve` counts
        assert len(rec.latency.itl_s) == 15 + i % 2
        assert rec.latency.ttft_s is not None and rec.latency.tpot_s is not None
        assert rec.latency.ttft_s == pytest.approx(0.15, abs=0.05)
        assert rec.latency.tpot_s == pytest.approx(0.02, abs=0.005)
        ttft_diffs.append(abs(rec.latency.ttft_s - (first - received)))
        tpot_diffs.append(abs(rec.latency.tpot_s - (last - first) / 15))
    assert statistics.median(ttft_diffs) <= 0.005, ttft_diffs
    assert statistics.median(tpot_diffs) <= 0.001, tpot_diffs


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
async def test_bad_inputs_get_openai_errors_and_are_counted(front: bool) -> None:
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m")) as eng, \
            running_gateway(make_config([ep(eng)], max_body_bytes=2048),
                            sinks=[records.append], front=front) as gw, \
            aiohttp.ClientSession() as s:
        url = gw + "/v1/completions"
        ok = {"model": "m", "prompt": "hi", "max_tokens": 2}
        cases = [
            (await post(s, url, b"{not json"), 400, "invalid_json"),
            (await post(s, url, {"prompt": "hi"}), 400, "missing_model"),
            (await post(s, url, {"model": "nope", "prompt": "hi"}), 404, "model_not_found"),
            (await post(s, url, ok, {"Authorization": "Bearer wrong"}), 401, "invalid_api_key"),
            (await post(s, url, ok, {"Authorization": ""}), 401, "missing_api_key"),
            (await post(s, url, {**ok, "prompt": "x" * 5000}), 413, "request_too_large"),
            (await post(s, url, ok, {"Content-Type": "text/plain"}), 415, "unsupported_media_type"),
            (await post(s, url, {**ok, "model": "m@int8"}, {"Authorization": f"Bearer {KEY_B}"}),
             403, "precision_not_allowed"),
            (await post(s, url, {**ok, "model": "m@fp4"}), 400, "invalid_precision"),
        ]
        for (status, body, headers), want_status, want_code in cases:
            err = orjson.loads(body)["error"]
            assert (status, err["code"]) == (want_status, want_code), body
            assert err["message"] and err["type"]
            assert "Traceback" not in body.decode() and "127.0.0.1" not in body.decode()
            assert "x-wattgate-request-id" in headers
        async with s.get(gw + "/metrics") as r:
            text = await r.text()
    assert [r.status for r in records] == [c[2] for c in cases]
    for code in ("invalid_json", "missing_model", "model_not_found", "invalid_api_key",
                 "request_too_large", "unsupported_media_type", "precision_not_allowed"):
        assert f'status="{code}"' in text


async def test_no_healthy_endpoint_is_503_and_upstream_timeout_is_504() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m")) as eng:
        # panic off: with it, routing would try the unhealthy engine all the same
        cfg = make_config([ep(dead)], retries={"max_attempts": 2, "deadline_s": 2},
                          outlier_detection={"panic_threshold_percent": 0})
        async with running_gateway(cfg, sinks=[records.append]) as gw, aiohttp.ClientSession() as s:
            status, body, _ = await post(s, gw + "/v1/completions", {"model": "m", "prompt": "a"})
            assert status in (502, 503) and "127.0.0.1" not in body.decode()
            await asyncio.sleep(0.4)  # health checks eject it
            status, body, _ = await post(s, gw + "/v1/completions", {"model": "m", "prompt": "a"})
            assert status == 503 and orjson.loads(body)["error"]["code"] == "no_healthy_endpoint"
        cfg = make_config([ep(eng)], timeouts={"first_byte_s": 0.3})
        async with running_gateway(cfg, sinks=[records.append]) as gw, aiohttp.ClientSession() as s:
            status, body, _ = await post(s, gw + "/v1/completions", {"model": "m", "prompt": "a"},
                                         {"x-fake-fault": "stall-s:2"})
            assert status == 504 and orjson.loads(body)["error"]["code"] == "upstream_timeout"
    assert records[-1].status == "upstream_timeout" and records[-1].engine == "e1"


async def test_connect_error_before_first_byte_is_retried_elsewhere_and_ejects() -> None:
    records: list[RequestRecord] = []
    victim = FakeEngine(model="m")
    async with fake_engine(FakeEngine(model="m")) as good:
        cm = fake_engine(victim)
        await cm.__aenter__()
        cfg = make_config([ep(victim, "victim"), ep(good, "good")],
                          routing={"policy": "round_robin"}, health={"interval_s": 30},
                          outlier_detection={"consecutive_failures": 1})
        async with running_gateway(cfg, sinks=[records.append]) as gw, aiohttp.ClientSession() as s:
            await asyncio.sleep(0.2)  # first health round: both healthy
            await cm.__aexit__(None, None, None)
            for _ in range(4):
                status, _, headers = await post(s, gw + "/v1/completions",
                                                {"model": "m", "prompt": "a", "max_tokens": 2})
                assert status == 200 and headers["x-wattgate-endpoint"] == "good"
            async with s.get(gw + "/metrics") as r:
                text = await r.text()
    assert all(r.status == "ok" for r in records)
    assert sum(1 for r in records if r.attempts == 2) == 1  # then the victim was ejected
    assert 'wattgate_retries_total{model="m"} 1.0' in text
    assert 'wattgate_upstream_errors_total{engine="victim",reason="connect"} 1.0' in text


async def test_503_from_engine_is_retried_on_another_endpoint() -> None:
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m")) as a, fake_engine(FakeEngine(model="m")) as b:
        cfg = make_config([ep(a, "a"), ep(b, "b")], routing={"policy": "round_robin"})
        async with running_gateway(cfg, sinks=[records.append]) as gw, aiohttp.ClientSession() as s:
            # the fault header reaches whichever engine is tried; both fail -> the engine's
            # 503 and its message, in the gateway's shape, after 2 tries
            status, body, _ = await post(s, gw + "/v1/completions", {"model": "m", "prompt": "a"},
                                         {"x-fake-fault": "status:503"})
            error = orjson.loads(body)["error"]
            assert status == 503 and error["message"] == "injected"
            assert error["code"] == "upstream_http_503"
    assert records[-1].attempts == 2 and len(a.bodies) == 1 and len(b.bodies) == 1


async def test_a_retry_sends_each_engine_the_clients_body_under_its_own_model_name() -> None:
    """A pool whose engines serve the model under different names: each attempt renames it,
    keeps every other field, and asks for usage on a stream the client asked none for."""
    async with fake_engine(FakeEngine(model="org/a")) as a, \
            fake_engine(FakeEngine(model="org/b")) as b:
        cfg = make_config([{**ep(a, "a"), "model": "org/a"}, {**ep(b, "b"), "model": "org/b"}],
                          routing={"policy": "round_robin"})
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            body = {"model": "m", "prompt": "a", "stream": True, "seed": 7,
                    "stream_options": {"continuous_usage_stats": False}}
            status, _, _ = await post(s, gw + "/v1/completions", body,
                                      {"x-fake-fault": "status:503"})
    assert status == 503
    sent = {**body, "stream_options": {"continuous_usage_stats": False, "include_usage": True}}
    assert a.bodies == [{**sent, "model": "org/a"}] and b.bodies == [{**sent, "model": "org/b"}]


async def test_midstream_failure_ends_stream_with_error_event_and_is_recorded() -> None:
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", itl_s=0.01)) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append]) as gw, \
            aiohttp.ClientSession() as s:
        status, body, _ = await post(s, gw + "/v1/completions",
                                     {"model": "m", "prompt": "a", "max_tokens": 10, "stream": True},
                                     {"x-fake-fault": "abort-after:3"})
    assert status == 200
    events = [e for e in body.split(b"\n\n") if e]
    assert len(events) == 4 and b'"upstream_stream_error"' in events[-1]
    rec = records[-1]
    assert rec.status == "upstream_stream_error" and rec.completion_tokens == 3
    assert rec.first_token_s is not None


@pytest.mark.parametrize("cancel_handler", [True, False])
async def test_client_disconnect_cancels_the_upstream_request(cancel_handler: bool) -> None:
    """Both when aiohttp cancels the handler and when the next write fails."""
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", itl_s=0.05)) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append],
                            handler_cancellation=cancel_handler) as gw:
        async with aiohttp.ClientSession() as s, s.post(
                gw + "/v1/completions", headers=AUTH,
                json={"model": "m", "prompt": "a", "max_tokens": 200, "stream": True}) as r:
            await r.content.readline()
        # session closed mid-stream
        for _ in range(50):
            if records:
                break
            await asyncio.sleep(0.05)
        for _ in range(50):
            if eng.aborted:
                break
            await asyncio.sleep(0.05)
    assert records and records[0].status == "client_disconnected"
    assert records[0].completion_tokens < 200
    assert eng.aborted == 1  # the engine saw its stream cancelled


async def test_killing_one_of_two_endpoints_mid_run() -> None:
    """New requests keep succeeding; in-flight streams on the dead one end with a clear error."""
    records: list[RequestRecord] = []
    port = free_port()
    victim_url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "tests.support.fake_engine", "--port", str(port), "--itl-s", "0.02"]
    async with fake_engine(FakeEngine(model="m", itl_s=0.02)) as survivor:
        with running(cmd, victim_url + "/health") as victim:
            cfg = make_config([ep(victim_url, "victim"), ep(survivor, "survivor")],
                              routing={"policy": "round_robin"})
            async with running_gateway(cfg, sinks=[records.append]) as gw, \
                    aiohttp.ClientSession() as s:
                body = {"model": "m", "prompt": "a", "max_tokens": 100, "stream": True}
                inflight = [asyncio.create_task(post(s, gw + "/v1/completions", body))
                            for _ in range(4)]
                await asyncio.sleep(0.5)
                victim.kill()  # SIGKILL mid-stream
                done = await asyncio.wait_for(asyncio.gather(*inflight), timeout=20)
                after = [await post(s, gw + "/v1/completions", {**body, "max_tokens": 3})
                         for _ in range(6)]
    broken = [b for _, b, _ in done if b'"error"' in b]
    assert len(broken) == 2 and all(b"upstream_stream_error" in b for b in broken)
    assert all(status == 200 and b"[DONE]" in b for status, b, _ in after)
    assert sum(1 for r in records if r.status == "ok") == 2 + 6
    assert sum(1 for r in records if r.status == "upstream_stream_error") == 2


async def test_health_checks_eject_and_recover() -> None:
    port = free_port()
    async with fake_engine(FakeEngine(model="m")) as other:
        cfg = make_config([{"name": "flaky", "url": f"http://127.0.0.1:{port}", "precision": "bf16"},
                           ep(other, "other")])
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            await asyncio.sleep(0.5)
            async with s.get(gw + "/metrics") as r:
                assert 'wattgate_endpoint_healthy{engine="flaky",model="m",precision="bf16"} 0.0' \
                    in await r.text()
            flaky = FakeEngine(model="m")
            from tests.support.fake_engine import serving
            async with serving(flaky.app(), port):
                await asyncio.sleep(0.6)
                async with s.get(gw + "/metrics") as r:
                    assert 'wattgate_endpoint_healthy{engine="flaky",model="m",precision="bf16"} 1.0' \
                        in await r.text()
                async with s.get(gw + "/readyz") as r:
                    assert r.status == 200


async def test_precision_override_by_suffix_and_header() -> None:
    async with fake_engine(FakeEngine(model="m")) as bf, fake_engine(FakeEngine(model="m")) as f8:
        cfg = make_config([ep(bf, "bf", "bf16"), ep(f8, "f8", "fp8")])
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            _, _, h1 = await post(s, gw + "/v1/completions", {"model": "m@fp8", "prompt": "a"})
            _, _, h2 = await post(s, gw + "/v1/completions", {"model": "m", "prompt": "a"},
                                  {"x-wattgate-precision": "bf16"})
            _, _, h3 = await post(s, gw + "/v1/completions", {"model": "m", "prompt": "a"},
                                  {"Authorization": f"Bearer {KEY_B}"})  # prefers int4, then fp8
    assert h1["x-wattgate-endpoint"] == "f8" and f8.bodies[0]["model"] == "m"
    assert h2["x-wattgate-endpoint"] == "bf" and h3["x-wattgate-precision"] == "fp8"


async def test_models_health_ready_and_metrics_endpoints() -> None:
    async with fake_engine(FakeEngine(model="m")) as eng, \
            running_gateway(make_config([ep(eng)])) as gw, aiohttp.ClientSession() as s:
        async with s.get(gw + "/v1/models", headers=AUTH) as r:
            assert (await r.json())["data"][0]["id"] == "m"
        async with s.get(gw + "/v1/models") as r:
            assert r.status == 401
        async with s.get(gw + "/healthz") as r:
            assert r.status == 200
        await asyncio.sleep(0.3)
        async with s.get(gw + "/readyz") as r:
            assert r.status == 200
        await post(s, gw + "/v1/completions", {"model": "m", "prompt": "a", "stream": True})
        async with s.get(gw + "/metrics") as r:
            text = await r.text()
        async with s.get(gw + "/nope") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
    for name in ("wattgate_requests_total", "wattgate_ttft_seconds_bucket", "wattgate_tpot_seconds",
                 "wattgate_itl_seconds", "wattgate_e2e_seconds", "wattgate_slo_met_total",
                 "wattgate_prompt_tokens_total", "wattgate_completion_tokens_total",
                 "wattgate_requests_in_flight", "wattgate_gateway_queue_seconds",
                 "wattgate_upstream_seconds"):
        assert name in text, name


async def test_upstream_sockets_use_tcp_nodelay() -> None:
    """The request path's client sets TCP_NODELAY on every engine connection it opens."""
    from gateway.app import upstream_client

    async with fake_engine(FakeEngine(model="m")) as eng:
        client = upstream_client(make_config([ep(eng)]))
        body = orjson.dumps({"model": "m", "prompt": "a", "max_tokens": 3, "stream": True})
        try:
            r = await client.post(eng.url, "/v1/completions", body,
                                  [("Content-Type", "application/json")])
            try:
                sock = r._conn._transport.get_extra_info("socket")  # type: ignore[union-attr]
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
                assert b"[DONE]" in await r.read_all()
            finally:
                r.close()
        finally:
            client.close()


async def test_a_stream_in_flight_holds_the_ledger_watermark_at_its_arrival(
        tmp_path: Path) -> None:
    """The accounting service learns from the proxy when the oldest request being served
    arrived, and publishes it with its flushes: the apportioner waits for that request before
    it apportions the intervals it is in flight over; once it ends the hold goes."""
    import time

    from accounting.ledger.sqlite import SqliteLedger

    ledger_path = tmp_path / "ledger.db"
    async with fake_engine(FakeEngine(ttft_s=0.05, itl_s=0.05, tokens=30, model="m")) as eng:
        config = make_config([ep(eng)], accounting={
            "ledger": {"kind": "sqlite", "path": str(ledger_path)}, "flush_s": 0.1,
            "poll_s": 0.05})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            started = time.time()
            stream = asyncio.create_task(post(s, gw + "/v1/completions", {
                "model": "m", "prompt": "a", "max_tokens": 30, "stream": True}))
            await asyncio.sleep(0.8)  # the stream takes ~1.5 s; several flushes meanwhile
            reader = SqliteLedger(ledger_path)
            await reader.open()
            try:
                held = await reader.open_since(time.time() - 10.0)
                assert held is not None and started <= held <= started + 0.3
                status, body, _ = await stream
                assert status == 200 and b"[DONE]" in body
                await asyncio.sleep(0.5)
                assert await reader.open_since(time.time() - 10.0) is None
            finally:
                await reader.close()
