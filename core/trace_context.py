"""One request's W3C trace context, carried while it is served (only when telemetry is on).

The proxy starts it when the request arrives: it continues the client's `traceparent` (its
trace id, its span as the parent, its sampled flag) or starts a new trace, sampled at
`sample_ratio`. Dispatch asks it for the `traceparent` each engine attempt gets, which names a
fresh engine span id; the spans themselves are built after the request from its record, with
these same ids (gateway/telemetry/spans.py), so the engine's spans join the gateway's trace. Pure: the random
source is passed in.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

TRACEPARENT = "traceparent"
# the GenAI operation (gen_ai.operation.name) of each completion route
OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion",
              "/v1/embeddings": "embeddings"}
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_SAMPLED = 0x01


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a W3C `traceparent`; None where it is absent or
    invalid (a new trace starts then, as the W3C Trace Context says)."""
    if not value:
        return None
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = m.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, bool(int(flags_hex, 16) & _SAMPLED)


def format_traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{_SAMPLED if sampled else 0:02x}"


class RequestTrace:
    """Trace ids and the one extra timestamp (admitted) a request's spans need."""

    __slots__ = ("_bits", "admitted_s", "engine_span_id", "operation", "parent_span_id",
                 "propagate", "root_span_id", "sampled", "trace_id")

    def __init__(self, operation: str, trace_id: int, parent_span_id: int | None, sampled: bool,
                 *, propagate: bool, bits: Callable[[int], int]):
        """`propagate`: traces are exported, so the engine gets a `traceparent`."""
        self.operation = operation
        self.trace_id = trace_id
        self.parent_span_id = parent_span_id  # the client's span, None for a new trace
        self.sampled = sampled
        self.propagate = propagate
        self._bits = bits
        self.root_span_id = _span_id(bits)  # the gateway's server span
        self.engine_span_id: int | None = None  # the last engine attempt's span
        self.admitted_s: float | None = None  # monotonic: admission done, routing starts

    def engine_headers(self) -> list[tuple[str, str]]:
        """The headers for one engine attempt: its `traceparent`, naming a new engine span
        (none when traces are not exported)."""
        if not self.propagate:
            return []
        self.engine_span_id = span = _span_id(self._bits)
        return [(TRACEPARENT, format_traceparent(self.trace_id, span, self.sampled))]


class TraceStarter:
    """Starts each request's `RequestTrace` (the proxy holds one when telemetry is on)."""

    __slots__ = ("_bits", "_uniform", "sample_ratio", "traces")

    def __init__(self, *, traces: bool, sample_ratio: float,
                 bits: Callable[[int], int] = random.getrandbits,
                 uniform: Callable[[], float] = random.random):
        self.traces = traces
        self.sample_ratio = sample_ratio
        self._bits = bits
        self._uniform = uniform

    def begin(self, path: str, traceparent: str | None) -> RequestTrace:
        """The trace of a request to `path` whose client sent `traceparent` (or None)."""
        operation = OPERATIONS.get(path, "text_completion")
        parent = parse_traceparent(traceparent) if self.traces else None
        if parent is not None:
            trace_id, parent_id, sampled = parent
        else:
            trace_id = (self._bits(128) or 1) if self.traces else 0
            parent_id = None
            sampled = self.traces and self._uniform() < self.sample_ratio
        return RequestTrace(operation, trace_id, parent_id, sampled, propagate=self.traces,
                            bits=self._bits)


def _span_id(bits: Callable[[int], int]) -> int:
    return bits(64) or 1  # 0 is the invalid span id
