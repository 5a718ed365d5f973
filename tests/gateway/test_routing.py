"""Routing policies and precision selection are pure functions of a snapshot."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import PermissionDeniedError, RequestError
from gateway.config import PrecisionPolicy
from gateway.routing import Candidate, RoutingContext, policy_for, select_precisions
from gateway.routing.precision import split_model


def cands(*loads: float) -> list[Candidate]:
    return [Candidate(name=f"e{i}", precision="bf16", inflight=int(x)) for i, x in enumerate(loads)]


def test_round_robin_cycles_through_all() -> None:
    rr = policy_for("round_robin")
    picks = [rr(cands(0, 0, 0), RoutingContext(i, b"")) for i in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]


def test_least_load_uses_inflight_and_engine_gauges() -> None:
    ll = policy_for("least_load")
    assert ll(cands(5, 1, 3), RoutingContext(0, b"")) == 1
    scraped = [Candidate("a", "bf16", inflight=0, running=9, waiting=4),
               Candidate("b", "bf16", inflight=2, running=2, waiting=0)]
    assert ll(scraped, RoutingContext(0, b"")) == 1
    kv = [Candidate("a", "bf16", kv_usage=0.9), Candidate("b", "bf16", kv_usage=0.1)]
    assert ll(kv, RoutingContext(0, b"")) == 1


def test_least_load_spreads_ties() -> None:
    ll = policy_for("least_load")
    assert {ll(cands(0, 0, 0), RoutingContext(i, b"")) for i in range(3)} == {0, 1, 2}


def test_prefix_affinity_is_sticky_and_spreads_prefixes() -> None:
    pa = policy_for("prefix_affinity")
    c = cands(0, 0, 0, 0)
    first = pa(c, RoutingContext(0, b"system prompt A"))
    assert all(pa(c, RoutingContext(i, b"system prompt A")) == first for i in range(20))
    spread = {pa(c, RoutingContext(0, f"prefix {i}".encode())) for i in range(64)}
    assert len(spread) == 4


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=2, max_size=8),
       st.binary(min_size=1, max_size=32))
def test_prefix_affinity_respects_the_load_bound(loads: list[int], key: bytes) -> None:
    c = cands(*loads)
    i = policy_for("prefix_affinity")(c, RoutingContext(0, key, load_bound=1.25))
    mean = sum(loads) / len(loads)
    assert c[i].load <= 1.25 * (mean + 1) or c[i].load == min(loads)


def test_precision_override_and_tenant_policy() -> None:
    policy = PrecisionPolicy(allowed=("fp8", "int4", "bf16"), preferred=("int4",))
    assert select_precisions(policy, None, {"bf16", "fp8", "int4"}) == ("int4",)
    assert select_precisions(policy, None, {"bf16", "fp8"}) == ("fp8", "bf16")
    assert select_precisions(policy, "fp8", {"bf16", "fp8"}) == ("fp8",)
    assert select_precisions(policy, "fp8", {"bf16"}) == ()
    with pytest.raises(PermissionDeniedError):
        select_precisions(policy, "int8", {"int8"})
    with pytest.raises(RequestError):
        select_precisions(policy, "fp4", {"bf16"})


def test_split_model() -> None:
    assert split_model("llama@fp8") == ("llama", "fp8")
    assert split_model("llama") == ("llama", None)
