"""Per-tenant rate limits as token buckets (pure; the clock is passed in).

Requests per second and per minute, and tokens per minute, each a bucket that holds at most
its limit and refills at limit / period. A request takes one from each request bucket and its
reserved tokens (prompt estimate + max_tokens) from the token bucket; when it ends the token
bucket is settled to the real count (refunded, or charged into debt, never above full).
With N live replicas each process enforces limit / N (its share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.tenancy.config import TenantLimits


@dataclass(slots=True)
class Bucket:
    limit: float  # the configured limit per period
    period_s: float
    level: float
    at_s: float
    share: float = 1.0  # this process's share of the limit (1 / live replicas)

    @property
    def capacity(self) -> float:
        return self.limit * self.share

    def refill(self, now_s: float) -> None:
        rate = self.capacity / self.period_s
        self.level = min(self.capacity, self.level + max(0.0, now_s - self.at_s) * rate)
        self.at_s = max(self.at_s, now_s)

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


class TenantRateLimiter:
    """The buckets of one tenant in this process."""

    def __init__(self, limits: TenantLimits, now_s: float):
        def bucket(limit: float | None, period_s: float) -> Bucket | None:
            return None if limit is None else Bucket(limit, period_s, limit, now_s)

        self.rps = bucket(limits.requests_per_second, 1.0)
        self.rpm = bucket(limits.requests_per_minute, 60.0)
        self.tpm = bucket(limits.tokens_per_minute, 60.0)

    def _buckets(self) -> list[Bucket]:
        return [b for b in (self.rps, self.rpm, self.tpm) if b is not None]

    def set_share(self, share: float) -> None:
        for b in self._buckets():
            b.share = share
            b.level = min(b.level, b.capacity)

    def take(self, now_s: float, tokens: int) -> Verdict:
        """Take one request and `tokens` tokens if all buckets allow, else nothing."""
        for b in self._buckets():
            b.refill(now_s)
        waits = [(b.wait_s(1.0), "requests") for b in (self.rps, self.rpm) if b is not None]
        if self.tpm is not None:
            waits.append((self.tpm.wait_s(float(tokens)), "tokens"))
        worst = max(waits, default=(0.0, ""))
        if worst[0] > 0.0:
            return Verdict(False, worst[1], worst[0])
        for req in (self.rps, self.rpm):
            if req is not None:
                req.level -= 1.0
        if self.tpm is not None:
            self.tpm.level -= tokens
        return Verdict(True)

    def settle(self, reserved: int, used: int) -> None:
        """The request used `used` tokens of the `reserved` it took."""
        if self.tpm is not None:
            self.tpm.level = min(self.tpm.capacity, self.tpm.level + reserved - used)

    def headers(self, now_s: float) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` headers: requests from the per-minute bucket (else the
        per-second one), tokens from the per-minute token bucket."""
        out: dict[str, str] = {}
        req = self.rpm or self.rps
        pairs: tuple[tuple[str, Bucket | None], ...] = (("requests", req), ("tokens", self.tpm))
        for name, b in pairs:
            if b is None:
                continue
            b.refill(now_s)
            out[f"x-ratelimit-limit-{name}"] = f"{math.floor(b.capacity)}"
            out[f"x-ratelimit-remaining-{name}"] = f"{max(0, math.floor(b.level))}"
            out[f"x-ratelimit-reset-{name}"] = duration_text(b.reset_s())
        return out
