"""One request while it is served: its timeline, tokens and outcome, written by each step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.codec import MAX_TOKENS
from core.outcomes import OUTCOMES, Outcome, engine_outcome, error_outcome
from core.vocab import PromptSource

if TYPE_CHECKING:
    from core.errors import WattgateError
    from core.trace_context import RequestTrace
    from gateway.config import Tenant
    from gateway.tenancy.admission import Ticket
    from gateway.upstreams import EndpointState

REQUEST_ID_HEADER = "x-wattgate-request-id"
# Token events of one engine step reach the gateway within a few milliseconds of each other
# (30 first tokens of one step: 3 ms); an engine's steps are 7 ms or more apart.
STEP_GAP_S = 0.003


MAX_TOKEN_COUNT = MAX_TOKENS  # an engine's usage past this is its error, not a count


def token_count(v: Any) -> int:
    """An engine's token count as the ledger can store it: 0 for what is not a number (or
    negative), at most MAX_TOKEN_COUNT (an unbounded integer would not fit the ledger's
    columns nor the accounting child's frames)."""
    try:
        n = int(v or 0)
    except (TypeError, ValueError, OverflowError):
        return 0
    return min(max(n, 0), MAX_TOKEN_COUNT)


class Flight:
    """Mutable timeline and outcome of one request while it is served."""

    __slots__ = ("arrived_s", "arrived_wall_s", "attempts", "body", "completion_tokens",
                 "delivered", "dispatched_s", "endpoint", "engine_done_s", "engine_failed",
                 "first_byte_s", "first_token_s", "http_status", "model", "prompt_source",
                 "prompt_tokens", "read_events", "read_times", "request_id", "slo_class",
                 "status", "step_from_s", "stream", "tenant", "tenant_config", "ticket",
                 "trace", "upstream_status", "usage_known")

    def __init__(self, request_id: str, arrived_s: float, arrived_wall_s: float, slo_class: str):
        self.request_id = request_id
        self.arrived_s = arrived_s
        self.arrived_wall_s = arrived_wall_s
        self.tenant = "unauthenticated"
        self.tenant_config: Tenant | None = None  # set by admit once the key is known
        self.model = "unknown"
        self.slo_class = slo_class
        self.stream = False
        self.endpoint: EndpointState | None = None
        self.dispatched_s: float | None = None
        self.first_byte_s: float | None = None
        self.first_token_s: float | None = None
        # the engine's last token event of the step before its first token's (a prompt that
        # shares that step with others is read from there, accounting/work.py)
        self.step_from_s: float | None = None
        self.read_times: list[float] = []
        self.read_events: list[int] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.prompt_source: PromptSource = "engine"
        self.usage_known = False  # the engine's usage arrived
        self.body: dict[str, Any] | None = None  # the parsed request, to count its prompt
        self.upstream_status: int | None = None
        self.engine_done_s: float | None = None
        # The client got the whole answer (the token event with the `finish_reason`, the
        # final usage chunk it asked for, or [DONE] was handed to its socket): whoever closes
        # first after that, the request is `ok`.
        self.delivered = False
        self.engine_failed = False  # the engine broke the response (outlier detection counts it)
        self.attempts = 0
        self.status, self.http_status = OUTCOMES["ok"]
        self.ticket: Ticket | None = None  # what tenant controls hold for it
        self.trace: RequestTrace | None = None  # set by the proxy when telemetry is on

    def take_usage(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens = token_count(usage.get("prompt_tokens"))
        self.completion_tokens = token_count(usage.get("completion_tokens"))
        self.usage_known = True

    def needs_prompt_count(self) -> bool:
        """The engine may have read the prompt but its usage never came (client disconnect,
        engine failure, timeout, or an engine that reports none): the gateway counts it."""
        return (not self.usage_known and self.body is not None and self.dispatched_s is not None
                and self.upstream_status in (None, 200))

    def token_read(self, now: float, tokens: int) -> None:
        """One engine read that carried `tokens` token-bearing events, at `now`. Events more
        than STEP_GAP_S after the engine's last one begin a new step."""
        ep = self.endpoint
        if ep is not None:
            if now - ep.last_token_s > STEP_GAP_S:
                ep.step_end_s = ep.last_token_s
            ep.last_token_s = now
        if self.first_token_s is None:
            self.first_token_s = now
            if ep is not None and ep.step_end_s > 0.0:
                self.step_from_s = ep.step_end_s
        self.read_times.append(now)
        self.read_events.append(tokens)

    def end(self, outcome: Outcome) -> None:
        """The request ended as one of the fixed outcomes (core/outcomes.py)."""
        self.status, self.http_status = OUTCOMES[outcome]

    def client_gone(self) -> None:
        """The client closed its connection: `client_disconnected`, unless the whole answer
        had already reached it (then it stays `ok`)."""
        if not self.delivered:
            self.status, self.http_status = OUTCOMES["client_disconnected"]

    def fail(self, exc: WattgateError) -> None:
        """The gateway raised `exc` for it: the error's code and HTTP status."""
        self.status, self.http_status = error_outcome(exc)

    def engine_refused(self, http_status: int) -> None:
        """The engine's own 4xx answer was relayed to the client."""
        self.status, self.http_status = engine_outcome(http_status)

    def response_headers(self) -> dict[str, str]:
        """The gateway's headers on the client's answer: its request id, the tenant
        controls' headers, and the endpoint and precision that served it."""
        headers = {REQUEST_ID_HEADER: self.request_id}
        if self.ticket is not None:
            headers.update(self.ticket.headers)
        ep = self.endpoint
        if ep is not None:
            headers["x-wattgate-endpoint"] = ep.endpoint.name
            headers["x-wattgate-precision"] = ep.endpoint.precision
        return headers
