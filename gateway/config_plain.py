"""The gateway config as plain data, for `wattgate config check`, with its secrets masked."""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.config import GatewayConfig


def normalised(config: GatewayConfig) -> dict[str, Any]:
    """The config as plain data for `wattgate config check`; secrets (every field declared
    `repr=False`: API key digests, DSNs, a meter's key) shown only as present."""
    out = _plain(config)
    assert isinstance(out, dict)
    return out


def _plain(value: Any) -> Any:
    """`dataclasses.asdict`, with each `repr=False` field's value replaced by whether it is set
    (asdict keeps no field's declaration, so it cannot be masked after)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: (("<set>" if getattr(value, f.name) else "<unset>") if not f.repr
                         else _plain(getattr(value, f.name)))
                for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
