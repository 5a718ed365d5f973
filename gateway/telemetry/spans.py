"""The spans of one finished request, built from its record after the fact (pure).

A request's timestamps (arrived, admitted, dispatched, first byte, finished; monotonic)
become spans with explicit start and end times, so tracing costs the request path nothing
but the ids chosen at dispatch:

    <operation> <model>   SERVER    arrived -> finished   (parent: the client's span, if any)
      admission           INTERNAL  arrived -> admitted (or finished, when refused there)
      routing             INTERNAL  admitted -> dispatched (or finished, when none answered)
      engine              CLIENT    dispatched -> finished; its id is the one the engine got
      relay               INTERNAL  first byte -> finished

With retries, `dispatched` is the last attempt's and the engine span is that attempt's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from core.records import RequestRecord
from core.trace_context import RequestTrace

SpanKindName = Literal["server", "client", "internal"]
AttrValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the spans and metrics say of an endpoint (from its config)."""

    provider: str  # gen_ai.provider.name: the engine kind ("vllm", "trtllm", "openai")
    address: str  # server.address
    port: int  # server.port


@dataclass(frozen=True, slots=True)
class SpanPlan:
    name: str
    span_id: int
    parent_id: int | None
    start_s: float  # wall clock
    end_s: float
    kind: SpanKindName
    attributes: dict[str, AttrValue]
    error: str | None = None  # error.type: the span ended in error


def base_attributes(rec: RequestRecord, operation: str,
                    engine: EngineInfo | None) -> dict[str, AttrValue]:
    """The GenAI attributes of a request's metrics and server span: operation, model,
    provider and address of the engine that served it, `error.type` (its status) unless it
    was served, and its outcome class (bounded values only)."""
    attrs: dict[str, AttrValue] = {"gen_ai.operation.name": operation,
                                   "gen_ai.request.model": rec.model,
                                   "wattgate.outcome": rec.outcome}
    if engine is not None:
        attrs["gen_ai.provider.name"] = engine.provider
        attrs["server.address"] = engine.address
        attrs["server.port"] = engine.port
    if rec.status != "ok":
        attrs["error.type"] = rec.status
    return attrs


def request_spans(rec: RequestRecord, trace: RequestTrace, engine: EngineInfo | None,
                  bits: Callable[[int], int]) -> list[SpanPlan]:
    """The spans of `rec` (none when its trace is not sampled); `bits` draws the span ids
    that nobody saw before (admission, routing, relay)."""
    if not trace.sampled:
        return []
    error = None if rec.status == "ok" else rec.status
    root = trace.root_span_id
    attrs = base_attributes(rec, trace.operation, engine)
    attrs.update({"wattgate.request_id": rec.request_id, "wattgate.tenant": rec.tenant,
                  "wattgate.slo_class": rec.slo_class, "wattgate.attempts": rec.attempts,
                  "http.response.status_code": rec.http_status,
                  "gen_ai.usage.input_tokens": rec.prompt_tokens,
                  "gen_ai.usage.output_tokens": rec.completion_tokens})
    wall = rec.wall
    spans = [SpanPlan(f"{trace.operation} {rec.model}", root, trace.parent_span_id,
                      wall(rec.arrived_s), wall(rec.finished_s), "server", attrs, error)]
    admitted = trace.admitted_s
    spans.append(SpanPlan("admission", _id(bits), root, wall(rec.arrived_s),
                          wall(rec.finished_s if admitted is None else admitted), "internal",
                          {"wattgate.tenant": rec.tenant}, error if admitted is None else None))
    if admitted is None:
        return spans
    dispatched = rec.dispatched_s
    spans.append(SpanPlan("routing", _id(bits), root, wall(admitted),
                          wall(rec.finished_s if dispatched is None else dispatched), "internal",
                          {"wattgate.attempts": rec.attempts},
                          error if dispatched is None else None))
    if dispatched is not None and trace.engine_span_id is not None:
        engine_attrs: dict[str, AttrValue] = {"wattgate.engine": rec.engine,
                                              "wattgate.precision": rec.precision}
        if engine is not None:
            engine_attrs.update({"server.address": engine.address, "server.port": engine.port,
                                 "gen_ai.provider.name": engine.provider})
        spans.append(SpanPlan("engine", trace.engine_span_id, root, wall(dispatched),
                              wall(rec.finished_s), "client", engine_attrs, error))
    if rec.first_byte_s is not None:
        spans.append(SpanPlan("relay", _id(bits), root, wall(rec.first_byte_s),
                              wall(rec.finished_s), "internal",
                              {"wattgate.stream": rec.stream,
                               "wattgate.token_events": rec.token_events}, error))
    return spans


def engine_infos(endpoints: Mapping[str, tuple[str, str]]) -> dict[str, EngineInfo]:
    """Endpoint name -> EngineInfo, from each endpoint's (kind, url)."""
    out = {}
    for name, (kind, url) in endpoints.items():
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        out[name] = EngineInfo(kind, parts.hostname or "", port)
    return out


def _id(bits: Callable[[int], int]) -> int:
    return bits(64) or 1
