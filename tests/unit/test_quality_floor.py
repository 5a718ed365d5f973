"""Output quality per endpoint (core/quality.py, the gateway config) and the --min-quality floor
the precision recommendation respects (loadgen/decide.py, loadgen/arms.py, the report)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from core.errors import ConfigError
from core.quality import PUBLISHED, Quality, published
from gateway.config import parse_config
from loadgen import search_report
from loadgen.arms import Arm, endpoints_of, plan_arms, with_quality
from loadgen.capacity import SearchConfig
from loadgen.client import Target
from loadgen.decide import decide
from loadgen.precision import precision_report
from loadgen.search_report import SearchReport
from loadgen.timebase import TimeBase
from tests.unit.test_loadgen_decide import arm


def _config(endpoint_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    ep = {"name": "e1", "url": "http://127.0.0.1:9", "precision": "int4", **(endpoint_extra or {})}
    return {"models": [{"name": "m", "endpoints": [ep]}],
            "tenants": [{"name": "t", "api_key_sha256": "0" * 64}]}


def test_an_endpoint_without_quality_gets_its_formats_published_figure() -> None:
    ep = parse_config(_config(), env={}).models[0].endpoints[0]
    assert ep.quality == PUBLISHED["int4"]
    assert ep.quality is not None and ep.quality.score == 0.97
    assert "Kurtic" in ep.quality.source and "2411.02355" in ep.quality.source
    # the published figures order the formats as the paper does: FP8 > INT8 > INT4
    scores = [published(p).score for p in ("bf16", "fp8", "int8", "int4")]  # type: ignore[union-attr]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0


def test_an_endpoint_states_its_own_quality() -> None:
    q = {"score": 0.995, "benchmark": "our eval set", "source": "measured 2025-01"}
    ep = parse_config(_config({"quality": q}), env={}).models[0].endpoints[0]
    assert ep.quality == Quality(0.995, "our eval set", "measured 2025-01")


@pytest.mark.parametrize(("quality", "path"), [
    ({"score": 1.5, "benchmark": "b", "source": "s"}, "models[0].endpoints[0].quality.score"),
    ({"score": "high", "benchmark": "b", "source": "s"}, "models[0].endpoints[0].quality.score"),
    ({"score": 0.9, "source": "s"}, "models[0].endpoints[0].quality.benchmark"),
    ({"score": 0.9, "benchmark": "b", "source": "s", "extra": 1},
     "models[0].endpoints[0].quality.extra"),
    ("0.9", "models[0].endpoints[0].quality"),
])
def test_bad_quality_names_its_field(quality: Any, path: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_config({"quality": quality}), env={})
    assert str(err.value).startswith(path)


def test_the_example_configs_parse_with_qualities() -> None:
    from pathlib import Path

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / "examples"
                          / "local.yaml").read_text())
    eps = parse_config(doc, env={}).models[0].endpoints
    assert {e.precision: e.quality.score for e in eps if e.quality} == {
        "bf16": 1.0, "fp8": 0.99, "int8": 0.98, "int4": 0.97}


def test_arms_take_the_listed_quality_then_the_published_one_then_quality_option() -> None:
    listing = {"endpoints": [
        {"model": "m", "name": "a", "url": "http://a", "kind": "vllm", "precision": "fp8",
         "quality": {"score": 0.93, "benchmark": "b", "source": "s"}},
        {"model": "m", "name": "b", "url": "http://b", "kind": "vllm", "precision": "int4"}]}
    eps = endpoints_of(listing, "m")
    gw = {p: Target("http://gw", f"m@{p}") for p in ("fp8", "int4", "int8")}
    arms = plan_arms(["fp8", "int4", "int8"], gw, {}, eps)
    got = {a.precision: a.quality.score for a in arms if a.quality}
    assert got == {"fp8": 0.93, "int4": 0.97, "int8": 0.98}
    over = with_quality(arms, {"int4": 0.99})
    q = {a.precision: a.quality for a in over}
    assert q["int4"] == Quality(0.99, "user-supplied", "--quality") and q["fp8"] == arms[0].quality


def _with_q(a: Any, score: float | None) -> Any:
    return dataclasses.replace(a, quality=None if score is None else Quality(score, "b", "s"))


def test_the_floor_excludes_the_cheapest_arm_and_says_why() -> None:
    arms = [_with_q(arm("bf16 (vllm)", 100.0, 0.30), 1.0),
            _with_q(arm("fp8 (vllm)", 100.0, 0.20), 0.99),
            _with_q(arm("int4 (vllm)", 100.0, 0.10), 0.97)]
    free = decide(arms, None, "SLO", 0.9, "req/s")
    assert free.recommended == "int4 (vllm)" and free.excluded == ()
    floored = decide(arms, None, "SLO", 0.9, "req/s", min_quality=0.98)
    assert floored.recommended == "fp8 (vllm)"
    assert floored.excluded == ("int4 (vllm) excluded: quality 0.97 < floor 0.98",)
    assert "int4 (vllm) excluded: quality 0.97 < floor 0.98" in floored.why
    # an arm of unknown quality cannot be shown to meet a floor
    unknown = decide([*arms[:2], _with_q(arms[2], None)], None, "SLO", 0.9, "req/s", 0.5)
    assert unknown.recommended == "fp8 (vllm)" and "quality not known" in unknown.why
    report = SearchReport(tuple(arms), floored, SearchConfig(25.0, 400.0), "SLO", TimeBase(1.0))
    text = search_report.text(report)
    assert "int4 (vllm) excluded: quality 0.97 < floor 0.98" in text
    assert "0.97 < floor 0.98 (excluded)" in text and "Quality floor: 0.98" in text
    doc = search_report.to_json(report)
    assert doc["decision"]["min_quality"] == 0.98 and doc["arms"][2]["quality"]["score"] == 0.97


def test_the_floor_applies_to_the_sweep_recommendation_too() -> None:
    from loadgen.experiments import SweepPoint

    pts = [SweepPoint(a, 10.0, 10.0, True, 10.0, 0.99, j, 0.1, 0.01)
           for a, j in (("bf16", 0.3), ("int4", 0.1))]
    free = precision_report(pts, ["bf16", "int4"], 0.9, "SLO", {})
    assert free.recommended == "int4"
    floored = precision_report(pts, ["bf16", "int4"], 0.9, "SLO", {},
                               excluded=("int4 excluded: quality 0.97 < floor 0.98",))
    assert floored.recommended == "bf16" and "int4 excluded: quality 0.97" in floored.why


def test_an_arm_knows_its_quality() -> None:
    a = Arm("fp8", "fp8", "direct", Target("http://x", "m"), quality=published("fp8"))
    assert a.quality is not None and a.quality.score == 0.99
