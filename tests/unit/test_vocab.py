"""The vocabulary in core/vocab.py names exactly what the tables behind it can build.

engines/ imports nothing of ours, so its name tables are spelled there a second time; these
tests hold the two spellings equal, and the config parser to the Literals.
"""

from __future__ import annotations

from typing import get_args

import pytest

from core.errors import ConfigError
from core.vocab import EngineKind, MeterKind, PolicyName, Precision
from engines.adapters import ADAPTERS
from engines.launch import PRECISIONS as LAUNCH_PRECISIONS
from engines.meters.registry import METER_KINDS
from gateway.config import parse_config
from gateway.routing import POLICIES


def test_every_engine_kind_has_an_adapter_and_no_adapter_is_unnamed() -> None:
    assert set(get_args(EngineKind)) == set(ADAPTERS)


def test_meter_kinds_are_the_meter_registry() -> None:
    assert set(get_args(MeterKind)) == set(METER_KINDS)


def test_routing_policy_names_are_the_policy_table() -> None:
    assert set(get_args(PolicyName)) == set(POLICIES)


def test_precisions_are_those_engines_can_be_launched_at() -> None:
    assert get_args(Precision) == LAUNCH_PRECISIONS


def _config(**routing: object) -> dict[str, object]:
    return {"auth_required": False, "routing": routing,
            "models": [{"name": "m", "endpoints": [{"url": "http://127.0.0.1:1",
                                                    "precision": "fp8"}]}]}


def test_parser_takes_allowed_values_from_the_literal() -> None:
    for policy in get_args(PolicyName):
        assert parse_config(_config(policy=policy)).routing.policy == policy
    with pytest.raises(ConfigError, match="is not one of round_robin, least_load"):
        parse_config(_config(policy="random"))


def test_defaults_come_from_the_dataclasses() -> None:
    cfg = parse_config(_config())
    ep = cfg.models[0].endpoints[0]
    assert (ep.kind, ep.gpus, ep.weight, ep.upstream_model) == ("vllm", 1, 1.0, "m")
    assert cfg.routing == type(cfg.routing)()
    assert cfg.timeouts == type(cfg.timeouts)() and cfg.health == type(cfg.health)()
