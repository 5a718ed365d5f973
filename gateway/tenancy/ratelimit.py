"""Per-tenant rate limits as token buckets (pure; the clock is passed in).

Requests per second and per minute, and tokens per minute, each a bucket that holds at most
its limit and refills at limit / period. A request takes one from each request bucket and its
reserved tokens (prompt estimate + max_tokens) from the token bucket; when it ends the token
bucket is settled to the real count (refunded, or charged into debt, never above full).
With N live replicas each process enforces limit / N (its share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.tenancy.config import TenantLimits


@dataclass(slots=True)
class Bucket:
    limit: float  # the configured limit per period
    period_s: float
    level: float
    at_s: float
    share: float = 1.0  # this process's share of the limit (1 / live replicas): set_share
    # limit x share, its refill per second and its header text, kept as the share changes:
    # every admission reads them (as properties they were a fifth of its time)
    capacity: float = field(init=False, default=0.0)
    rate_per_s: float = field(init=False, default=0.0)
    limit_text: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.set_share(self.share)

    def set_share(self, share: float) -> None:
        self.share = share
        self.capacity = self.limit * share
        self.rate_per_s = self.capacity / self.period_s
        self.limit_text = f"{math.floor(self.capacity)}"
        self.level = min(self.level, self.capacity)

    def refill(self, now_s: float) -> None:
        # the level never exceeds the capacity, so a clock that has not moved changes nothing
        if now_s > self.at_s:
            self.level = min(self.capacity, self.level + (now_s - self.at_s) * self.rate_per_s)
            self.at_s = now_s

    def wait_s(self, amount: float) -> float:
        """Seconds until `amount` is there (0 now; inf when it never fits)."""
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.level) * self.period_s / self.capacity)

    def reset_s(self) -> float:
        """Seconds until the bucket is full again (OpenAI's `x-ratelimit-reset-*`)."""
        return max(0.0, (self.capacity - self.level) * self.period_s / self.capacity)


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str = ""  # "requests" or "tokens" when refused
    retry_after_s: float = 0.0  # inf: the request can never fit (bigger than the limit)


def duration_text(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1.0:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    if seconds < 60.0:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m{rest:.0f}s"


_ALLOWED = Verdict(True)


class TenantRateLimiter:
    """The buckets of one tenant in this process."""

    def __init__(self, limits: TenantLimits, now_s: float):
        def bucket(limit: float | None, period_s: float) -> Bucket | None:
            return None if limit is None else Bucket(limit, period_s, limit, now_s)

        self.rps = bucket(limits.requests_per_second, 1.0)
        self.rpm = bucket(limits.requests_per_minute, 60.0)
        self.tpm = bucket(limits.tokens_per_minute, 60.0)
        self._requests = tuple(b for b in (self.rps, self.rpm) if b is not None)
        # the headers' buckets: requests from the per-minute one (else the per-second one)
        req = self.rpm or self.rps
        self._headed = tuple((b, f"x-ratelimit-limit-{name}", f"x-ratelimit-remaining-{name}",
                              f"x-ratelimit-reset-{name}")
                             for name, b in (("requests", req), ("tokens", self.tpm))
                             if b is not None)

    def _buckets(self) -> list[Bucket]:
        return [b for b in (self.rps, self.rpm, self.tpm) if b is not None]

    def set_share(self, share: float) -> None:
        for b in self._buckets():
            b.set_share(share)

    def take(self, now_s: float, tokens: int) -> Verdict:
        """Take one request and `tokens` tokens if all buckets allow, else nothing. Refused:
        the bucket with the longest wait says why (tokens, where they wait as long)."""
        wait, reason = 0.0, ""
        for b in self._requests:
            b.refill(now_s)
            w = b.wait_s(1.0)
            if w > wait:
                wait, reason = w, "requests"
        tpm = self.tpm
        if tpm is not None:
            tpm.refill(now_s)
            w = tpm.wait_s(float(tokens))
            if w > 0.0 and w >= wait:
                wait, reason = w, "tokens"
        if wait > 0.0:
            return Verdict(False, reason, wait)
        for b in self._requests:
            b.level -= 1.0
        if tpm is not None:
            tpm.level -= tokens
        return _ALLOWED

    def settle(self, reserved: int, used: int) -> None:
        """The request used `used` tokens of the `reserved` it took."""
        if self.tpm is not None:
            self.tpm.level = min(self.tpm.capacity, self.tpm.level + reserved - used)

    def headers(self, now_s: float) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` headers: requests from the per-minute bucket (else the
        per-second one), tokens from the per-minute token bucket."""
        out: dict[str, str] = {}
        for b, limit, remaining, reset in self._headed:
            b.refill(now_s)
            out[limit] = b.limit_text
            out[remaining] = f"{max(0, math.floor(b.level))}"
            out[reset] = duration_text(b.reset_s())
        return out
