"""The request's trace context (W3C traceparent in and out, sampling) and the spans built
from a finished record, without the OpenTelemetry packages (pure code)."""

from __future__ import annotations

import itertools

import pytest

from core.records import RequestRecord
from core.timing import latency
from core.trace_context import (
    TraceStarter,
    format_traceparent,
    parse_traceparent,
)
from gateway.telemetry.spans import EngineInfo, engine_infos, request_spans

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def counting_bits() -> itertools.count[int]:
    return itertools.count(1)


def starter(**kw: object) -> TraceStarter:
    ids = counting_bits()
    args: dict[str, object] = {"traces": True, "sample_ratio": 1.0, **kw}
    return TraceStarter(bits=lambda _n: next(ids), **args)  # type: ignore[arg-type]


def test_parse_traceparent_accepts_valid_and_future_versions() -> None:
    assert parse_traceparent(VALID) == (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7,
                                        True)
    # a later version may carry more fields; its first four are read as version 00's
    assert parse_traceparent(VALID.replace("00-", "01-", 1) + "-extra") is not None
    assert parse_traceparent(VALID[:-2] + "00") is not None
    assert parse_traceparent(VALID[:-2] + "00")[2] is False  # type: ignore[index]


@pytest.mark.parametrize("bad", [
    None, "", "garbage", VALID.upper(), VALID + "-extra",  # version 00 has exactly 4 fields
    "ff" + VALID[2:], "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # version ff, zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",  # zero span id
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
])
def test_parse_traceparent_refuses_invalid(bad: str | None) -> None:
    assert parse_traceparent(bad) is None


def test_a_client_traceparent_is_continued_and_the_engine_gets_a_new_span() -> None:
    trace = starter().begin("/v1/chat/completions", VALID)
    assert trace.operation == "chat"
    assert trace.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
    assert trace.parent_span_id == 0x00F067AA0BA902B7
    (name, value), = trace.engine_headers()
    assert name == "traceparent"
    assert value == format_traceparent(trace.trace_id, trace.engine_span_id or 0, True)
    first = trace.engine_span_id
    trace.engine_headers()  # a retry: its own span
    assert trace.engine_span_id not in (first, trace.root_span_id)


def test_sampling_a_new_trace_and_no_propagation_without_traces() -> None:
    unsampled = starter(sample_ratio=0.0).begin("/v1/completions", None)
    assert unsampled.parent_span_id is None and not unsampled.sampled
    (_, value), = unsampled.engine_headers()
    assert value.endswith("-00")  # still propagated, marked not sampled
    # a client's sampled flag decides for its own trace, whatever the ratio
    assert starter(sample_ratio=0.0).begin("/v1/completions", VALID).sampled
    metrics_only = starter(traces=False).begin("/v1/completions", VALID)
    assert metrics_only.engine_headers() == [] and not metrics_only.sampled


def record(status: str = "ok", http_status: int = 200, dispatched: bool = True) -> RequestRecord:
    reads = (0.30, 0.32, 0.34) if dispatched else ()
    lat = latency(0.0, tuple((t, 1) for t in reads), len(reads), reads[-1] if reads else None)
    return RequestRecord(
        request_id="r1", tenant="acme", model="m", engine="e1" if dispatched else "",
        precision="bf16", slo_class="interactive", status=status, http_status=http_status,
        stream=True, arrived_wall_s=1000.0, arrived_s=0.0,
        dispatched_s=0.1 if dispatched else None, first_byte_s=0.2 if dispatched else None,
        first_token_s=reads[0] if reads else None, finished_s=0.4 if dispatched else 0.01,
        read_times=reads, read_events=tuple(1 for _ in reads), prompt_tokens=10,
        completion_tokens=len(reads), attempts=1, latency=lat, slo_met=True)


ENGINES = engine_infos({"e1": ("vllm", "http://10.0.0.7:8000")})


def test_a_served_request_has_its_five_spans_in_order() -> None:
    trace = starter().begin("/v1/completions", None)
    trace.admitted_s = 0.05
    trace.engine_headers()
    spans = {s.name: s for s in request_spans(record(), trace, ENGINES["e1"], lambda _n: 99)}
    assert list(spans) == ["text_completion m", "admission", "routing", "engine", "relay"]
    root, engine = spans["text_completion m"], spans["engine"]
    assert engine.span_id == trace.engine_span_id and engine.kind == "client"
    assert engine.attributes["server.address"] == "10.0.0.7"
    assert engine.attributes["server.port"] == 8000
    assert (root.start_s, spans["admission"].end_s, spans["routing"].end_s, engine.start_s,
            spans["relay"].start_s, root.end_s) == pytest.approx(
        (1000.0, 1000.05, 1000.1, 1000.1, 1000.2, 1000.4))
    assert all(s.error is None for s in spans.values())
    assert all(s.parent_id == root.span_id for s in spans.values() if s is not root)


def test_a_refused_request_has_a_failed_admission_and_nothing_after() -> None:
    trace = starter().begin("/v1/completions", VALID)
    spans = request_spans(record("invalid_api_key", 401, dispatched=False), trace, None,
                          lambda _n: 99)
    assert [s.name for s in spans] == ["text_completion m", "admission"]
    assert spans[0].parent_id == 0x00F067AA0BA902B7
    assert spans[0].attributes["error.type"] == "invalid_api_key"
    assert spans[1].error == "invalid_api_key"
    assert spans[0].attributes["wattgate.outcome"] == "refused"


def test_an_unsampled_trace_has_no_spans() -> None:
    trace = starter(sample_ratio=0.0).begin("/v1/completions", None)
    assert request_spans(record(), trace, EngineInfo("vllm", "h", 1), lambda _n: 99) == []
