"""Arms of one engine kind each, from a real gateway's endpoint list: a precision served by
vLLM and TensorRT-LLM engines is split into one arm per engine."""

from __future__ import annotations

import pytest

from loadgen.arms import fetch_endpoints, plan_arms
from loadgen.client import Target
from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import ADMIN_KEY, make_config, running_gateway

pytestmark = pytest.mark.timeout(60)


async def test_a_mixed_precision_pool_is_split_by_engine_kind() -> None:
    async with fake_engine(FakeEngine(model="m")) as eng, running_gateway(make_config([
            {"name": "e-bf16", "url": eng.url, "precision": "bf16"},
            {"name": "e-fp8", "url": eng.url, "precision": "fp8"},
            {"name": "e-trt-fp8", "url": eng.url, "precision": "fp8", "kind": "trtllm"}])) as gw:
        endpoints = await fetch_endpoints(gw, ADMIN_KEY, "m")
        assert await fetch_endpoints(gw, "sk-wrong", "m") is None
        assert await fetch_endpoints(gw, "", "m") is None
    assert endpoints is not None
    gateway = {p: Target(gw, f"m@{p}") for p in ("bf16", "fp8")}
    arms = plan_arms(["bf16", "fp8"], gateway, {}, endpoints)
    assert [(a.label, a.engine_kind, a.target.base_url) for a in arms] == [
        ("bf16 (vllm)", "vllm", gw),
        ("fp8 (trtllm, e-trt-fp8)", "trtllm", eng.url),
        ("fp8 (vllm, e-fp8)", "vllm", eng.url)]


async def test_arms_carry_the_quality_the_gateway_lists_for_their_endpoints() -> None:
    """An endpoint's configured `quality` reaches the arm through `/admin/v1/endpoints`; one
    without carries its format's published figure; the floor then leaves int4 out."""
    from core.quality import PUBLISHED, Quality
    from loadgen.decide import below_floor

    stated = {"score": 0.995, "benchmark": "our eval", "source": "ours"}
    async with fake_engine(FakeEngine(model="m")) as eng, running_gateway(make_config([
            {"name": "e-fp8", "url": eng.url, "precision": "fp8", "quality": stated},
            {"name": "e-int4", "url": eng.url, "precision": "int4"}])) as gw:
        endpoints = await fetch_endpoints(gw, ADMIN_KEY, "m")
    assert endpoints is not None
    arms = plan_arms(["fp8", "int4"], {p: Target(gw, f"m@{p}") for p in ("fp8", "int4")}, {},
                     endpoints)
    assert [a.quality for a in arms] == [Quality(0.995, "our eval", "ours"), PUBLISHED["int4"]]
    assert below_floor([(a.label, a.quality) for a in arms], 0.98) == (
        "int4 (vllm) excluded: quality 0.97 < floor 0.98",)
