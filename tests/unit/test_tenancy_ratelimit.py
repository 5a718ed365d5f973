"""Token buckets of tenant rate limits, on an injected clock."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

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


class _Plain:
    """The buckets' arithmetic written out plainly (each limit x share and its refill rate
    worked out where used), to hold the limiter's kept values to."""

    def __init__(self, limits: TenantLimits) -> None:
        self.buckets = {name: [limit, period, limit, 0.0, 1.0] for name, limit, period in (
            ("rps", limits.requests_per_second, 1.0), ("rpm", limits.requests_per_minute, 60.0),
            ("tpm", limits.tokens_per_minute, 60.0)) if limit is not None}

    def _refill(self, b: list[float], now: float) -> None:
        cap = b[0] * b[4]
        b[2] = min(cap, b[2] + max(0.0, now - b[3]) * (cap / b[1]))
        b[3] = max(b[3], now)

    def _wait(self, b: list[float], amount: float) -> float:
        cap = b[0] * b[4]
        return math.inf if amount > cap else max(0.0, (amount - b[2]) * b[1] / cap)

    def take(self, now: float, tokens: int) -> tuple[bool, str, float]:
        for b in self.buckets.values():
            self._refill(b, now)
        waits = [(self._wait(self.buckets[k], 1.0), "requests") for k in ("rps", "rpm")
                 if k in self.buckets]
        if "tpm" in self.buckets:
            waits.append((self._wait(self.buckets["tpm"], float(tokens)), "tokens"))
        worst = max(waits, default=(0.0, ""))
        if worst[0] > 0.0:
            return False, worst[1], worst[0]
        for k, b in self.buckets.items():
            b[2] -= tokens if k == "tpm" else 1.0
        return True, "", 0.0

    def settle(self, reserved: int, used: int) -> None:
        if "tpm" in self.buckets:
            b = self.buckets["tpm"]
            b[2] = min(b[0] * b[4], b[2] + reserved - used)

    def set_share(self, share: float) -> None:
        for b in self.buckets.values():
            b[4] = share
            b[2] = min(b[2], b[0] * share)

    def headers(self, now: float) -> dict[str, str]:
        out = {}
        for name, key in (("requests", "rpm" if "rpm" in self.buckets else "rps"),
                          ("tokens", "tpm")):
            if key not in self.buckets:
                continue
            b = self.buckets[key]
            self._refill(b, now)
            cap = b[0] * b[4]
            out[f"x-ratelimit-limit-{name}"] = f"{math.floor(cap)}"
            out[f"x-ratelimit-remaining-{name}"] = f"{max(0, math.floor(b[2]))}"
            out[f"x-ratelimit-reset-{name}"] = duration_text(
                max(0.0, (cap - b[2]) * b[1] / cap))
        return out


limit = st.one_of(st.none(), st.integers(1, 50).map(float), st.floats(0.5, 1e4))
step = st.tuples(st.sampled_from(["take", "settle", "share", "headers"]),
                 st.floats(-0.5, 3.0), st.integers(0, 120), st.integers(1, 4))


@settings(max_examples=300, deadline=None)
@given(limit, limit, limit, st.lists(step, max_size=60))
def test_the_limiter_takes_refuses_and_reports_as_the_plain_arithmetic(
        rps: float | None, rpm: float | None, tpm: float | None,
        steps: list[tuple[str, float, int, int]]) -> None:
    """Same verdicts (reason and wait), same headers, through refills, settlements (debt
    included), shares and a clock that stands still or steps back."""
    limits = TenantLimits(requests_per_second=rps, requests_per_minute=rpm,
                          tokens_per_minute=tpm)
    rl, plain = TenantRateLimiter(limits, 0.0), _Plain(limits)
    now = 0.0
    for op, dt, tokens, replicas in steps:
        now += dt
        if op == "take":
            v = rl.take(now, tokens)
            assert (v.allowed, v.reason, v.retry_after_s) == plain.take(now, tokens)
        elif op == "settle":
            rl.settle(tokens, tokens * replicas // 2)
            plain.settle(tokens, tokens * replicas // 2)
        elif op == "share":
            rl.set_share(1.0 / replicas)
            plain.set_share(1.0 / replicas)
        else:
            assert rl.headers(now) == plain.headers(now)
