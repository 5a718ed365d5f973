"""Validate a wattgate gateway config document the way `wattgate serve` would."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.errors import ConfigError
from gateway.config import GatewayConfig, parse_config


def gateway_knows_accounting() -> bool:
    """True once the gateway config accepts an `accounting:` section."""
    probe = {"auth_required": False, "models": [{"name": "m", "endpoints": [
        {"url": "http://127.0.0.1:1", "precision": "bf16"}]}], "accounting": {}}
    try:
        parse_config(probe, env={})
    except ConfigError as exc:
        if exc.path == "accounting":
            return False
        raise
    return True


def validate(doc: Any, env: Mapping[str, str]) -> GatewayConfig:
    """Parse a whole gateway config; raises ConfigError naming the bad field.

    While the gateway config does not know `accounting:` yet, that section is validated on its
    own with the accounting parser, and its meters must name endpoints of the config.
    """
    if gateway_knows_accounting() or "accounting" not in doc:
        return parse_config(doc, env)
    from accounting.config import parse_accounting

    config = parse_config({k: v for k, v in doc.items() if k != "accounting"}, env)
    accounting = parse_accounting(doc["accounting"], env)
    endpoints = {ep.name for pool in config.models for ep in pool.endpoints}
    for name, _ in accounting.meters:
        if name not in endpoints:
            raise ConfigError(f"accounting.meters.{name}", "is not an endpoint of the config")
    return config
