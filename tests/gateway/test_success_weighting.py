"""Routing weighted by each engine's recent success, the panic threshold, the 429 back-off and
the client headers forwarded to engines: the pure parts and the shell around them, on a fake
clock and seeded draws."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from typing import Any

import orjson
import pytest

from core.errors import ConfigError
from gateway.config import PrecisionPolicy, parse_config
from gateway.pipeline.dispatch import MAX_FORWARDED_HEADERS, forwarded_headers
from gateway.pipeline.route import Router
from gateway.requests import prepare
from gateway.routing.success import SuccessWindow, admitted
from gateway.upstreams import Upstreams

pytestmark = pytest.mark.timeout(20)
TAU_S = 10.0


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def config(policy: str = "round_robin", n: int = 2, **outlier: Any) -> Any:
    eps = [{"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}", "precision": "bf16",
            "kind": "vllm"} for i in range(n)]
    return parse_config({
        "slo_classes": {"batch": {}},
        "tenants": [{"name": "a", "api_key_sha256": hashlib.sha256(b"k").hexdigest()}],
        "models": [{"name": "m", "endpoints": eps}],
        "routing": {"policy": policy},
        "outlier_detection": {"consecutive_failures": 1000, "failure_percentage_threshold": 0,
                              **outlier}}, env={})


def test_an_engine_without_recent_failures_has_a_ratio_of_exactly_one() -> None:
    w = SuccessWindow()
    assert w.ratio(0.0, TAU_S) == 1.0
    for t in range(50):
        w.record(True, float(t), TAU_S)
    assert w.ratio(50.0, TAU_S) == 1.0


def test_one_failure_weighs_against_recent_successes_and_fades() -> None:
    """A lone failure of an idle engine takes it near the floor; a busy engine's one failure
    barely moves it; either way the ratio climbs back to exactly 1 as the failure decays."""
    idle = SuccessWindow()
    idle.record(False, 0.0, TAU_S)
    later = [idle.ratio(t, TAU_S) for t in (0.0, 5.0, 10.0)]
    assert later[0] == pytest.approx(0.1 / 1.1) and later[0] < later[1] < later[2] < 1.0
    assert idle.ratio(31.0, TAU_S) == 1.0  # e^-3.1 < the forgotten weight
    busy = SuccessWindow()
    for i in range(1000):
        busy.record(True, i / 100, TAU_S)
    busy.record(False, 10.0, TAU_S)
    assert 0.99 < busy.ratio(10.0, TAU_S) < 1.0


def test_an_engine_that_fails_everything_drops_below_five_percent_in_two_failures() -> None:
    w = SuccessWindow()
    w.record(False, 0.0, TAU_S)
    w.record(False, 0.0, TAU_S)
    assert w.ratio(0.0, TAU_S) < 0.05


def test_admitted_keeps_perfect_candidates_without_a_draw_and_others_by_their_ratio() -> None:
    draws = 0

    def draw() -> float:
        nonlocal draws
        draws += 1
        return 0.0

    assert admitted([1.0, 1.0, 1.0], draw, 0.02) == [0, 1, 2] and draws == 0
    rng = random.Random(7)
    kept = Counter(i for _ in range(20_000) for i in admitted([1.0, 0.3, 0.0], rng.random, 0.02))
    assert kept[0] == 20_000
    assert kept[1] / 20_000 == pytest.approx(0.3, abs=0.02)
    assert kept[2] / 20_000 == pytest.approx(0.02, abs=0.005)  # the floor, not 0


def test_when_no_candidate_is_admitted_the_best_ratios_are_kept() -> None:
    assert admitted([0.2, 0.5, 0.5], lambda: 0.99, 0.02) == [1, 2]


@pytest.mark.parametrize("policy", ["round_robin", "least_load", "prefix_affinity",
                                    "slo_energy"])
def test_every_policy_sends_a_failing_engine_about_the_floor(policy: str) -> None:
    """After 20 failures (ejection off), e0 gets at most 4 % of 2,000 routed requests under
    each policy, though it is the least loaded; once its failures have faded it gets its
    share again."""
    clock = Clock()
    cfg = config(policy)
    upstreams = Upstreams(cfg, clock=clock)
    router = Router(cfg, upstreams, None, clock, draw=random.Random(1).random)
    bad = upstreams.by_name["e0"]
    upstreams.by_name["e1"].inflight = 10  # busier: every load-based policy would pick e0
    for _ in range(20):
        upstreams.failed(bad)
    req = prepare(orjson.dumps({"model": "m", "prompt": "same prefix"}), None, {"m": "m"},
                  prefix_chars=64)

    def shares(router: Router) -> Counter[str]:
        return Counter(router.choose(req, PrecisionPolicy(), "batch", None, (),
                                     "/v1/completions").endpoint.name for _ in range(2000))

    fresh = Upstreams(cfg, clock=clock)
    fresh.by_name["e1"].inflight = 10
    unweighted = shares(Router(cfg, fresh, None, clock))
    assert unweighted["e0"] >= 1000  # what the policy does without the weighting
    assert shares(router)["e0"] <= 80
    clock.now_s += 120.0  # the failures fade (window 30 s): the policy's own choice again
    assert shares(router) == unweighted


def test_panic_routes_to_the_whole_pool_when_under_the_threshold() -> None:
    """Three endpoints, panic at 50 %: one unhealthy leaves two (no panic); two unhealthy or
    ejected leave one (33 %: panic, all three); threshold 0 never panics."""
    clock = Clock()
    up = Upstreams(config(n=3), clock=clock)
    e0, e1, e2 = (up.by_name[f"e{i}"] for i in range(3))
    e0.healthy = False
    assert [s.endpoint.name for s in up.healthy("m")] == ["e1", "e2"]
    assert up.panic_now("m") == 0.0
    e1.ejected_until = clock.now_s + 30
    assert [s.endpoint.name for s in up.healthy("m")] == ["e0", "e1", "e2"]
    assert up.panic_now("m") == 1.0
    assert [s.endpoint.name for s in up.healthy("m", exclude=["e1"])] == ["e0", "e2"]
    e1.ejected_until = 0.0
    e1.healthy = e2.healthy = False
    off = Upstreams(config(n=3, panic_threshold_percent=0), clock=clock)
    for s in off.by_name.values():
        s.healthy = False
    assert off.healthy("m") == [] and off.panic_now("m") == 0.0
    assert len(up.healthy("m")) == 3


def test_a_backed_off_engine_is_passed_over_unless_nothing_else_is_left() -> None:
    clock = Clock()
    up = Upstreams(config(), clock=clock)
    e0, e1 = up.by_name["e0"], up.by_name["e1"]
    up.backed_off(e0, 7.0)
    assert up.healthy("m") == [e1]
    assert up.healthy("m", exclude=["e1"]) == [e0]  # all there is
    clock.now_s += 7.5
    assert up.healthy("m") == [e0, e1]


def test_every_failure_counts_and_a_success_ends_the_run() -> None:
    clock = Clock()
    up = Upstreams(config(consecutive_failures=3), clock=clock)
    e0 = up.by_name["e0"]
    up.failed(e0)
    up.failed(e0)
    up.succeeded(e0)
    assert e0.consecutive_failures == 0 and not e0.ejected(clock.now_s)
    for _ in range(3):
        up.failed(e0)
    assert e0.ejected(clock.now_s)


def test_failure_percentage_ejects_only_past_the_volume_and_the_threshold() -> None:
    """Failing every other request: not ejected while the decayed volume is under 10 or the
    share under 60 %; ejected once 60 % of at least 10 recent requests failed; failures an
    hour old weigh nothing."""
    clock = Clock()
    up = Upstreams(config(failure_percentage_threshold=60,
                          failure_percentage_request_volume=10), clock=clock)
    e0 = up.by_name["e0"]
    for _ in range(20):  # 50 %: under the threshold however many
        up.failed(e0)
        up.succeeded(e0)
    assert not e0.ejected(clock.now_s)
    clock.now_s += 3600.0  # all of it forgotten
    for i in range(4):  # 4 failures and 2 successes, 67 %, but under the volume
        up.failed(e0)
        if i % 2:
            up.succeeded(e0)
    assert not e0.ejected(clock.now_s)
    for _ in range(8):
        up.failed(e0)
        if e0.ejected(clock.now_s):
            break
        up.succeeded(e0)
    assert e0.ejected(clock.now_s)


def test_only_clean_x_headers_are_forwarded_within_the_caps() -> None:
    raw = [(b"X-Trace", b"abc 1\t2"), (b"x-ctl", b"a\x01b"), (b"x-nl", b"a\nb"),
           (b"x-high", b"caf\xc3\xa9"), (b"x-wattgate-precision", b"int4"),
           (b"x-request-id", b"mine"), (b"authorization", b"Bearer k"), (b"x-bad\x7f", b"v")]
    assert forwarded_headers(raw) == [("X-Trace", "abc 1\t2")]
    many = [(b"x-h%d" % i, b"v") for i in range(100)]
    assert len(forwarded_headers(many)) == MAX_FORWARDED_HEADERS
    big = [(b"x-big%d" % i, b"v" * 1500) for i in range(5)]
    assert len(forwarded_headers(big)) == 2  # 4,096 bytes in all


@pytest.mark.parametrize(("section", "field", "value"), [
    ("outlier_detection", "panic_threshold_percent", 101),
    ("outlier_detection", "panic_threshold_percent", -1),
    ("routing", "success_floor", 1.5),
    ("routing", "success_window_s", 0),
])
def test_bad_weighting_and_panic_settings_name_their_field(section: str, field: str,
                                                           value: float) -> None:
    raw = {"models": [{"name": "m", "endpoints": [{"name": "e", "url": "http://127.0.0.1:1",
                                                   "precision": "bf16"}]}],
           section: {field: value}}
    with pytest.raises(ConfigError, match=f"{section}.{field}"):
        parse_config(raw, env={})


def test_an_engine_back_from_an_ejection_is_judged_by_its_requests_since() -> None:
    """A busy engine (50 requests/s) ejected for failing 70 %: back 30 s later its first
    failure does not eject it again (its failures from before still weighed 25 requests at
    50 %, over the volume); ten more failures in eleven requests do."""
    clock = Clock()
    up = Upstreams(config(consecutive_failures=1000, failure_percentage_threshold=50,
                          failure_percentage_request_volume=10), clock=clock)
    e0 = up.by_name["e0"]
    rng = random.Random(1)
    for _ in range(3000):  # a minute at 30 %: kept
        clock.now_s += 0.02
        (up.failed if rng.random() < 0.3 else up.succeeded)(e0)
    assert not e0.ejected(clock.now_s)
    while not e0.ejected(clock.now_s):  # then 70 %
        clock.now_s += 0.02
        (up.failed if rng.random() < 0.7 else up.succeeded)(e0)
    assert e0.ejections == 1
    clock.now_s = e0.ejected_until + 0.01
    up.failed(e0)
    assert not e0.ejected(clock.now_s)
    up.succeeded(e0)
    for _ in range(9):
        up.failed(e0)
    assert e0.ejected(clock.now_s) and e0.ejections == 2
