"""What a load run records: one timeline per request, and the live counters the progress line
reads."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


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
    status: str  # "ok", "http_<code>", "connect_error", "timeout", "stream_error", "cancelled"
    http_status: int
    request_id: str
    usage_reported: bool = True
    error: str = ""
    client_request_id: str = ""  # the x-request-id this client sent, if any

    @property
    def ok(self) -> bool:
        return self.status == "ok"

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
