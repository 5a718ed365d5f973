"""The record every finished request emits; it feeds Prometheus and the accounting service.

Durations use the monotonic clock (seconds); `arrived_wall_s` anchors them to wall-clock time
for the ledger and the interval grid: wall(t) = arrived_wall_s + (t - arrived_s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from core.outcomes import outcome_class
from core.timing import Latency
from core.vocab import OutcomeClass, Precision, PromptSource, value_type

if TYPE_CHECKING:
    from core.trace_context import RequestTrace


@value_type
class RequestRecord:
    request_id: str
    tenant: str
    model: str
    engine: str  # endpoint name; "" when no endpoint was chosen
    precision: Precision | Literal[""]  # "" when no endpoint was chosen
    slo_class: str
    status: str  # how it ended (core/outcomes.py): "ok", or e.g. "upstream_timeout"
    http_status: int
    stream: bool
    arrived_wall_s: float
    arrived_s: float
    dispatched_s: float | None  # last upstream attempt sent
    first_byte_s: float | None
    first_token_s: float | None
    finished_s: float
    # Per engine read that carried tokens, in order: its monotonic time and its token-bearing
    # events (>= 1: reads without a token event are not kept). Two columns, not pairs: the hot
    # path appends to two lists, and the interval grid bisects the times and sums the events at
    # C speed.
    read_times: tuple[float, ...]
    read_events: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    attempts: int
    latency: Latency
    slo_met: bool
    # How prompt_tokens was counted: "engine" (its usage), "gateway" (the model's tokenizer, for
    # a request that ended before the engine's usage came) or "estimate" (no tokenizer: bytes/4)
    prompt_source: PromptSource = "engine"
    # The engine said it had finished (monotonic): a non-streamed response's head, which the
    # engine sends once the whole body is ready. None for streams (their last token event
    # marks it) and for requests that never got an answer.
    engine_done_s: float | None = None
    # The engine's last token event (monotonic), as this process relayed them, of the step
    # before the one that emitted this request's first token: where a prompt that shared its
    # step with others began to be read (accounting/work.py). None: no event before it, or no
    # token event.
    step_from_s: float | None = None
    # Its trace ids when telemetry is on (gateway/telemetry): the request's own process
    # exports its spans; the journal and the accounting child do not carry it.
    trace: RequestTrace | None = None

    @property
    def outcome(self) -> OutcomeClass:
        """served, refused, failed or cancelled (core/outcomes.py)."""
        return outcome_class(self.status, self.http_status)

    @property
    def token_events(self) -> int:
        """Token events relayed (every SSE event with a non-empty `choices` list)."""
        return sum(self.read_events)

    def wall(self, t_s: float) -> float:
        """Wall-clock seconds of a monotonic timestamp of this request."""
        return self.arrived_wall_s + (t_s - self.arrived_s)

    @property
    def gateway_queue_s(self) -> float | None:
        """Time spent in the gateway before the (last) upstream dispatch."""
        return None if self.dispatched_s is None else self.dispatched_s - self.arrived_s

    @property
    def upstream_s(self) -> float | None:
        """Time from dispatch to the end of the response."""
        return None if self.dispatched_s is None else self.finished_s - self.dispatched_s
