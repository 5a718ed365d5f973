"""A first hour without hand edits: every command refuses a taken port the same way before it
starts anything, and `wattgate sim fleet` writes the gateway config that names the ports its
engines took."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.procs import REPO, free_port, running, wattgate_cmd

pytestmark = pytest.mark.timeout(120)

EXAMPLES = REPO / "deploy" / "examples"


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def refusal(*args: str) -> tuple[int, str]:
    out = subprocess.run(wattgate_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=60)
    return out.returncode, out.stderr.strip()


def gateway_config(tmp: Path, port: int) -> Path:
    doc = yaml.safe_load((EXAMPLES / "local.yaml").read_text())
    doc["listen"]["port"] = port
    doc["accounting"]["ledger"] = {"kind": "sqlite", "path": str(tmp / "ledger.db")}
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_every_command_refuses_a_taken_port_with_one_line_and_starts_nothing(
        tmp_path: Path) -> None:
    with taken_port() as port:
        fleet = tmp_path / "fleet.yaml"
        doc = yaml.safe_load((EXAMPLES / "fleet.yaml").read_text())
        doc["engines"][1]["port"] = port  # the second engine's port: the first must not start
        fleet.write_text(yaml.safe_dump(doc))
        answers = {
            "serve": refusal("serve", "--config", str(gateway_config(tmp_path, port))),
            "sim": refusal("sim", "--gpu", "h100", "--model", "llama-3.1-8b", "--precision",
                           "bf16", "--port", str(port)),
            "sim fleet": refusal("sim", "fleet", str(fleet)),
            "demo --serve": refusal("demo", "--serve", "--out", str(tmp_path / "demo"),
                                    "--port", str(port)),
        }
    expected = (f"Error: cannot listen on 127.0.0.1:{port}: address already in use; "
                "pick another port (0 for a free one)")
    assert answers == dict.fromkeys(answers, (1, expected))
    # serve refused before it created the ledger or started its accounting child
    assert not (tmp_path / "ledger.db").exists()


def test_sim_fleet_writes_the_gateway_config_for_the_ports_it_took(tmp_path: Path) -> None:
    out = tmp_path / "gateway.yaml"
    log = tmp_path / "fleet.log"
    cmd = wattgate_cmd("sim", "fleet", str(EXAMPLES / "fleet.yaml"), "--base-port", "0",
                       "--gateway-config", str(EXAMPLES / "local.yaml"),
                       "--write-gateway-config", str(out))
    with running(cmd, log=log):
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert out.exists(), log.read_text()
        ready = dict(line.split()[1:] for line in log.read_text().splitlines()
                     if line.startswith("ready "))
        doc = yaml.safe_load(out.read_text())
    urls = {ep["name"]: ep["url"] for pool in doc["models"] for ep in pool["endpoints"]}
    assert urls == ready and len(ready) == 5
    assert all(":810" not in url for url in urls.values())  # none left at a configured port
    meters = [m["url"] for m in doc["accounting"]["meters"].values() if "url" in m]
    assert meters and set(meters) <= set(ready.values())
    check = subprocess.run(wattgate_cmd("config", "check", str(out)), cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert free_port()  # the fleet stopped with the test


def test_the_written_config_keeps_the_source_configs_relative_paths(tmp_path: Path) -> None:
    from engines.sim.fleet import write_gateway_config
    from gateway.config import load_config

    target = tmp_path / "elsewhere" / "gateway.yaml"
    target.parent.mkdir()
    write_gateway_config(EXAMPLES / "local.yaml", target, {})
    original, copy = load_config(EXAMPLES / "local.yaml"), load_config(target)
    assert original.accounting is not None and copy.accounting is not None
    assert copy.accounting.ledger.path == original.accounting.ledger.path
    assert copy.accounting.journal == original.accounting.journal


def test_the_config_is_written_into_a_folder_a_fresh_clone_does_not_have(tmp_path: Path) -> None:
    """`--write-gateway-config out/gateway.yaml` on a fresh clone: out/ is created."""
    from engines.sim.fleet import write_gateway_config

    target = tmp_path / "out" / "gateway.yaml"
    write_gateway_config(EXAMPLES / "local.yaml", target, {})
    assert yaml.safe_load(target.read_text())["models"]
