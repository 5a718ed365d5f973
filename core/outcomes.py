"""How a request ended, in one table: the record's status string and the HTTP status.

The status string is `RequestRecord.status`, the access log's `status`, the ledger's
`status` column and the `status` label of `wattgate_requests_total` (one string, four
readers). Two families have no fixed row: a `WattgateError` the gateway raised ends a
request with the error's own `code` and HTTP status (`error_outcome`), and an engine's
4xx answer relayed to the client ends it as `upstream_http_<status>` (`engine_outcome`).

Every status falls in one of four classes (`outcome_class`), and every reader that counts
requests counts by class: the metrics' `outcome` label, the recording rules and alerts, the
dashboard, `wattgate report`, `/v1/usage`, the demo and the load generator's grading.

- served: the engine answered (`ok`).
- refused: the gateway said no by policy or validation (its 4xx: 401, 403, 404, 413, 415,
  429, ...), or the engine said the request itself is invalid (`upstream_http_4xx` but 429).
- failed: an engine or the gateway broke: 5xx, `upstream_http_429` (an engine out of
  capacity), `upstream_error_event` (an error after the client had its 200), timeouts,
  protocol errors.
- cancelled: the client left before the answer ended (`client_disconnected`, 499).

A stream's answer has ended for the client once the token event that carries a non-null
`finish_reason` (of every choice, with `n` > 1) was handed to its socket: whoever closes the
connection first after that, the request is `ok` (a client that reads no usage may stop
there, before `[DONE]`).

SLO attainment and goodput are over served and failed requests (a failure is a miss);
refusals and cancellations are counted apart; the error ratio is failed / (served + failed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, NamedTuple, Protocol

from core.vocab import Outcome, OutcomeClass

__all__ = ["OUTCOMES", "Outcome", "OutcomeClass", "OutcomeRow", "engine_outcome", "error_outcome",
           "outcome_class"]


class OutcomeRow(NamedTuple):
    """A row of the table; a tuple so that setting both fields is one unpacking."""

    status: str  # RequestRecord.status and the `status` metric label
    http_status: int  # what the client was answered (499: it closed before the answer ended)


OUTCOMES: Final[Mapping[Outcome, OutcomeRow]] = {
    # a client that closes after the whole answer reached it (the finish_reason event, the
    # usage chunk it asked for, or [DONE]) is `ok`, not `client_disconnected`: the outcome is
    # what the client got
    "ok": OutcomeRow("ok", 200),
    # nginx's code for a client that closed its connection before the answer ended
    "client_disconnected": OutcomeRow("client_disconnected", 499),
    # an exception the gateway did not raise on purpose (its trace is logged, not shown)
    "internal_error": OutcomeRow("internal_error", 500),
    # the stream reached its end but an SSE event carried the engine's error: the client
    # already has 200 and the events before it
    "upstream_error_event": OutcomeRow("upstream_error_event", 200),
}


class CodedError(Protocol):
    """What `error_outcome` reads of a `WattgateError` (a Protocol, so that this table imports
    nothing but the vocabulary and the load generator can grade by it)."""

    @property
    def code(self) -> str: ...

    @property
    def status(self) -> int: ...

    @property
    def from_engine(self) -> bool: ...


def error_outcome(exc: CodedError) -> OutcomeRow:
    """A request the gateway refused or failed on purpose: the error's code and status; an
    engine's error answer (its 5xx or 429, passed on when no other engine answered) as
    `upstream_http_<status>`, never the engine's own code (the status label stays bounded)."""
    if exc.from_engine:
        return engine_outcome(exc.status)
    return OutcomeRow(exc.code, exc.status)


def engine_outcome(http_status: int) -> OutcomeRow:
    """An engine's 4xx answer, relayed to the client with the engine's status."""
    return OutcomeRow(f"upstream_http_{http_status}", http_status)


ENGINE_BUSY_STATUS = "upstream_http_429"  # an engine out of capacity: its failure, not a refusal


def outcome_class(status: str, http_status: int) -> OutcomeClass:
    """The class of a request's ending, from its record status and HTTP status (table above)."""
    if status == "ok":
        return "served"
    if status == "client_disconnected":
        return "cancelled"
    if status == ENGINE_BUSY_STATUS or http_status >= 500 or http_status < 400:
        # below 400: a failure after the answer's head (the client already has 200)
        return "failed"
    return "refused"


def counts_for_slo(cls: OutcomeClass) -> bool:
    """Attainment, goodput and the error ratio are over served and failed requests."""
    return cls == "served" or cls == "failed"
