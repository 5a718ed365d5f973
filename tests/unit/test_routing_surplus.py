"""The idle energy of engines beyond what their pool's load needed (gateway/routing/capacity.py
`SurplusMeter`, `surplus_engines`), pure and through the learner that steps it."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.routing.base import Candidate, RoutingContext
from gateway.routing.capacity import SurplusMeter, engines_needed, surplus_engines
from gateway.routing.learner import STALE_S, EndpointInfo, RoutingModels


def test_surplus_engines_are_the_least_capable_beyond_those_needed() -> None:
    names = ("a", "b", "c", "d")
    caps = (10.0, 40.0, 20.0, 40.0)
    assert surplus_engines(names, caps, 0) == ("b", "d", "c", "a")
    assert surplus_engines(names, caps, engines_needed(45.0, caps)) == ("c", "a")
    assert surplus_engines(names, caps, 4) == ()


def test_meter_charges_idle_power_times_the_seconds_an_engine_was_surplus() -> None:
    m = SurplusMeter(hold_s=10.0)
    idle = {"a": 100.0, "b": 60.0}
    m.advance(0.0, {"b": 60.0}, idle)
    m.advance(4.0, {}, idle)  # b surplus for 4 s
    m.advance(6.0, {"a": 100.0, "b": 60.0}, idle)  # nothing surplus for 2 s
    m.advance(9.0, {"a": 100.0}, idle)  # both surplus for 3 s
    assert m.seconds == {"b": 7.0, "a": 3.0}
    assert m.joules == {"b": 420.0, "a": 300.0}


def test_a_state_holds_only_hold_s_then_every_engine_counts_as_surplus() -> None:
    """No routing for a long while: the loads are stale and every engine was surplus."""
    m = SurplusMeter(hold_s=10.0)
    idle = {"a": 100.0, "b": 50.0}
    m.advance(0.0, {}, idle)  # both needed at t=0
    m.advance(30.0, {}, idle)  # nothing routed since: 10 s held, 20 s idle
    assert m.seconds == {"a": 20.0, "b": 20.0}
    assert m.joules == {"a": 2000.0, "b": 1000.0}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 50.0), st.sets(st.sampled_from("abc"))), max_size=30))
def test_surplus_seconds_never_exceed_the_time_elapsed(
        steps: list[tuple[float, set[str]]]) -> None:
    m = SurplusMeter(hold_s=5.0)
    idle = {"a": 70.0, "b": 80.0, "c": 90.0}
    t = 0.0
    for dt, surplus in steps:
        t += dt
        m.advance(t, {n: idle[n] for n in surplus}, idle)
    for name, seconds in m.seconds.items():
        assert 0.0 <= seconds <= t + 1e-9
        assert math.isclose(m.joules[name], idle[name] * seconds, rel_tol=1e-9, abs_tol=1e-9)


def _models(clock: list[float]) -> RoutingModels:
    ctx = RoutingContext(0, b"", ttft_slo_s=0.5, tpot_slo_s=0.05, slo_margin=0.8,
                         prompt_tokens=128.0)
    return RoutingModels([EndpointInfo("v8", "m", "vllm", "fp8"),
                          EndpointInfo("t8", "m", "trtllm", "fp8"),
                          EndpointInfo("v16", "m", "vllm", "bf16")],
                         capacity_ctx=ctx, clock=lambda: clock[0])


def test_learner_counts_engines_the_load_did_not_need_and_shows_them_per_endpoint() -> None:
    clock = [100.0]
    models = _models(clock)
    models.observe_loads(100.0, [Candidate("v8", "fp8", running=3), Candidate("t8", "fp8"),
                                 Candidate("v16", "bf16")])
    clock[0] = 104.0
    snap = models.snapshot()
    idle = {n: c.idle_w for n, c in models.curves().items()}
    # fp8 pool: 3 requests need one engine (the more capable TensorRT-LLM one); bf16: none
    assert models.capacity_ctx is not None
    caps = models.pool_needs(models.capacity_ctx, 100.0)
    assert caps[("m", "fp8")].needed == 1 and caps[("m", "bf16")].needed == 0
    fp8 = caps[("m", "fp8")]
    spare = surplus_engines(fp8.names, fp8.capacities, 1)
    assert len(spare) == 1
    assert snap[spare[0]]["surplus_s"] == 4.0
    assert math.isclose(snap[spare[0]]["surplus_idle_j"], round(4.0 * idle[spare[0]], 3))
    assert snap["v16"]["surplus_s"] == 4.0
    needed = ({"v8", "t8"} - set(spare)).pop()
    assert snap[needed]["surplus_s"] == 0.0
    # long after the last routing decision every engine counts as surplus: the state seen at
    # 104 s holds STALE_S, then the needed engine was surplus too
    clock[0] = 104.0 + STALE_S + 6.0
    later = models.snapshot()
    assert later[needed]["surplus_s"] == 6.0
    assert later["v16"]["surplus_s"] == 4.0 + STALE_S + 6.0
