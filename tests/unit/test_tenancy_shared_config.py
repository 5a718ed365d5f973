"""`tenant_controls.shared_store` at load (its DSN, the ledger's shared, `on_store_down`), and
admission through the shared store's leases: tokens settle back to the lease, and while the
store is down (open) to this replica's own bucket."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import ConfigError
from gateway.config import GatewayConfig, parse_config
from gateway.tenancy.admission import Admission
from gateway.tenancy.errors import TenantLimitError
from gateway.tenancy.shared import SharedRates
from tests.support.gateway import raw_config
from tests.support.rate_store import Clock, MemoryStore

EP = [{"name": "e", "url": "http://127.0.0.1:1", "precision": "bf16"}]
PG = "postgresql://wattgate@127.0.0.1:5432/rates"


def config(shared_store: Any, env: dict[str, str] | None = None, **extra: Any
           ) -> GatewayConfig:
    raw = raw_config(EP, tenant_controls={"shared_store": shared_store}, **extra)
    raw["tenants"][0]["limits"] = {"tokens_per_minute": 1000, "max_concurrent": 1}
    return parse_config(raw, env=env or {})


def test_the_store_is_given_by_dsn_or_dsn_env_or_shares_the_ledgers_postgres() -> None:
    store = config({"dsn": PG}).tenant_controls.shared_store
    assert store is not None and (store.dsn, store.on_store_down) == (PG, "open")
    store = config({"dsn_env": "RATES", "on_store_down": "closed", "timeout_s": 0.2},
                   {"RATES": PG}).tenant_controls.shared_store
    assert store is not None and (store.dsn, store.on_store_down, store.timeout_s) == (
        PG, "closed", 0.2)
    ledger = {"ledger": {"kind": "postgres", "dsn": PG + "-ledger"}}
    store = config({}, accounting=ledger).tenant_controls.shared_store
    assert store is not None and store.dsn == PG + "-ledger"
    assert parse_config(raw_config(EP), env={}).tenant_controls.shared_store is None


@pytest.mark.parametrize(("shared_store", "extra", "field"), [
    ({}, {}, "tenant_controls.shared_store.dsn"),  # no DSN and no postgres ledger
    ({}, {"accounting": {"ledger": {"kind": "sqlite", "path": "/tmp/x.db"}}},
     "tenant_controls.shared_store.dsn"),
    ({"dsn": PG, "dsn_env": "RATES"}, {}, "tenant_controls.shared_store.dsn"),
    ({"dsn_env": "UNSET"}, {}, "tenant_controls.shared_store.dsn_env"),
    ({"dsn": "redis://127.0.0.1"}, {}, "tenant_controls.shared_store.dsn"),
    # URLs asyncpg cannot parse: `serve` failed at start with a traceback
    ({"dsn": "postgres"}, {}, "tenant_controls.shared_store.dsn"),
    ({"dsn": "postgresql://u@db:notaport/x"}, {}, "tenant_controls.shared_store.dsn"),
    ({"dsn": "postgresql://u@[::1/x"}, {}, "tenant_controls.shared_store.dsn"),
    ({"dsn_env": "BAD"}, {}, "tenant_controls.shared_store.dsn_env"),
    ({"dsn": PG, "on_store_down": "maybe"}, {}, "tenant_controls.shared_store.on_store_down"),
    ({"dsn": PG, "timeout_s": 0}, {}, "tenant_controls.shared_store.timeout_s"),
    ({"dsn": PG, "lease": 5}, {}, "tenant_controls.shared_store.lease"),
])
def test_a_bad_shared_store_is_refused_naming_the_field(shared_store: dict[str, Any],
                                                        extra: dict[str, Any], field: str
                                                        ) -> None:
    with pytest.raises(ConfigError) as err:
        config(shared_store, {"RATES": PG, "BAD": "postgresql://db:99999/x"}, **extra)
    assert err.value.path == field


def admission(cfg: GatewayConfig, store: MemoryStore, clock: Clock) -> Admission:
    assert cfg.tenant_controls.shared_store is not None
    shared = SharedRates(cfg.tenant_controls.shared_store,
                         {t.name: t.limits for t in cfg.tenants if t.limits.any}, "r",
                         clock=clock, store=store)
    out = Admission(cfg, None, clock=clock, shared=shared)
    shared.on_replicas = out.set_replicas
    return out


async def test_tokens_taken_from_the_lease_go_back_to_it() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    adm = admission(config({"dsn": PG}), store, clock)
    assert adm.shared is not None
    await adm.shared.beat()
    tenant = adm.config.tenants[0]
    ticket = await adm.admit(tenant, "a", "m", 100, 300, None, {"bf16"})
    assert not ticket.local_rates and ticket.tokens == 400
    assert ticket.headers["x-ratelimit-limit-tokens"] == "1000"
    lease = adm.shared.leases["tenant-a"]["tpm"]
    with pytest.raises(TenantLimitError):  # the cap of 1 in flight: its 400 tokens go back
        await adm.admit(tenant, "b", "m", 100, 300, None, {"bf16"})
    level, _ = store.buckets[("tenant-a", "tpm")]
    assert lease.balance == 400.0 and level + lease.balance == 1000 - 400
    adm.shared.settle("tenant-a", ticket.tokens, 150)  # it used 150 of its 400
    assert lease.balance == 650.0


async def test_while_the_store_is_down_open_the_replicas_own_bucket_takes_and_settles(
        ) -> None:
    clock = Clock()
    store = MemoryStore(clock)
    store.live = {"r2", "r3"}  # two other live replicas: this one falls back to a third
    adm = admission(config({"dsn": PG}), store, clock)
    assert adm.shared is not None
    await adm.shared.beat()
    assert adm.shared.replicas == 3
    store.down = True
    await adm.shared.beat()
    tenant = adm.config.tenants[0]
    ticket = await adm.admit(tenant, "a", "m", 100, 200, None, {"bf16"})
    assert ticket.local_rates
    assert ticket.headers["x-ratelimit-limit-tokens"] == "333"
    assert ticket.headers["x-ratelimit-remaining-tokens"] == "33"
    with pytest.raises(TenantLimitError):
        await adm.admit(tenant, "b", "m", 10, 30, None, {"bf16"})  # no room in a third


async def test_a_store_down_from_the_start_is_logged_once_with_why(
        caplog: pytest.LogCaptureFixture) -> None:
    """A wrong DSN or a refused password: only the 503s (closed) or the fallback share (open)
    told of it, never the log."""
    clock = Clock()
    store = MemoryStore(clock)
    store.down = True
    adm = admission(config({"dsn": PG}), store, clock)
    assert adm.shared is not None
    with caplog.at_level("WARNING", logger="wattgate.tenancy"):
        await adm.shared.beat()
        await adm.shared.beat()  # tried again: not said again
    said = [r.getMessage() for r in caplog.records if "rate-limit store down" in r.getMessage()]
    assert len(said) == 1 and "connection refused" in said[0]
