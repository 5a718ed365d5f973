"""Config validation: typed frozen objects, errors that name the field, CLI exit codes."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from core.errors import ConfigError
from gateway.config import load_config, parse_config
from tests.support.gateway import raw_config
from tests.support.procs import REPO, free_port, wattgate_cmd

EP = {"name": "e1", "url": "http://127.0.0.1:9", "precision": "bf16"}


def test_quickstart_config_loads_into_frozen_objects() -> None:
    cfg = load_config(REPO / "deploy/examples/local.yaml")
    assert [ep.precision for ep in cfg.models[0].endpoints] == ["bf16", "fp8", "int8", "int4", "fp8"]
    assert cfg.models[0].endpoints[4].kind == "trtllm"
    with pytest.raises(AttributeError):
        cfg.listen.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(("mutate", "path", "words"), [
    (lambda r: r["models"][0]["endpoints"][0].update(precision="fp4"),
     "models[0].endpoints[0].precision", "bf16, fp16, fp8, int8, int4"),
    (lambda r: r["models"][0]["endpoints"][0].update(kind="tgi"),
     "models[0].endpoints[0].kind", "vllm, trtllm, openai"),
    (lambda r: r["models"][0]["endpoints"][0].pop("url"), "models[0].endpoints[0].url", "required"),
    (lambda r: r["models"][0]["endpoints"][0].update(colour="red"),
     "models[0].endpoints[0].colour", "unknown field"),
    (lambda r: r.update(routing={"policy": "random"}), "routing.policy", "round_robin"),
    (lambda r: r["tenants"][0].update(slo_class="gold"), "tenants[0].slo_class", "interactive"),
    (lambda r: r["tenants"][0].pop("api_key_sha256"), "tenants[0].api_key_env", "required"),
    (lambda r: r["tenants"][0].update(api_key_sha256=None, api_key_env="NO_SUCH_VAR"),
     "tenants[0].api_key_env", "unset"),
    (lambda r: r.update(timeouts={"read_s": -1}), "timeouts.read_s", "> 0"),
    (lambda r: r.update(models=[]), "models", "non-empty"),
    # past 64 bits: `config check` failed printing it (orjson) with a traceback
    (lambda r: r.update(outlier_detection={"failure_percentage_request_volume": 10**30}),
     "outlier_detection.failure_percentage_request_volume", "at most 9223372036854775807"),
    # a section written `false` is refused, not read as an empty one (every default: on)
    (lambda r: r.update(accounting={"journal": False}), "accounting.journal",
     "expected a mapping"),
    (lambda r: r.update(accounting={"ledger": {"kind": "postgres", "dsn": "postgresql://h/db"}},
                        tenant_controls={"shared_store": False}),
     "tenant_controls.shared_store", "expected a mapping"),
    (lambda r: r.update(outlier_detection=False), "outlier_detection", "expected a mapping"),
    (lambda r: r.update(routing={"min_quality": False}), "routing.min_quality", "mapping"),
    (lambda r: r.update(accounting={"meters": False}), "accounting.meters", "mapping"),
    # names the ledger and metrics carry: a NUL failed every PostgreSQL ledger batch holding
    # one of the tenant's requests
    (lambda r: r["tenants"][0].update(name="acme\x00"), "tenants[0].name", "control"),
    (lambda r: r["models"][0].update(name="m\nx"), "models[0].name", "control"),
    (lambda r: r["models"][0]["endpoints"][0].update(name="e\ud800"),
     "models[0].endpoints[0].name", "control"),
    # limits, budgets and bills go by the tenant's name: two entries of one name would mix
    (lambda r: r["tenants"].append({**r["tenants"][0], "api_key_sha256": "b" * 64}),
     "tenants[2].name", "names two tenants"),
])
def test_bad_config_names_the_field(mutate, path: str, words: str) -> None:  # type: ignore[no-untyped-def]
    raw = raw_config([dict(EP)])
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        parse_config(raw, env={})
    assert info.value.path == path
    assert words in info.value.message


def test_api_key_from_env_is_hashed_not_kept() -> None:
    raw = raw_config([dict(EP)])
    raw["tenants"][0].pop("api_key_sha256")
    raw["tenants"][0]["api_key_env"] = "ACME_KEY"
    cfg = parse_config(raw, env={"ACME_KEY": "sk-secret-value"})
    assert "sk-secret-value" not in repr(cfg)
    assert len(cfg.tenants[0].key_sha256) == 64


def test_config_check_prints_normalised_config_and_hides_keys(tmp_path: Path) -> None:
    out = subprocess.run(wattgate_cmd("config", "check", str(REPO / "deploy/examples/local.yaml")),
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert '"policy": "least_load"' in out.stdout
    assert "d4ffc8c0325f" not in out.stdout  # digests are not echoed either
    assert "ok (1 models, 5 endpoints, 3 tenants)" in out.stderr


def test_config_check_hides_every_dsn(tmp_path: Path) -> None:
    """The shared rate store's DSN (and its password) was printed as given."""
    raw = raw_config([dict(EP)], accounting={"ledger": {
        "kind": "postgres", "dsn": "postgresql://u:ledger-pw@db/x"}},
        tenant_controls={"shared_store": {"dsn": "postgresql://u:rates-pw@db/y"}})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = subprocess.run(wattgate_cmd("config", "check", str(path)), capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "-pw" not in out.stdout and out.stdout.count('"dsn": "<set>"') == 2


def test_serve_with_bad_config_exits_nonzero_before_binding(tmp_path: Path) -> None:
    raw = raw_config([{**EP, "precision": "fp4"}])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    port = free_port()
    out = subprocess.run(wattgate_cmd("serve", "--config", str(path), "--port", str(port)),
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 2
    assert "models[0].endpoints[0].precision" in out.stderr
    assert "Traceback" not in out.stderr
    with socket.socket() as s:  # nothing is listening there
        assert s.connect_ex(("127.0.0.1", port)) != 0
