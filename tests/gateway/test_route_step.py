"""The route step: precision policy, quality floors, SLO size hints, and the shell that keeps
the round-robin counter."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from core.errors import PermissionDeniedError, RoutingError
from core.vocab import SloClass
from engines.adapters import EngineLoad
from gateway.config import GatewayConfig, PrecisionPolicy, parse_config
from gateway.pipeline.route import Router, context, eligible
from gateway.requests import PreparedRequest, prepare
from gateway.upstreams import Upstreams

pytestmark = pytest.mark.timeout(10)


def config(policy: str = "round_robin", **routing: Any) -> GatewayConfig:
    eps = [{"name": f"e-{p}", "url": f"http://127.0.0.1:{9000 + i}", "precision": p,
            "kind": "vllm"} for i, p in enumerate(("bf16", "fp8", "int4"))]
    return parse_config({
        "slo_classes": {"interactive": {"ttft_s": 0.5, "tpot_s": 0.05}, "batch": {}},
        "tenants": [{"name": "a", "api_key_sha256": hashlib.sha256(b"k").hexdigest(),
                     "slo_class": "interactive"}],
        "models": [{"name": "m", "endpoints": eps}],
        "routing": {"policy": policy, **routing}}, env={})


def req(body: dict[str, Any] | None = None, **kw: Any) -> PreparedRequest:
    return prepare(orjson.dumps({"model": "m", **(body or {})}), None, {"m": "m"}, **kw)


def names(states: Any) -> list[str]:
    return [s.endpoint.name for s in states]


def test_the_tenants_preference_and_an_override_pick_the_precision() -> None:
    healthy = Upstreams(config()).healthy("m")
    preferred = PrecisionPolicy(preferred=("int4",))
    assert names(eligible(healthy, req(), None, preferred, "batch", None, {})) == ["e-int4"]
    assert names(eligible(healthy, req(), "fp8", preferred, "batch", None, {})) == ["e-fp8"]
    with pytest.raises(PermissionDeniedError):
        eligible(healthy, req(), "bf16", PrecisionPolicy(allowed=("int4",)), "batch", None, {})


def test_a_quality_floor_drops_precisions_below_it_unless_overridden() -> None:
    healthy = Upstreams(config()).healthy("m")
    quality = {"int4": 0.9, "fp8": 0.99}  # bf16: 1.0, unscored
    kept = eligible(healthy, req(), None, PrecisionPolicy(), "interactive", 0.95, quality)
    assert names(kept) == ["e-bf16", "e-fp8"]
    assert names(eligible(healthy, req(), "int4", PrecisionPolicy(), "interactive", 0.95,
                          quality)) == ["e-int4"]
    with pytest.raises(RoutingError, match=r"quality floor 0\.999 of SLO class 'interactive'"):
        eligible(healthy, req(), None, PrecisionPolicy(), "interactive", 0.999,
                 {**quality, "bf16": 0.99})


def test_no_endpoint_at_the_asked_precision_is_a_routing_error() -> None:
    healthy = [s for s in Upstreams(config()).healthy("m") if s.endpoint.precision != "fp8"]
    with pytest.raises(RoutingError, match="at precision fp8"):
        eligible(healthy, req(), "fp8", PrecisionPolicy(), "batch", None, {})


def test_slo_routing_sees_the_requests_size_against_its_slo_class() -> None:
    routing = config("slo_energy", default_output_tokens=100).routing
    slo = SloClass("interactive", ttft_s=0.5, tpot_s=0.05)
    sized = req({"prompt": "x" * 40, "max_tokens": 7}, estimate=True)
    ctx = context(sized, 3, routing, slo, {})
    assert (ctx.sequence, ctx.prompt_tokens, ctx.output_tokens) == (3, 10.0, 7.0)
    assert (ctx.ttft_slo_s, ctx.tpot_slo_s, ctx.slo_margin) == (0.5, 0.05, routing.slo_margin)
    assert context(req(estimate=True), 0, routing, slo, {}).output_tokens == 100.0
    plain = context(sized, 3, routing, None, None)
    assert (plain.ttft_slo_s, plain.prompt_tokens) == (None, 0.0)


def test_round_robin_through_the_router_skips_the_endpoints_already_tried() -> None:
    cfg = config()
    router = Router(cfg, Upstreams(cfg), None, lambda: 0.0)
    picks = [router.choose(req(), PrecisionPolicy(), "batch", None, (), "/v1/completions")
             for _ in range(3)]
    assert names(picks) == ["e-bf16", "e-fp8", "e-int4"]
    retry = router.choose(req(), PrecisionPolicy(), "batch", None, ("e-fp8", "e-int4"),
                          "/v1/completions")
    assert names([retry]) == ["e-bf16"]


def test_the_router_sees_health_policy_and_override_changes_at_once() -> None:
    cfg = config()
    upstreams = Upstreams(cfg)
    router = Router(cfg, upstreams, None, lambda: 0.0)

    def picks(policy: PrecisionPolicy, precision: str | None = None) -> set[str]:
        return set(names(router.choose(req(), policy, "batch", precision, (),
                                       "/v1/completions")
                         for _ in range(3)))

    anything = PrecisionPolicy()
    assert picks(anything) == {"e-bf16", "e-fp8", "e-int4"}
    fp8 = next(s for s in upstreams.pools["m"] if s.endpoint.name == "e-fp8")
    fp8.healthy = False  # the health loop's verdict: routing stops sending there now
    assert picks(anything) == {"e-bf16", "e-int4"}
    assert picks(PrecisionPolicy(preferred=("int4",))) == {"e-int4"}
    assert picks(anything, "bf16") == {"e-bf16"}
    with pytest.raises(PermissionDeniedError):  # refusals are asked afresh every time
        picks(PrecisionPolicy(allowed=("int4",)), "bf16")
    fp8.healthy = True
    assert picks(anything) == {"e-bf16", "e-fp8", "e-int4"}


def test_an_endpoints_snapshot_follows_its_inflight_count_and_each_scrape() -> None:
    state = Upstreams(config()).healthy("m")[0]
    assert state.candidate().inflight == 0
    state.inflight = 2
    assert state.candidate().inflight == 2
    state.load = EngineLoad(running=3.0, waiting=1.0, kv_usage=0.5)  # a scrape
    snap = state.candidate()
    assert (snap.inflight, snap.running, snap.waiting, snap.kv_usage, snap.load) == (
        2, 3.0, 1.0, 0.5, 4.0)
    state.inflight = 0
    assert (state.candidate().inflight, state.candidate().running) == (0, 3.0)


def test_the_router_reads_a_prefix_only_for_prefix_affinity() -> None:
    assert Router(config(), Upstreams(config()), None, lambda: 0.0).prefix_chars == 0
    affinity = config("prefix_affinity", prefix_chars=64)
    assert Router(affinity, Upstreams(affinity), None, lambda: 0.0).prefix_chars == 64


def test_a_precisions_quality_is_its_endpoints_unless_routing_quality_says() -> None:
    """Endpoints without a `quality` entry carry their format's published figure (INT4
    W4A16 0.97); a class floor of 0.98 then keeps int4 out without routing.quality."""
    floored = config(min_quality={"interactive": 0.98})
    router = Router(floored, Upstreams(floored), None, clock=lambda: 0.0)
    assert router.quality == {"bf16": 1.0, "fp8": 0.99, "int4": 0.97}
    healthy = Upstreams(floored).healthy("m")
    assert names(eligible(healthy, req(), None, PrecisionPolicy(), "interactive",
                          router.floors["interactive"], router.quality)) == ["e-bf16", "e-fp8"]
    told = config(min_quality={"interactive": 0.98}, quality={"int4": 0.99})
    assert Router(told, Upstreams(told), None, clock=lambda: 0.0).quality["int4"] == 0.99
