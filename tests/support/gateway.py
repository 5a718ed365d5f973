"""Build gateway configs and run the gateway app in-process for tests."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from gateway.app import build_app
from gateway.config import GatewayConfig, parse_config
from gateway.front.server import start
from gateway.proxy import Sink
from tests.support.fake_engine import serving

KEY_A = "sk-test-tenant-a"
KEY_B = "sk-test-tenant-b"
ADMIN_KEY = "sk-test-admin"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def raw_config(endpoints: Sequence[dict[str, Any]], model: str = "m", **extra: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "slo_classes": {"interactive": {"ttft_s": 0.5, "tpot_s": 0.05},
                        "batch": {"ttft_s": 10.0}},
        "tenants": [
            {"name": "tenant-a", "api_key_sha256": digest(KEY_A), "slo_class": "interactive"},
            {"name": "tenant-b", "api_key_sha256": digest(KEY_B), "slo_class": "batch",
             "precisions": {"allowed": ["int4", "fp8"], "preferred": ["int4"]}},
        ],
        "admin": {"api_key_sha256": digest(ADMIN_KEY)},
        "models": [{"name": model, "endpoints": list(endpoints)}],
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 1},
        "retries": {"max_attempts": 3, "deadline_s": 5},
    }
    raw.update(extra)
    return raw


def make_config(endpoints: Sequence[dict[str, Any]], **extra: Any) -> GatewayConfig:
    return parse_config(raw_config(endpoints, **extra), env={})


@contextlib.asynccontextmanager
async def running_gateway(config: GatewayConfig, sinks: Sequence[Sink] = (), *,
                          handler_cancellation: bool = True, front: bool = True
                          ) -> AsyncIterator[str]:
    """Serve the gateway on a free 127.0.0.1 port, as `wattgate serve` does (lean front, aiohttp
    behind it); `front=False` serves everything through aiohttp alone."""
    app = build_app(config, sinks=sinks)
    if not front:
        async with serving(app, handler_cancellation=handler_cancellation) as port:
            yield f"http://127.0.0.1:{port}"
        return
    running = await start(dataclasses.replace(config, listen=dataclasses.replace(config.listen, port=0)), app,
                          cancel_on_disconnect=handler_cancellation)
    try:
        yield f"http://127.0.0.1:{running.port}"
    finally:
        await running.stop()
