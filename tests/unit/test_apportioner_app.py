"""The apportioner process's HTTP side: /metrics and /energy-check need the config's metrics
key (or its admin key, or the supervising gateway's token) when one is set, and are open when
none is; /healthz stays open and reports a ledger that refuses all work; the CLI listens on
127.0.0.1 unless told otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from accounting.config import AccountingConfig, LedgerConfig
from accounting.mode import APPORTIONER_ONLY
from accounting.process import apportioner_app
from accounting.service import AccountingService
from gateway.apportioner_cli import apportioner
from gateway.auth import Authenticator
from tests.support.fake_engine import serving
from tests.support.gateway import ADMIN_KEY, KEY_A, digest, make_config

pytestmark = pytest.mark.timeout(30)

METRICS_KEY = "sk-test-metrics"
TOKEN = "gateway-token"


@pytest.fixture
def service(tmp_path: Path) -> AccountingService:
    config = AccountingConfig(ledger=LedgerConfig(kind="sqlite", path=str(tmp_path / "l.db")))
    return AccountingService(config, [], registry=CollectorRegistry(),
                             mode=APPORTIONER_ONLY)


async def _serve(service: AccountingService, *, metrics_key: bool
                 ) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    extra = {"metrics": {"api_key_sha256": digest(METRICS_KEY)}} if metrics_key else {}
    auth = Authenticator(make_config(
        [{"name": "e0", "url": "http://127.0.0.1:9", "precision": "bf16"}], **extra))
    registry = CollectorRegistry()
    app = apportioner_app(service, registry, auth, TOKEN)
    async with serving(app) as port, aiohttp.ClientSession() as session:
        yield f"http://127.0.0.1:{port}", session


async def _status(session: aiohttp.ClientSession, url: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with session.get(url, headers=headers) as resp:
        await resp.read()
        return resp.status


async def test_a_metrics_key_guards_metrics_and_energy_check(service: AccountingService) -> None:
    async for base, session in _serve(service, metrics_key=True):
        for path in ("/metrics", "/energy-check"):
            assert await _status(session, base + path) == 401
            assert await _status(session, base + path, KEY_A) == 401  # a tenant's key
            assert await _status(session, base + path, "gateway-token-not") == 401
            assert await _status(session, base + path, METRICS_KEY) == 200
            assert await _status(session, base + path, ADMIN_KEY) == 200
            assert await _status(session, base + path, TOKEN) == 200
        assert await _status(session, base + "/healthz") == 200  # liveness: open


async def test_without_a_metrics_key_metrics_are_open(service: AccountingService) -> None:
    async for base, session in _serve(service, metrics_key=False):
        assert await _status(session, base + "/metrics") == 200
        assert await _status(session, base + "/energy-check") == 200


async def test_healthz_reports_a_ledger_fault(service: AccountingService) -> None:
    async for base, session in _serve(service, metrics_key=False):
        async with session.get(base + "/healthz") as resp:
            assert (await resp.json())["ledger_fault"] is None
        service.ledger.fault = "sqlite ledger l.db was deleted while open"  # type: ignore[attr-defined]
        async with session.get(base + "/healthz") as resp:
            assert resp.status == 200  # alive: a restart would not mend the ledger
            assert (await resp.json())["ledger_fault"] == "sqlite ledger l.db was deleted while open"


def test_the_cli_listens_on_loopback_by_default() -> None:
    host = next(p for p in apportioner.params if p.name == "host")
    assert host.default == "127.0.0.1"
    out = CliRunner().invoke(apportioner, ["--help"]).output
    assert "127.0.0.1" in out and "0.0.0.0 for a" in out
