"""Token buckets of tenant rate limits, on an injected clock."""

from __future__ import annotations

import math

from gateway.tenancy.config import TenantLimits
from gateway.tenancy.ratelimit import TenantRateLimiter, duration_text


def test_per_minute_requests_refill_one_every_period_over_limit() -> None:
    rl = TenantRateLimiter(TenantLimits(requests_per_minute=6), now_s=0.0)
    assert all(rl.take(0.0, 0).allowed for _ in range(6))
    refused = rl.take(0.0, 0)
    assert not refused.allowed and refused.reason == "requests"
    assert refused.retry_after_s == 10.0  # one request comes back every 60 / 6 s
    assert not rl.take(9.9, 0).allowed
    assert rl.take(10.0, 0).allowed


def test_the_stricter_of_per_second_and_per_minute_decides() -> None:
    rl = TenantRateLimiter(TenantLimits(requests_per_second=2, requests_per_minute=3), 0.0)
    assert rl.take(0.0, 0).allowed and rl.take(0.0, 0).allowed
    assert rl.take(0.0, 0).retry_after_s == 0.5  # the per-second bucket
    assert rl.take(1.0, 0).allowed
    late = rl.take(2.0, 0)  # the per-second bucket is full again, the minute one is not
    assert not late.allowed and math.isclose(late.retry_after_s, 20.0 - 2.0, rel_tol=1e-9)


def test_tokens_are_reserved_then_settled_to_the_real_count() -> None:
    rl = TenantRateLimiter(TenantLimits(tokens_per_minute=100), 0.0)
    assert rl.take(0.0, 80).allowed
    assert not rl.take(0.0, 30).allowed
    rl.settle(80, 10)  # the request used 10 of its 80
    assert rl.take(0.0, 30).allowed
    rl.settle(30, 200)  # used more than reserved: the bucket goes into debt
    refused = rl.take(0.0, 10)
    assert not refused.allowed and refused.reason == "tokens"


def test_a_request_bigger_than_the_limit_can_never_fit() -> None:
    rl = TenantRateLimiter(TenantLimits(tokens_per_minute=100), 0.0)
    assert rl.take(0.0, 101).retry_after_s == math.inf
    assert rl.take(0.0, 100).allowed  # nothing was taken by the refusal


def test_a_share_of_the_limit_per_replica() -> None:
    rl = TenantRateLimiter(TenantLimits(requests_per_minute=60), 0.0)
    rl.set_share(1 / 3)
    assert sum(rl.take(0.0, 0).allowed for _ in range(60)) == 20
    assert rl.headers(0.0)["x-ratelimit-limit-requests"] == "20"


def test_openai_headers_and_reset_format() -> None:
    rl = TenantRateLimiter(TenantLimits(requests_per_minute=10, tokens_per_minute=1000), 0.0)
    rl.take(0.0, 250)
    h = rl.headers(0.0)
    assert h == {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "9",
                 "x-ratelimit-reset-requests": "6s", "x-ratelimit-limit-tokens": "1000",
                 "x-ratelimit-remaining-tokens": "750", "x-ratelimit-reset-tokens": "15s"}
    assert (duration_text(0.02), duration_text(1.5), duration_text(360.0)) == (
        "20ms", "1.5s", "6m0s")
