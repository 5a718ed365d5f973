"""An engine's energy counter reset while no gateway runs: the energy from the last stored
reading to the reset was never read. Through real processes (`wattgate sim`, `wattgate serve`
stopped, the simulator's counter reset mid-outage with POST /sim/reset-counter, the gateway
started again): the gap is bridged with the idle-power estimate, so the ledger holds the
engine's energy within 1 % of the simulator's own count, and `/admin/v1/energy-check` raises
its alarm with the estimated joules.

`WATTGATE_TEST_OUTAGE_S` sets the outage (default 20 s)."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.gateway import ADMIN_KEY, KEY_A, raw_config
from tests.support.procs import free_port, running, stop, wattgate_cmd

OUTAGE_S = float(os.environ.get("WATTGATE_TEST_OUTAGE_S", "20"))
pytestmark = [pytest.mark.timeout(120 + 2 * OUTAGE_S), pytest.mark.slow]
MODEL = "llama-3.1-8b"
RESET_AT = 2 / 3  # of the outage: the unread gap is two thirds of it


def _http(url: str, data: dict[str, Any] | None = None, key: str = ADMIN_KEY,
          method: str | None = None) -> Any:
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, method=method, headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _config(tmp: Path, engine: str, port: int) -> Path:
    raw = raw_config([{"name": "e0", "url": engine, "precision": "bf16"}], model=MODEL,
                     listen={"host": "127.0.0.1", "port": port})
    raw["accounting"] = {"interval_s": 1, "settle_s": 1, "poll_s": 0.1, "flush_s": 0.3,
                         "hold_s": 5,
                         "ledger": {"kind": "sqlite", "path": str(tmp / "ledger.db")},
                         "meters": {"e0": {"kind": "sim", "url": engine}}}
    path = tmp / "gw.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _true_counter(engine: str) -> tuple[float, float]:
    """(wall-clock time, the simulator's whole energy then): never reset."""
    stats = _http(engine + "/sim/stats")
    return stats["engine_start_unix_s"] + stats["engine_time_s"], stats["counter_j"]


def _traffic(gw: str, n: int) -> None:
    for i in range(n):
        _http(gw + "/v1/completions", {"model": MODEL, "prompt": f"reset {i}",
                                       "max_tokens": 16}, key=KEY_A)


def _ledger(tmp: Path) -> tuple[float, float, float]:
    """(the second interval's start, the engine's boundary, joules of the intervals between):
    the first holds only what followed the first reading, somewhere inside it."""
    with contextlib.closing(sqlite3.connect(tmp / "ledger.db")) as db:
        start_s, energy_j = db.execute(
            "SELECT MIN(start_s), SUM(energy_j) FROM intervals WHERE engine = 'e0' AND "
            "interval_idx > (SELECT MIN(interval_idx) FROM intervals WHERE engine = 'e0')"
        ).fetchone()
        boundary_s = db.execute(
            "SELECT boundary_s FROM engine_state WHERE engine = 'e0'").fetchone()[0]
    return float(start_s), float(boundary_s), float(energy_j)


def _wait_check(gw: str, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        row: dict[str, Any] = _http(gw + "/admin/v1/energy-check")["engines"]["e0"]
        if row.get("estimated_gaps") and row.get("unaccounted_j") is not None:
            return row
        assert time.monotonic() < deadline, row
        time.sleep(0.2)


def test_a_counter_reset_during_an_outage_is_bridged_and_the_check_says_so(
        tmp_path: Path) -> None:
    eport, gport = free_port(), free_port()
    engine, gw = f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{gport}"
    cfg = _config(tmp_path, engine, gport)
    sim = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "bf16",
                       "--port", str(eport))
    serve = wattgate_cmd("serve", "--config", str(cfg))
    with running(sim, engine + "/health", timeout_s=60, log=tmp_path / "sim.log"):
        idle_w = _http(engine + "/sim/energy")["idle_power_w"]
        first = _true_counter(engine)  # idle from here to the traffic
        with running(serve, gw + "/readyz", timeout_s=60, log=tmp_path / "gw1.log") as gw1:
            _traffic(gw, 20)
            time.sleep(3.0)  # apportioned past the traffic
            stop(gw1)
        time.sleep(OUTAGE_S * RESET_AT)
        _http(engine + "/sim/reset-counter", {}, method="POST")
        time.sleep(OUTAGE_S * (1 - RESET_AT))
        with running(serve, gw + "/readyz", timeout_s=60, log=tmp_path / "gw2.log") as gw2:
            row = _wait_check(gw)
            _traffic(gw, 10)
            time.sleep(4.0)  # apportioned past the traffic: idle again
            stop(gw2)
        last = _true_counter(engine)  # idle since the traffic
    start_s, boundary_s, ledger_j = _ledger(tmp_path)
    # the simulator's own count over the ledger's span (both ends in idle time)
    true_j = (last[1] - idle_w * (last[0] - boundary_s)) - (first[1] + idle_w * (start_s - first[0]))
    unread_j = idle_w * OUTAGE_S * RESET_AT
    print(f"outage {OUTAGE_S:.0f} s: ledger {ledger_j:.1f} J, simulator {true_j:.1f} J "
          f"({(ledger_j - true_j) / true_j:+.3%}), unread {unread_j:.1f} J, check {row}",
          file=sys.stderr)
    assert row["alarm"] is True and row["estimated_gaps"] == 1, row
    # the estimate: idle power over the unread part of the gap (the engine idled throughout)
    assert row["estimated_j"] == pytest.approx(unread_j, rel=0.1), (row, unread_j)
    assert abs(ledger_j - true_j) <= 0.01 * true_j, (ledger_j, true_j, unread_j)
    assert "estimated at" in (tmp_path / "gw2.log").read_text()
