"""The replicas mode's one config rewrite (tests/support/replicas.py): each replica of a test's
gateway gets its own port and journal, the one PostgreSQL ledger, and the shared rate store
exactly where a tenant has a rate limit; the rest of the test's config is kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import yaml

from gateway.config import parse_config
from tests.support.gateway import raw_config
from tests.support.replicas import replica_configs

DSN = "postgresql://wattgate@127.0.0.1:5999/postgres"


def _write(tmp_path: Path, **extra: Any) -> Path:
    raw = raw_config([{"name": "e1", "url": "http://127.0.0.1:9", "precision": "bf16"}],
                     **extra)
    path = tmp_path / "gateway.yaml"
    path.write_bytes(orjson.dumps(raw))  # JSON, as the fault tests write it
    return path


def test_each_replica_shares_the_ledger_with_its_own_port_and_journal(tmp_path: Path) -> None:
    config = _write(tmp_path, accounting={"interval_s": 1, "failed_energy": "tenant",
                                          "ledger": {"kind": "sqlite", "path": "x.db"}})
    got = replica_configs(config, DSN, 3)
    assert len({port for _, port in got}) == 3
    parsed = [parse_config(yaml.safe_load(path.read_text()), env={}, base_dir=tmp_path)
              for path, _ in got]
    assert [c.listen.port for c in parsed] == [port for _, port in got]
    for c in parsed:
        assert c.accounting is not None
        assert (c.accounting.ledger.kind, c.accounting.ledger.dsn) == ("postgres", DSN)
        assert c.accounting.failed_energy == "tenant" and c.accounting.interval_s == 1
    journals = {c.accounting.journal.path for c in parsed if c.accounting is not None}
    assert len(journals) == 3
    assert all(not yaml.safe_load(p.read_text()).get("tenant_controls") for p, _ in got)


def test_a_gateway_without_accounting_gets_the_ledger_and_limits_get_the_shared_store(
        tmp_path: Path) -> None:
    tenants = raw_config([])["tenants"]
    tenants[0]["limits"] = {"requests_per_minute": 2}
    config = _write(tmp_path, tenants=tenants)
    (path, _), *_ = replica_configs(config, DSN, 3)
    doc = yaml.safe_load(path.read_text())
    assert doc["accounting"]["ledger"] == {"kind": "postgres", "dsn": DSN}
    assert doc["tenant_controls"]["shared_store"] == {"on_store_down": "closed"}
    assert doc["tenants"][0]["limits"] == {"requests_per_minute": 2}
    parse_config(doc, env={}, base_dir=tmp_path)  # a config the gateway accepts


def test_a_concurrency_cap_alone_needs_no_rate_store(tmp_path: Path) -> None:
    tenants = raw_config([])["tenants"]
    tenants[1]["limits"] = {"max_concurrent": 5}  # held through the ledger already
    (path, _), *_ = replica_configs(_write(tmp_path, tenants=tenants), DSN, 2)
    assert "tenant_controls" not in yaml.safe_load(path.read_text())
