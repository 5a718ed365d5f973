"""A gateway stopped and started again around an outage, through real processes (`wattgate
sim`, `wattgate serve` twice). Without a counter reset the ledger charges the downtime what
the counter grew by: within 1 % of the simulator's own count, no alarm. With the simulator's
counter reset mid-outage (POST /sim/reset-counter) the energy from the last stored reading to
the reset was never read: the gap is bridged with the idle-power estimate, so the ledger is
still within 1 % of the simulator's count, and `/admin/v1/energy-check` raises its alarm with
the estimated joules.

The simulator's count over the ledger's span is taken from two readings of its whole counter
(`/sim/stats`), one before the first gateway starts and one after the second stops, carried
to the span's ends at idle power. That holds only while the engine idles between each reading
and its end, so the traffic waits for the ledger's first interval to be committed (the
span starts after it) and the second gateway stops only once its ledger boundary is past the
last traffic: on a busy machine readiness may come before the second interval starts, and the
apportioner may lag the traffic by seconds.

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
    wall_s = stats["engine_start_unix_s"] + stats["engine_time_s"] / stats["time_scale"]
    return wall_s, stats["counter_j"]


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


def _boundary_s(tmp: Path) -> float | None:
    """The engine's ledger boundary (the end of its last committed interval), None before
    the first commit. Read-only: the gateway creates the ledger."""
    path = tmp / "ledger.db"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True,
                                                timeout=5.0)) as db:
            row = db.execute(
                "SELECT boundary_s FROM engine_state WHERE engine = 'e0'").fetchone()
    except sqlite3.OperationalError:  # no ledger, or no schema, yet
        return None
    return None if row is None else float(row[0])


def _wait_boundary(tmp: Path, past_s: float, timeout_s: float = 60.0) -> None:
    """Until the ledger has committed an interval ending at or after `past_s` (wall clock)."""
    deadline = time.monotonic() + timeout_s
    while (boundary_s := _boundary_s(tmp)) is None or boundary_s < past_s:
        assert time.monotonic() < deadline, (boundary_s, past_s)
        time.sleep(0.1)


def _wait_check(gw: str, gaps: int, timeout_s: float = 30.0) -> dict[str, Any]:
    """The energy check once this apportioner has read the counter (and found `gaps`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        row: dict[str, Any] = _http(gw + "/admin/v1/energy-check")["engines"]["e0"]
        if row.get("estimated_gaps", 0) >= gaps and row.get("unaccounted_j") is not None:
            return row
        assert time.monotonic() < deadline, row
        time.sleep(0.2)


@pytest.mark.parametrize("reset", [True, False], ids=["counter-reset", "plain-restart"])
def test_a_restart_over_an_outage_charges_the_downtime(tmp_path: Path, reset: bool) -> None:
    eport, gport = free_port(), free_port()
    engine, gw = f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{gport}"
    cfg = _config(tmp_path, engine, gport)
    sim = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "bf16",
                       "--port", str(eport))
    serve = wattgate_cmd("serve", "--config", str(cfg))
    with running(sim, engine + "/health", timeout_s=60, log=tmp_path / "sim.log"):
        idle_w = _http(engine + "/sim/energy")["idle_power_w"]
        first = _true_counter(engine)  # idle from here to the ledger's span
        with running(serve, gw + "/readyz", timeout_s=60, log=tmp_path / "gw1.log") as gw1:
            _wait_boundary(tmp_path, first[0])  # the span begins: traffic only inside it
            _traffic(gw, 20)
            time.sleep(3.0)  # apportioned past the traffic
            stop(gw1)
        if reset:
            time.sleep(OUTAGE_S * RESET_AT)
            _http(engine + "/sim/reset-counter", {}, method="POST")
            time.sleep(OUTAGE_S * (1 - RESET_AT))
        else:
            time.sleep(OUTAGE_S)
        with running(serve, gw + "/readyz", timeout_s=60, log=tmp_path / "gw2.log") as gw2:
            row = _wait_check(gw, gaps=1 if reset else 0)
            _traffic(gw, 10)
            # apportioned past the traffic, with an interval's margin for its last iteration
            _wait_boundary(tmp_path, time.time() + 1.0)
            stop(gw2)
        last = _true_counter(engine)  # idle since the ledger's span ended
    start_s, boundary_s, ledger_j = _ledger(tmp_path)
    assert first[0] <= start_s and boundary_s <= last[0], (first, start_s, boundary_s, last)
    # the simulator's own count over the ledger's span (both ends in idle time)
    true_j = (last[1] - idle_w * (last[0] - boundary_s)) - (first[1] + idle_w * (start_s - first[0]))
    unread_j = idle_w * OUTAGE_S * RESET_AT if reset else 0.0
    print(f"outage {OUTAGE_S:.0f} s, reset {reset}: ledger {ledger_j:.1f} J, simulator "
          f"{true_j:.1f} J ({(ledger_j - true_j) / true_j:+.3%}), unread {unread_j:.1f} J, "
          f"check {row}", file=sys.stderr)
    assert abs(ledger_j - true_j) <= 0.01 * true_j, (ledger_j, true_j, unread_j)
    log = (tmp_path / "gw2.log").read_text()
    if reset:
        assert row["alarm"] is True and row["estimated_gaps"] == 1, row
        # the estimate: idle power over the unread part of the gap (the engine idled throughout)
        assert row["estimated_j"] == pytest.approx(unread_j, rel=0.1), (row, unread_j)
        assert "estimated at" in log
    else:
        assert row["alarm"] is False and row["estimated_gaps"] == 0, row
        assert row["estimated_j"] == 0.0, row
        assert "estimated at" not in log
