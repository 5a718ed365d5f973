"""A gateway stopped while its accounting child hangs (SIGSTOP: alive, reading nothing): the
records the child never acknowledged go to the gateway's spill journal when the child is
gone, and the next start's child writes them, so every request answered 200 is in the ledger
after the restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.faults.test_fd_flood_accounting import _children
from tests.support.gateway import KEY_A, raw_config
from tests.support.procs import free_port, running, stop, wattgate_cmd

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]
MODEL = "llama-3.1-8b"


def _config(tmp: Path, engine: str, port: int) -> Path:
    raw: dict[str, Any] = raw_config(
        [{"name": "e0", "url": engine, "precision": "bf16", "model": MODEL}],
        listen={"host": "127.0.0.1", "port": port})
    raw["accounting"] = {"interval_s": 1, "flush_s": 0.3, "settle_s": 1.0,
                         "ledger": {"kind": "sqlite", "path": str(tmp / "ledger.db")}}
    path = tmp / "gw.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _request(gw: str, n: int) -> str:
    body = json.dumps({"model": "m", "prompt": f"hung {n}", "max_tokens": 4}).encode()
    req = urllib.request.Request(gw + "/v1/completions", data=body, headers={
        "Authorization": f"Bearer {KEY_A}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        rid = resp.headers["x-wattgate-request-id"]
        resp.read()
    return str(rid)


def test_records_a_hung_child_never_wrote_reach_the_ledger_after_a_restart(
        tmp_path: Path) -> None:
    eport, gport = free_port(), free_port()
    engine, gw = f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{gport}"
    cfg = _config(tmp_path, engine, gport)
    sim = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "bf16",
                       "--port", str(eport))
    serve = wattgate_cmd("serve", "--config", str(cfg))
    with running(sim, engine + "/health", timeout_s=60, log=tmp_path / "sim.log"):
        with running(serve, gw + "/readyz", timeout_s=60, log=tmp_path / "gw1.log") as gw1:
            (child,) = _children(gw1.pid)
            os.kill(child, signal.SIGSTOP)
            try:
                answered = {_request(gw, n) for n in range(30)}
                stop(gw1, wait_s=40.0)  # drains, then SIGTERM/SIGKILL to the hung child
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        log = (tmp_path / "gw1.log").read_text(errors="replace")
        with running(serve, gw + "/readyz", timeout_s=60, log=tmp_path / "gw2.log") as gw2:
            stop(gw2)
    with contextlib.closing(sqlite3.connect(tmp_path / "ledger.db")) as db:
        stored = {r[0] for r in db.execute("SELECT request_id FROM requests")}
    assert len(answered) == 30
    assert answered - stored == set(), log[-3000:]
