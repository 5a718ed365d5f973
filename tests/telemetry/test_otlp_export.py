"""OpenTelemetry export of a real `wattgate serve` process to an in-process OTLP/HTTP
receiver: the GenAI metrics arrive with the values the requests had, and each request's trace
holds its admission, routing, engine and relay spans, the engine span being the one named by
the `traceparent` the engine received (a client's own traceparent continued)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from core.trace_context import parse_traceparent
from tests.faults.helpers import body, ep, gateway_process, post, wait_for, write_config
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.otlp_receiver import Received, attributes, otlp_receiver

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
pytestmark = pytest.mark.timeout(120)

CLIENT_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CLIENT_SPAN = 0x00F067AA0BA902B7
SPAN_NAMES = {"admission", "routing", "engine", "relay"}


def spans_of(got: Received, trace_id: int) -> dict[str, Any]:
    """name -> span of one trace (each name once per request here: no retries)."""
    return {s.name: s for s in got.spans if int.from_bytes(s.trace_id, "big") == trace_id}


def latest_points(got: Received, name: str) -> list[Any]:
    """The data points of the last export of metric `name` (cumulative: the totals)."""
    batches = [m for m in got.metrics if m.name == name]
    return list(batches[-1].histogram.data_points) if batches else []


def check_trace(got: Received, engine_header: str, operation: str,
                client_span: int | None) -> None:
    """The request's five spans: one trace, the engine span's id the one the engine got,
    every span inside the server span and in request order."""
    parsed = parse_traceparent(engine_header)
    assert parsed is not None, engine_header
    trace_id, engine_span_id, sampled = parsed
    assert sampled
    spans = spans_of(got, trace_id)
    root = spans[f"{operation} m"]
    assert set(spans) == {root.name, *SPAN_NAMES}
    engine = spans["engine"]
    assert int.from_bytes(engine.span_id, "big") == engine_span_id
    assert root.parent_span_id == (b"" if client_span is None else client_span.to_bytes(8, "big"))
    for name in SPAN_NAMES:
        span = spans[name]
        assert span.parent_span_id == root.span_id
        assert root.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano
        assert span.end_time_unix_nano <= root.end_time_unix_nano
    assert spans["admission"].end_time_unix_nano <= spans["routing"].start_time_unix_nano
    assert spans["routing"].end_time_unix_nano <= engine.start_time_unix_nano
    assert engine.start_time_unix_nano <= spans["relay"].start_time_unix_nano
    assert attributes(engine.attributes)["server.port"] > 0
    assert attributes(root.attributes)["gen_ai.usage.output_tokens"] == 4


def check_metrics(got: Received) -> None:
    """Two served requests of 4 output tokens each and one refused (bad key)."""
    usage = latest_points(got, "gen_ai.client.token.usage")
    by_type = {attributes(p.attributes)["gen_ai.token.type"]: p for p in usage
               if attributes(p.attributes)["gen_ai.operation.name"] == "chat"}
    assert by_type["output"].count == 1 and by_type["output"].sum == 4
    assert by_type["input"].count == 1 and by_type["input"].sum > 0
    ops = {attributes(p.attributes)["gen_ai.operation.name"] for p in usage}
    assert ops == {"chat", "text_completion"}
    for p in usage:
        a = attributes(p.attributes)
        assert a["gen_ai.provider.name"] == "vllm" and a["server.address"] == "127.0.0.1"
        assert a["gen_ai.request.model"] == "m"
    durations = latest_points(got, "gen_ai.server.request.duration")
    assert sum(p.count for p in durations) == 3
    refused = [attributes(p.attributes) for p in durations
               if "error.type" in attributes(p.attributes)]
    assert len(refused) == 1 and refused[0]["wattgate.outcome"] == "refused"
    ttft = latest_points(got, "gen_ai.server.time_to_first_token")
    tpot = latest_points(got, "gen_ai.server.time_per_output_token")
    # TPOT needs token times: the streamed request's only (a whole answer has none)
    assert sum(p.count for p in ttft) == 2 and sum(p.count for p in tpot) == 1
    # the engine waits itl_s between tokens: TPOT is at least that, TTFT under the duration
    assert all(p.sum / p.count >= 0.02 for p in tpot)
    served_s = sum(p.sum for p in durations if "error.type" not in attributes(p.attributes))
    assert 0 < sum(p.sum for p in ttft) < served_s


async def test_metrics_and_traces_reach_an_otlp_receiver(tmp_path: Path) -> None:
    """A streamed chat request carrying a client traceparent and a plain completion: their
    traces and the GenAI metrics arrive; the engine span is the one the engine was told of."""
    engine = FaultEngine(itl_s=0.03)
    async with fault_engine(engine), otlp_receiver() as (otlp_url, got):
        config, port = write_config(tmp_path, [ep(engine)], telemetry={
            "otlp_endpoint": otlp_url, "service_name": "wattgate-test",
            "export_interval_s": 0.3})
        with gateway_process(config, port, tmp_path / "gw.log") as gw:
            async with aiohttp.ClientSession() as s:
                client = f"00-{CLIENT_TRACE:032x}-{CLIENT_SPAN:016x}-01"
                chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4, "stream": True}
                status, _, _ = await post(s, gw, chat, {"traceparent": client},
                                          path="/v1/chat/completions")
                assert status == 200
                status, _, _ = await post(s, gw, body())
                assert status == 200
                status, _, _ = await post(s, gw, body(), {"Authorization": "Bearer sk-wrong"})
                assert status == 401
                chat_header, plain_header = engine.traceparents
                assert parse_traceparent(chat_header) is not None
                assert parse_traceparent(chat_header)[0] == CLIENT_TRACE  # type: ignore[index]

                def arrived() -> bool:
                    ids = {int.from_bytes(sp.trace_id, "big") for sp in got.spans
                           if sp.name == "engine"}
                    durations = latest_points(got, "gen_ai.server.request.duration")
                    return ({parse_traceparent(h)[0] for h in engine.traceparents  # type: ignore[index]
                             } <= ids and sum(p.count for p in durations) == 3)

                await wait_for(arrived, 30.0, "spans and metrics at the receiver")
    check_trace(got, chat_header, "chat", CLIENT_SPAN)
    check_trace(got, plain_header, "text_completion", None)
    check_metrics(got)
    assert {"service.name": "wattgate-test"}.items() <= got.resources[0].items()
