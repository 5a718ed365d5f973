"""What a load run records: one timeline per request, and the live counters the progress line
reads; and how a request ended, graded by the gateway's own outcome classes
(core/outcomes.py) from what its client saw."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson

from core.outcomes import engine_outcome, outcome_class
from core.vocab import OutcomeClass


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One request's timeline; times are seconds from the run's t0 on the monotonic clock."""

    index: int
    tenant: str
    slo_class: str
    intended_s: float
    sent_s: float
    first_token_s: float | None
    end_s: float
    reads: tuple[tuple[float, int], ...]  # (time, token-bearing events completed by that read)
    prompt_tokens: int
    completion_tokens: int
    # "ok", "http_<code>", "connect_error" (no answer), "timeout", "stream_error" (an error
    # event, no token, or the answer cut off), "cancelled"
    status: str
    http_status: int
    request_id: str
    usage_reported: bool = True
    error: str = ""
    client_request_id: str = ""  # the x-request-id this client sent, if any
    # an error answer's status as the gateway recorded it (`answer_status`); "" otherwise
    code: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def outcome(self) -> OutcomeClass:
        return client_outcome(self.status, self.http_status, self.code)

    @property
    def lag_s(self) -> float:
        return self.sent_s - self.intended_s


@dataclass(slots=True)
class Progress:
    """Live counters the progress reporter reads (I/O shell state, not a result)."""

    planned: int = 0
    sent: int = 0
    done: int = 0
    ok: int = 0
    start_s: float = field(default_factory=time.monotonic)


def answer_status(http_status: int, body: bytes, by_gateway: bool) -> str:
    """The status the gateway recorded for an error answer, as its client can tell it.

    The gateway's own answer (`by_gateway`: it carries `x-wattgate-request-id` but no
    `x-wattgate-endpoint`) names it in the error's `code` (`budget_exceeded`,
    `invalid_api_key`, `upstream_timeout`, ...). An engine's answer, relayed (with
    `x-wattgate-endpoint`) or met directly, is `upstream_http_<status>` whatever code the
    engine gave: an engine's 429 is its failure, not a refusal."""
    if by_gateway:
        code = error_code(body)
        if code:
            return code
    return engine_outcome(http_status).status


def error_code(body: bytes) -> str:
    """The string `code` of an OpenAI-style error body, or ""."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    err = doc.get("error") if isinstance(doc, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else ""


def client_outcome(status: str, http_status: int, code: str) -> OutcomeClass:
    """served, refused, failed or cancelled (core/outcomes.py) from the client's side:
    an HTTP error by the gateway's status for it (`code`); no answer or a broken one
    (timeout, connect error, an error event in the stream) is a failure; a request this
    client gave up on when the run's deadline passed is cancelled."""
    if status == "ok":
        return "served"
    if status == "cancelled":
        return "cancelled"
    if status.startswith("http_"):
        return outcome_class(code or engine_outcome(http_status).status, http_status)
    return "failed"
