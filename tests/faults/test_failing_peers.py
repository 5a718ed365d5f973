"""A failing engine beside a healthy peer, through the real gateway: routing never black-holes
traffic into it (success weighting, a 429 retried elsewhere and backed off), outlier detection
ejects it for failures after the response head too, a pool whose health checks all fail at
once is still served (panic), a non-stream answer that is not JSON is a 502, and the client's
`x-*` headers reach the engine only when they are clean."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import aiohttp
import orjson
import pytest

from loadgen.results import answer_status, client_outcome
from tests.faults.helpers import (
    body,
    endpoints,
    ep,
    error_of,
    is_ejected,
    metrics_text,
    post,
    read_response,
    wait_for,
)
from tests.support.fault_engine import ENGINE_429_CODE, FaultEngine, fault_engine
from tests.support.gateway import KEY_A, make_config, running_gateway

pytestmark = pytest.mark.timeout(180)
TIMEOUTS = {"connect_s": 2, "first_byte_s": 1.0, "read_s": 0.5, "total_s": 30}
POLICIES = ["round_robin", "least_load", "prefix_affinity", "slo_energy"]
NO_EJECTION = {"consecutive_failures": 1000,  # the success weighting alone
               "failure_percentage_threshold": 0}


def served_by_good(status: int, raw: bytes, headers: dict[str, str], stream: bool) -> bool:
    """The client got a whole, valid answer from the healthy peer."""
    if status != 200 or headers.get("x-wattgate-endpoint") != "good":
        return False
    if stream:
        return raw.rstrip().endswith(b"data: [DONE]") and b'{"error"' not in raw
    doc = orjson.loads(raw)
    return bool(doc["choices"]) and "tok" in doc["choices"][0]["text"]


async def drive(s: aiohttp.ClientSession, gw: str, n: int, *, concurrency: int = 8,
                cap_s: float = 90.0) -> list[bool]:
    """`n` requests (streamed and not, alternately; prompts varied for prefix affinity) from
    `concurrency` clients, stopping early at `cap_s`; whether each was served by the peer."""
    results: list[bool] = []
    todo = iter(range(n))
    deadline = time.monotonic() + cap_s

    async def client() -> None:
        for i in todo:
            if time.monotonic() > deadline:
                return
            stream = i % 2 == 1
            status, raw, headers = await post(s, gw, body(stream=stream, prompt=f"p{i % 7}"))
            results.append(served_by_good(status, raw, headers, stream))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return results


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", ["429", "garbage", "500-text"])
async def test_a_fast_failing_engine_loses_its_traffic_to_the_healthy_peer(
        mode: str, policy: str) -> None:
    """An engine that fails in a millisecond (429, a 200 of garbage, 500) looks idle to
    every load-based policy. With ejection out of the way, 300 requests at concurrency 8:
    at least 95 % are answered whole by the healthy peer, and the failing engine is tried on
    at most 10 % of them (a 429 is retried on the peer and backs its engine off; a garbage
    stream cannot be retried, the success weighting keeps requests away)."""
    async with fault_engine(FaultEngine(default=mode)) as bad, \
            fault_engine(FaultEngine()) as good:
        config = make_config([ep(bad, "bad"), ep(good, "good")], timeouts=TIMEOUTS,
                             routing={"policy": policy}, outlier_detection=NO_EJECTION,
                             retries={"max_attempts": 2, "deadline_s": 10})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            results = await drive(s, gw, 300)
            rows = await endpoints(s, gw)
    assert len(results) >= 200, len(results)
    share = sum(results) / len(results)
    assert share >= 0.95, (share, bad.completions, good.completions)
    assert bad.completions <= 0.10 * len(results), (bad.completions, len(results))
    assert not is_ejected(rows["bad"])  # the weighting did it, not an ejection
    assert rows["bad"]["success_ratio"] < 0.5 and rows["good"]["success_ratio"] == 1.0


async def test_an_engines_429_is_retried_on_the_peer_and_backs_the_engine_off() -> None:
    """One 429 (Retry-After: 7): the client's request is served by the peer, and the engine
    gets no request for its Retry-After (round robin would send it every other one); its
    failure is counted for outlier detection."""
    async with fault_engine(FaultEngine(script=["429"])) as bad, \
            fault_engine(FaultEngine()) as good:
        config = make_config([ep(bad, "bad"), ep(good, "good")], timeouts=TIMEOUTS,
                             routing={"policy": "round_robin"})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            served = []
            for i in range(12):
                status, raw, headers = await post(s, gw, body(stream=i % 2 == 1))
                served.append(served_by_good(status, raw, headers, i % 2 == 1))
            rows = await endpoints(s, gw)
    assert all(served), served
    assert bad.received["429"] == 1 and bad.received["ok"] == 0  # backed off since
    assert rows["bad"]["consecutive_failures"] == 1


async def test_the_only_engines_429_reaches_the_client_as_a_failure_of_the_engine() -> None:
    """No other engine: the client gets the engine's 429, in the OpenAI shape with its
    Retry-After, and the record says upstream_http_429 (a failure, not a refusal)."""
    records: list[Any] = []
    async with fault_engine(FaultEngine(script=["429"])) as only:
        config = make_config([ep(only, "only")], timeouts=TIMEOUTS)
        async with running_gateway(config, sinks=[records.append]) as gw, \
                aiohttp.ClientSession() as s:
            status, raw, headers = await post(s, gw, body())
            assert (status, error_of(raw)["code"]) == (429, ENGINE_429_CODE)
            assert headers["Retry-After"] == "7"
            # the engine's answer names the engine, so a client (the load generator) grades it
            # as the gateway records it: the engine's failure, not the gateway's refusal
            assert headers["x-wattgate-endpoint"] == "only"
            assert client_outcome("http_429", status, answer_status(
                status, raw, by_gateway="x-wattgate-endpoint" not in headers)) == "failed"
            status, raw, _ = await post(s, gw, body())  # backed off, but all there is
            assert status == 200 and b"tok" in raw
    assert records[0].status == "upstream_http_429" and records[0].outcome == "failed"


# mode -> (streamed, what the client gets: its status, and for a stream the last event's code)
AFTER_HEAD = {
    "hang-body": (False, 504, None),
    "trickle": (False, 504, None),
    "short-body": (False, 502, None),
    "hang-mid": (True, 200, "upstream_timeout"),
    "truncate": (True, 200, "upstream_stream_error"),
    "garbage": (True, 200, "upstream_stream_error"),
}


@pytest.mark.parametrize("mode", list(AFTER_HEAD))
async def test_a_failure_after_the_response_head_counts_for_ejection(mode: str) -> None:
    """Hung after its head, a trickle, a body shorter than its length, a stall mid-stream, a
    cut stream, a garbage stream: each counts as a failure of the engine, and it is ejected
    after exactly consecutive_failures (3) of them; every request is answered, by the peer
    or with the failure's error."""
    stream, want_status, want_code = AFTER_HEAD[mode]
    async with fault_engine(FaultEngine(default=mode, trickle_s=0.3)) as bad, \
            fault_engine(FaultEngine()) as good:
        config = make_config([ep(bad, "bad"), ep(good, "good")],
                             timeouts={**TIMEOUTS, "total_s": 2},
                             routing={"policy": "round_robin"},
                             outlier_detection={"consecutive_failures": 3})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            # the success weighting sends it ever fewer requests: about 65 to reach 3
            for _ in range(500):
                status, raw, headers = await post(s, gw, body(stream=stream))
                if not served_by_good(status, raw, headers, stream):
                    assert status == want_status, (status, raw)
                    if want_code is not None:
                        last = raw.strip().split(b"\n\n")[-1]
                        assert error_of(last[len(b"data: "):])["code"] == want_code
                if is_ejected((await endpoints(s, gw))["bad"]):
                    break
            assert is_ejected((await endpoints(s, gw))["bad"]), "not ejected in 500 requests"
            assert bad.completions == 3


async def test_a_stalled_engine_is_ejected_when_its_requests_time_out_together() -> None:
    """Six concurrent requests, three on the engine that hangs after its head: those three
    time out together at the request deadline (504), which ejects it; the peer serves the
    other three."""
    async with fault_engine(FaultEngine(default="hang-body")) as bad, \
            fault_engine(FaultEngine()) as good:
        config = make_config([ep(bad, "bad"), ep(good, "good")],
                             timeouts={**TIMEOUTS, "read_s": 30, "total_s": 1.5},
                             routing={"policy": "round_robin"},
                             outlier_detection={"consecutive_failures": 3})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            # all six routed before the first times out: round robin gives each engine three
            results = await asyncio.gather(*(post(s, gw, body()) for _ in range(6)))
            rows = await endpoints(s, gw)
    assert sorted(r[0] for r in results) == [200] * 3 + [504] * 3, results
    assert all(error_of(r[1])["code"] == "upstream_timeout" for r in results if r[0] == 504)
    assert bad.completions == 3 and is_ejected(rows["bad"]), rows["bad"]


async def test_every_health_check_failing_at_once_still_serves_under_panic() -> None:
    """A host stall fails both engines' health checks together: below the panic threshold
    (50 %) routing uses every endpoint of the pool, so requests are served, and the pool's
    panic gauge says so; once health is back the gauge is 0 again."""
    engines = [FaultEngine(), FaultEngine()]
    async with fault_engine(engines[0]) as a, fault_engine(engines[1]) as b:
        config = make_config([ep(a, "a"), ep(b, "b")], timeouts=TIMEOUTS)
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            for eng in engines:
                eng.health_ok = False

            async def all_unhealthy() -> bool:
                return not any(row["healthy"] for row in (await endpoints(s, gw)).values())

            await wait_for(all_unhealthy, 20, "both endpoints unhealthy")
            statuses = [(await post(s, gw, body(stream=i % 2 == 1)))[0] for i in range(20)]
            assert statuses == [200] * 20
            assert _panic_gauge(await metrics_text(s, gw)) == 1.0
            for eng in engines:
                eng.health_ok = True

            async def calm() -> bool:
                return _panic_gauge(await metrics_text(s, gw)) == 0.0

            await wait_for(calm, 20, "panic over")
    assert a.completions > 0 and b.completions > 0


def _panic_gauge(text: str) -> float:
    match = re.search(r'wattgate_pool_panic\{model="m"\} ([0-9.]+)', text)
    assert match, "no wattgate_pool_panic"
    return float(match.group(1))


@pytest.mark.parametrize("mode", ["garbage", "sse-body"])
async def test_a_non_stream_answer_that_is_not_json_is_a_502_failure(mode: str) -> None:
    """`stream: false`, and the engine answers 200 with garbage or an SSE stream: the only
    engine's client gets a 502 upstream_protocol_error (never the bytes as a 200), counted
    as the engine's failure; with a peer, the request is retried there and served."""
    records: list[Any] = []
    async with fault_engine(FaultEngine(default=mode)) as only:
        config = make_config([ep(only, "only")], timeouts=TIMEOUTS)
        async with running_gateway(config, sinks=[records.append]) as gw, \
                aiohttp.ClientSession() as s:
            status, raw, _ = await post(s, gw, body())
            assert (status, error_of(raw)["code"]) == (502, "upstream_protocol_error"), raw
            assert (await endpoints(s, gw))["only"]["consecutive_failures"] == 1
    assert records[0].outcome == "failed"
    async with fault_engine(FaultEngine(script=[mode])) as bad, \
            fault_engine(FaultEngine()) as good:
        config = make_config([ep(bad, "bad"), ep(good, "good")], timeouts=TIMEOUTS,
                             routing={"policy": "round_robin"})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            for _ in range(2):
                status, raw, headers = await post(s, gw, body())
                assert served_by_good(status, raw, headers, False), raw
    assert bad.received[mode] == 1


async def test_only_clean_x_headers_reach_the_engine_and_only_so_many() -> None:
    """Client `x-*` headers with a control character or a non-ASCII byte are dropped; of the
    clean ones at most 16 go on; the request itself is served."""
    async with fault_engine(FaultEngine()) as eng:
        config = make_config([ep(eng)], timeouts=TIMEOUTS)
        async with running_gateway(config) as gw:
            port = int(gw.rsplit(":", 1)[1])
            payload = orjson.dumps(body())
            extra = [b"X-Trace: fine", b"x-ctl: a\x01b", b"x-high: caf\xc3\xa9",
                     *(b"x-many-%d: v" % i for i in range(200))]
            head = b"\r\n".join([b"POST /v1/completions HTTP/1.1", b"Host: 127.0.0.1",
                                 f"Authorization: Bearer {KEY_A}".encode(),
                                 b"Content-Type: application/json",
                                 b"Content-Length: %d" % len(payload), *extra])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(head + b"\r\n\r\n" + payload)
                status, _, raw, _ = await read_response(reader, 10, check_close=False)
            finally:
                writer.close()
    assert status == 200 and b"tok" in raw, raw
    sent = dict(eng.headers[0])
    forwarded = [k for k, _ in eng.headers[0] if k.startswith("x-") and k != "x-request-id"]
    assert sent.get("x-trace") == "fine"
    assert "x-ctl" not in sent and "x-high" not in sent
    assert len(forwarded) == 16, forwarded


@pytest.mark.parametrize("cancel", [True, False], ids=["cancelled", "seen-by-relay"])
async def test_a_client_that_leaves_does_not_end_the_engines_run_of_failures(
        cancel: bool) -> None:
    """Two 500s, then a client that leaves mid-stream (its handler cancelled, or the relay
    finding its socket gone): the engine's run of failures stays at 2 (the client's leaving
    says nothing of the engine); a served request ends it."""
    async with fault_engine(FaultEngine(itl_s=0.2)) as eng:
        config = make_config([ep(eng, "only")], timeouts=TIMEOUTS)
        async with running_gateway(config, front=cancel, handler_cancellation=cancel) as gw, \
                aiohttp.ClientSession() as s:
            for _ in range(2):
                status, _, _ = await post(s, gw, body(), {"x-fault": "500-text"})
                assert status == 500
            async with s.post(gw + "/v1/completions", data=orjson.dumps(body(True, 20)),
                              headers={"Content-Type": "application/json",
                                       "Authorization": f"Bearer {KEY_A}"}) as r:
                assert r.status == 200
                await r.content.readany()  # the first event, then leave
                r.close()

            async def settled() -> bool:
                return bool((await endpoints(s, gw))["only"]["inflight"] == 0)

            await wait_for(settled, 20, "the abandoned stream ended")
            assert (await endpoints(s, gw))["only"]["consecutive_failures"] == 2
            status, _, _ = await post(s, gw, body())
            assert status == 200
            assert (await endpoints(s, gw))["only"]["consecutive_failures"] == 0


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
@pytest.mark.parametrize("mode", ["trickle", "hang-mid"])
async def test_a_stream_cut_by_the_request_deadline_is_answered(mode: str, front: bool) -> None:
    """A streamed request that reaches `timeouts.total_s` (not the read timeout: the engine
    trickles, or stalls longer than the deadline allows) still gets an answer: a 504 JSON when
    no event had gone out (trickle: the head alone), else its last event is the
    `upstream_timeout` error and the chunked stream ends properly. (It used to be closed with
    nothing, or cut without the error event and the last chunk.) On a connection aiohttp
    serves the head goes out at once, so the trickle's answer is a 200 ending in the error."""
    async with fault_engine(FaultEngine(default=mode, trickle_s=0.2, hang_after=1)) as bad:
        config = make_config([ep(bad, "bad")],
                             timeouts={**TIMEOUTS, "read_s": 30, "total_s": 1.0})
        async with running_gateway(config, front=front) as gw, aiohttp.ClientSession() as s:
            status, raw, _ = await post(s, gw, body(stream=True), timeout_s=10)
    if mode == "trickle" and front:
        assert status == 504 and error_of(raw)["code"] == "upstream_timeout", (status, raw)
    else:
        assert status == 200, (status, raw)
        events = raw.strip().split(b"\n\n")
        assert (b"tok" in events[0]) == (mode == "hang-mid"), events
        assert error_of(events[-1][len(b"data: "):])["code"] == "upstream_timeout"


async def test_a_precision_the_pool_is_not_configured_at_is_a_refusal() -> None:
    """A client may ask for any precision its key allows (`x-wattgate-precision`,
    `model@precision`); one no endpoint of the pool is configured at is the client's mistake:
    400 `precision_not_served`, outcome refused, never 503 `no_healthy_endpoint` (a failure,
    with which any tenant could drive the error ratio up and page on-call at will). A
    configured precision whose endpoints are all unhealthy is still the gateway's 503."""
    records: list[Any] = []
    async with fault_engine(FaultEngine()) as a, \
            fault_engine(FaultEngine(health_ok=False)) as b:
        config = make_config([ep(a, "a"), ep(b, "b", precision="int4")], timeouts=TIMEOUTS,
                             outlier_detection={"panic_threshold_percent": 0})
        async with running_gateway(config, sinks=[records.append]) as gw, \
                aiohttp.ClientSession() as s:
            await wait_for(lambda: endpoints(s, gw), what="endpoints")
            await wait_for(lambda: _unhealthy(s, gw, "b"), what="b unhealthy")
            status, raw, _ = await post(s, gw, body(), headers={"x-wattgate-precision": "fp8"})
            assert (status, error_of(raw)["code"]) == (400, "precision_not_served"), raw
            status, raw, _ = await post(s, gw, {**body(), "model": "m@fp8"})
            assert (status, error_of(raw)["code"]) == (400, "precision_not_served"), raw
            status, raw, _ = await post(s, gw, body(), headers={"x-wattgate-precision": "int4"})
            assert (status, error_of(raw)["code"]) == (503, "no_healthy_endpoint"), raw
            await wait_for(lambda: len(records) >= 3, what="3 records")
    assert [(r.status, r.outcome) for r in records] == [
        ("precision_not_served", "refused"), ("precision_not_served", "refused"),
        ("no_healthy_endpoint", "failed")]


async def _unhealthy(s: aiohttp.ClientSession, gw: str, name: str) -> bool:
    return not (await endpoints(s, gw))[name]["healthy"]


async def test_clients_that_do_not_read_their_streams_do_not_eject_healthy_engines() -> None:
    """Slow readers: streams whose clients read nothing hold their engines back
    (back-pressure) until the request deadline. That is the client's doing: 408
    `client_too_slow` (refused, billed to its tenant), not `upstream_timeout` against the
    engine; it used to be, so a few such clients ejected healthy engines and had their work
    charged to the failed account."""
    records: list[Any] = []
    async with fault_engine(FaultEngine(tokens=40_000)) as a, \
            fault_engine(FaultEngine(tokens=40_000)) as b:
        config = make_config([ep(a, "a"), ep(b, "b")],
                             timeouts={**TIMEOUTS, "read_s": 1.0, "total_s": 1.5},
                             routing={"policy": "round_robin"},
                             outlier_detection={"consecutive_failures": 2})
        async with running_gateway(config, sinks=[records.append]) as gw, \
                aiohttp.ClientSession() as s:
            port = int(gw.rsplit(":", 1)[1])
            raw = orjson.dumps(body(stream=True, max_tokens=40_000))
            head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}"
                    f"\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n")
            writers = []
            for _ in range(6):
                _, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024)
                writer.write(head.encode() + raw)
                writer.transport.pause_reading()  # type: ignore[attr-defined]  # read nothing
                writers.append(writer)
            await wait_for(lambda: len(records) >= 6, timeout_s=20, what="6 records")
            rows = await endpoints(s, gw)
            for writer in writers:
                writer.transport.abort()
    assert {(r.status, r.outcome) for r in records} == {("client_too_slow", "refused")}, \
        [(r.status, r.outcome) for r in records]
    assert not is_ejected(rows["a"]) and not is_ejected(rows["b"]), rows
    assert rows["a"]["consecutive_failures"] == rows["b"]["consecutive_failures"] == 0
