"""The accounting mode is decided once, by `accounting_mode`: each config and launch (and
`wattgate apportioner` flags) gives its mode, a gateway runs exactly the roles of its mode
(built in code, and as `wattgate serve` with its child), and no other code compares the
configured `accounting.apportioner` to decide a role."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from accounting.config import AccountingConfig
from accounting.mode import (
    APPORTIONER_ONLY,
    INLINE,
    OFF,
    RECORDER_ONLY,
    AccountingMode,
    Launch,
    accounting_mode,
)
from accounting.supervisor import ApportionerChild
from core.errors import ConfigError
from core.vocab import APPORTIONER_MODES, ApportionerMode
from gateway.app import build_app
from gateway.appkeys import ACCOUNTING
from tests.integration.test_apportioner_process import (
    MODEL,
    _config,
    children,
    final,
    get,
    healthy,
    traffic,
    wait_for,
)
from tests.support.gateway import make_config, raw_config
from tests.support.procs import free_port, running, wattgate_cmd

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("core", "wire", "engines", "accounting", "gateway", "loadgen")


def acct(apportioner: ApportionerMode = "process", enabled: bool = True) -> AccountingConfig:
    return AccountingConfig(enabled=enabled, apportioner=apportioner)


CHILD_APPORTIONS = AccountingMode("child", "child")
CHILD_RECORDS = AccountingMode("child", "elsewhere")


@pytest.mark.parametrize(("config", "launch", "expected"), [
    (acct("process"), "serve", CHILD_APPORTIONS),
    (acct("external"), "serve", CHILD_RECORDS),
    (acct("inline"), "serve", INLINE),
    (acct("process"), "code", INLINE),
    (acct("inline"), "code", INLINE),
    (acct("external"), "code", RECORDER_ONLY),
    (None, "serve", OFF),
    (None, "code", OFF),
    (acct("process", enabled=False), "serve", OFF),
    (acct("external", enabled=False), "code", OFF),
])
def test_each_config_and_launch_gives_its_mode(config: AccountingConfig | None, launch: Launch,
                                               expected: AccountingMode) -> None:
    assert accounting_mode(config, launch) == expected


@pytest.mark.parametrize("apportioner", APPORTIONER_MODES)
def test_the_apportioner_flags_give_its_roles_whatever_the_configured_place(
        apportioner: ApportionerMode) -> None:
    config = acct(apportioner)
    assert accounting_mode(config, "apportioner") == APPORTIONER_ONLY
    assert accounting_mode(config, "apportioner", records_fd=True) == INLINE
    assert accounting_mode(config, "apportioner", records_fd=True,
                           record_only=True) == RECORDER_ONLY


@pytest.mark.parametrize(("config", "launch", "flags", "path"), [
    (None, "apportioner", {}, "accounting"),
    (acct(enabled=False), "apportioner", {"records_fd": True}, "accounting"),
    (acct(), "apportioner", {"record_only": True}, "--record-only"),
    (acct(), "serve", {"records_fd": True}, "--records-fd"),
    (acct(), "code", {"record_only": True}, "--records-fd"),
])
def test_a_combination_that_cannot_run_is_refused_naming_what(
        config: AccountingConfig | None, launch: Launch, flags: dict[str, bool],
        path: str) -> None:
    with pytest.raises(ConfigError) as err:
        accounting_mode(config, launch, **flags)
    assert err.value.path == path


@pytest.mark.parametrize("apportioner", ["process", "external"])
def test_the_child_is_started_with_flags_that_read_back_as_its_mode(
        apportioner: ApportionerMode) -> None:
    """The gateway's mode decides the child's; the child's flags carry it, unchanged."""
    mode = accounting_mode(acct(apportioner), "serve")
    assert mode.child is not None
    argv = ApportionerChild("gw.yaml", mode=mode.child).argv(records_fd=7)
    read_back = accounting_mode(acct(apportioner), "apportioner",
                                records_fd="--records-fd" in argv,
                                record_only="--record-only" in argv)
    assert read_back == mode.child
    assert read_back.apportions_here == (apportioner == "process")


def _compares_to_a_place(node: ast.AST) -> bool:
    return isinstance(node, ast.Compare) and any(
        isinstance(side, ast.Constant) and side.value in APPORTIONER_MODES
        for side in (node.left, *node.comparators))


def test_the_mode_is_decided_in_one_function() -> None:
    """Only `accounting.mode.accounting_mode` compares a value to an `accounting.apportioner`
    place; everything else reads the mode it returned."""
    found: list[str] = []
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for fn in ast.walk(tree):
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    found += [f"{path.relative_to(ROOT)}:{fn.name}" for node in ast.walk(fn)
                              if _compares_to_a_place(node)]
            found += [f"{path.relative_to(ROOT)}:<module>" for node in tree.body
                      if any(_compares_to_a_place(n) for n in ast.walk(node))
                      and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef
                                         | ast.ClassDef)]
    assert set(found) == {"accounting/mode.py:accounting_mode"}


def _gateway_config(tmp_path: Path, accounting: dict[str, Any] | None) -> Any:
    extra = {} if accounting is None else {"accounting": {
        "ledger": {"kind": "sqlite", "path": str(tmp_path / "l.db")}, **accounting}}
    return make_config([{"name": "e0", "url": "http://127.0.0.1:9", "precision": "bf16"}],
                       **extra)


@pytest.mark.parametrize(("accounting", "expected"), [
    ({"apportioner": "process"}, INLINE),
    ({"apportioner": "inline"}, INLINE),
    ({"apportioner": "external"}, RECORDER_ONLY),
    ({"enabled": False}, OFF),
    (None, OFF),
])
def test_an_app_built_in_code_runs_the_roles_of_its_mode(
        tmp_path: Path, accounting: dict[str, Any] | None, expected: AccountingMode) -> None:
    app = build_app(_gateway_config(tmp_path, accounting))
    if not expected.enabled:
        assert ACCOUNTING not in app
        return
    service = app[ACCOUNTING]
    assert service.mode == expected
    assert (service.recorder is not None) == expected.records_here
    assert (service.apportioner is not None) == expected.apportions_here
    assert (service.poller is not None) == expected.apportions_here
    assert service.link is None


def test_the_apportioner_command_refuses_flags_and_configs_that_cannot_run(
        tmp_path: Path) -> None:
    from gateway.apportioner_cli import apportioner

    cfg = tmp_path / "gw.yaml"
    raw = raw_config([{"name": "e0", "url": "http://127.0.0.1:9", "precision": "bf16"}])
    cfg.write_text(yaml.safe_dump({**raw, "accounting": {"enabled": False}}))
    result = CliRunner().invoke(apportioner, ["--config", str(cfg)])
    assert result.exit_code == 2
    assert "invalid config: accounting: the apportioner needs accounting enabled" in result.output
    cfg.write_text(yaml.safe_dump({**raw, "accounting": {
        "ledger": {"kind": "sqlite", "path": str(tmp_path / "l.db")}}}))
    result = CliRunner().invoke(apportioner, ["--config", str(cfg), "--record-only"])
    assert result.exit_code == 2
    assert "--record-only: needs --records-fd" in result.output


@pytest.mark.timeout(150)
@pytest.mark.parametrize("apportioner", ["process", "external", "inline"])
def test_serve_runs_in_the_mode_of_its_config(tmp_path: Path,
                                              apportioner: ApportionerMode) -> None:
    """`wattgate serve`: a child for `process` (it records and apportions) and `external`
    (it only records: nothing here apportions), none for `inline` (the gateway does both)."""
    eport, gport = free_port(), free_port()
    engine = f"http://127.0.0.1:{eport}"
    cfg = _config(tmp_path, engine, apportioner)
    sim = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "bf16",
                       "--port", str(eport))
    gw = f"http://127.0.0.1:{gport}"
    with running(sim, engine + "/health", timeout_s=60), \
            running(wattgate_cmd("serve", "--config", str(cfg), "--port", str(gport)),
                    gw + "/readyz", log=tmp_path / "gw.log", timeout_s=60) as proc:
        kids = children(proc.pid)
        assert len(kids) == (0 if apportioner == "inline" else 1)
        if kids:
            argv = Path(f"/proc/{kids[0]}/cmdline").read_bytes().split(b"\0")
            assert b"--records-fd" in argv
            assert (b"--record-only" in argv) == (apportioner == "external")
        wait_for("a healthy engine", lambda: healthy(gw))
        ids = traffic(gw, 3)
        if apportioner == "external":  # written by the child, never apportioned here
            wait_for("the requests in the ledger",
                     lambda: all(get(f"{gw}/admin/v1/requests/{rid}")[0] == 200
                                 for rid in ids))
            assert not any(json.loads(get(f"{gw}/admin/v1/requests/{rid}")[1])["final"]
                           for rid in ids)
            assert get(f"{gw}/admin/v1/energy-check")[0] == 503
        else:
            wait_for("the requests apportioned", lambda: final(gw, ids))
            assert get(f"{gw}/admin/v1/energy-check")[0] == 200
