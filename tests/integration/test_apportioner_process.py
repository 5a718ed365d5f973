"""The apportioner as a process of its own, through real processes: `wattgate serve` over a
simulated engine starts it as a child; traffic through the gateway is apportioned by the child
(conserving the engine's metered energy), its counters reach the gateway's /metrics, and a
killed child is restarted and goes on where the ledger says its predecessor stopped; a hung one
(SIGSTOP) is found by its liveness probe, killed and restarted, and scrapes never wait on it.
The config sets a metrics key: the child's series reach the gateway with the gateway's token."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.config import CHILD_NICE
from tests.support.gateway import ADMIN_KEY, KEY_A, digest, raw_config
from tests.support.procs import free_port, running, wattgate_cmd

pytestmark = pytest.mark.timeout(120)

MODEL = "llama-3.1-8b"


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with open(task / "children") as f:
            out += [int(p) for p in f.read().split()]
    return out


def wait_for(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise TimeoutError(f"{what} not seen after {timeout_s} s")


def get(url: str, key: str = ADMIN_KEY) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def complete(gw: str, key: str, stream: bool) -> str:
    """One completion; the gateway's request id (the ledger's key)."""
    body = {"model": MODEL, "prompt": [1] * 200, "max_tokens": 24, "min_tokens": 24,
            "stream": stream}
    req = urllib.request.Request(
        f"{gw}/v1/completions", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return str(resp.headers["x-wattgate-request-id"])
    except urllib.error.HTTPError as exc:
        with exc:
            raise AssertionError(f"{exc.code} {exc.read()!r}") from None


def traffic(gw: str, n: int) -> list[str]:
    """`n` requests (bounded), streamed and not (tenant-a: tenant-b may not use bf16)."""
    return [complete(gw, KEY_A, stream=i % 3 != 0) for i in range(n)]


def healthy(gw: str) -> bool:
    status, body = get(f"{gw}/admin/v1/endpoints")
    return status == 200 and all(e["healthy"] for e in json.loads(body)["endpoints"])


def final(gw: str, ids: list[str]) -> bool:
    for rid in ids:
        status, body = get(f"{gw}/admin/v1/requests/{rid}")
        if status != 200 or not json.loads(body)["final"]:
            return False
    return True


def ledger_totals(path: Path) -> dict[str, Any]:
    with sqlite3.connect(path) as db:
        intervals = db.execute("SELECT interval_idx, energy_j, idle_j FROM intervals "
                               "WHERE engine = 'e0' ORDER BY interval_idx").fetchall()
        shares = db.execute("SELECT COALESCE(SUM(energy_j), 0) FROM shares "
                            "WHERE engine = 'e0'").fetchone()[0]
        state = db.execute("SELECT next_interval FROM engine_state "
                           "WHERE engine = 'e0'").fetchone()
    return {"intervals": intervals, "shares_j": shares,
            "next": None if state is None else state[0]}


def _config(tmp_path: Path, engine: str, apportioner: str) -> Path:
    raw = raw_config([{"name": "e0", "url": engine, "precision": "bf16"}], model=MODEL,
                     metrics={"api_key_sha256": digest("sk-test-metrics")})
    raw["accounting"] = {"interval_s": 1, "settle_s": 1, "poll_s": 0.1, "flush_s": 0.3,
                         "hold_s": 5, "apportioner": apportioner,
                         "ledger": {"kind": "sqlite", "path": str(tmp_path / "ledger.db")},
                         "meters": {"e0": {"kind": "sim", "url": engine}}}
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, Any, Path]]:
    eport, gport = free_port(), free_port()
    engine = f"http://127.0.0.1:{eport}"
    cfg = _config(tmp_path, engine, "process")
    sim = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "bf16",
                       "--port", str(eport))
    gw = f"http://127.0.0.1:{gport}"
    with running(sim, engine + "/health", timeout_s=60), \
            running(wattgate_cmd("serve", "--config", str(cfg), "--port", str(gport)),
                    gw + "/readyz", log=tmp_path / "gw.log", timeout_s=60) as proc:
        yield gw, proc, tmp_path / "ledger.db"


def nice_of(pid: int) -> int:
    """The nice value of `pid` (field 19 of /proc/PID/stat)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_serve_runs_the_apportioner_as_a_restarted_child_that_conserves_energy(
        stack: tuple[str, Any, Path]) -> None:
    gw, proc, ledger = stack
    first_child = wait_for("the apportioner child", lambda: children(proc.pid))
    assert len(first_child) == 1 and first_child[0] != proc.pid
    # on a core it shares with the gateway, requests go first
    # a niceness is at most 19 (a gateway started under `nice -n 19` has a child at 19 too)
    assert nice_of(first_child[0]) == min(19, nice_of(proc.pid) + CHILD_NICE)
    wait_for("a healthy engine", lambda: healthy(gw))
    ids = traffic(gw, 12)
    wait_for("the first requests apportioned", lambda: final(gw, ids))
    before = ledger_totals(ledger)
    energy_j = sum(e for _, e, _ in before["intervals"])
    idle_j = sum(i for _, _, i in before["intervals"])
    assert energy_j > 0.0
    assert before["shares_j"] + idle_j == pytest.approx(energy_j, rel=1e-9)
    metrics = get(f"{gw}/metrics")[1].decode()  # the child's counters, on the gateway's page
    assert "wattgate_apportioner_leader 1.0" in metrics
    assert 'wattgate_tenant_energy_joules_total{tenant="tenant-a"}' in metrics
    families = [line.split()[2] for line in metrics.splitlines() if line.startswith("# TYPE")]
    assert len(families) == len(set(families))  # one valid exposition, no family twice
    status, check = get(f"{gw}/admin/v1/energy-check")
    assert status == 200 and json.loads(check)["engines"]["e0"]["alarm"] is False

    os.kill(first_child[0], signal.SIGKILL)
    second = wait_for("a restarted child", lambda: [
        p for p in children(proc.pid) if p != first_child[0]])
    assert len(second) == 1
    more = traffic(gw, 8)
    wait_for("requests after the restart apportioned", lambda: final(gw, more), 45.0)
    after = ledger_totals(ledger)
    ks = [k for k, _, _ in after["intervals"]]
    # every interval apportioned once, none skipped across the restart
    assert ks == list(range(ks[0], ks[-1] + 1)) and after["next"] == ks[-1] + 1
    assert ks[-1] > before["intervals"][-1][0]
    energy_j = sum(e for _, e, _ in after["intervals"])
    idle_j = sum(i for _, _, i in after["intervals"])
    assert after["shares_j"] + idle_j == pytest.approx(energy_j, rel=1e-9)
    assert "wattgate_apportioner_restarts_total 1.0" in get(f"{gw}/metrics")[1].decode()

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    wait_for("the child stopped with the gateway",
             lambda: not Path(f"/proc/{second[0]}").exists(), 15.0)


def test_a_hung_child_is_killed_and_restarted_and_scrapes_do_not_wait(
        stack: tuple[str, Any, Path]) -> None:
    gw, proc, ledger = stack
    first = wait_for("the apportioner child", lambda: children(proc.pid))[0]
    wait_for("the child's series on the gateway's /metrics",
             lambda: "wattgate_apportioner_leader 1.0" in get(f"{gw}/metrics")[1].decode())
    os.kill(first, signal.SIGSTOP)
    try:
        get(f"{gw}/metrics")  # the first read after the hang waits at most 1 s ...
        t0 = time.monotonic()
        status, body = get(f"{gw}/metrics")  # ... later ones not at all
        assert status == 200 and time.monotonic() - t0 < 0.5
        assert "wattgate_apportioner_leader" not in body.decode()
        assert get(f"{gw}/admin/v1/energy-check")[0] == 503
        second = wait_for("a restarted child", lambda: [
            p for p in children(proc.pid) if p != first], 20.0)
        assert len(second) == 1
        assert not Path(f"/proc/{first}").exists() or Path(f"/proc/{first}/stat").read_text(
            ).split()[2] == "Z"  # killed (at most not yet reaped)
    finally:
        if Path(f"/proc/{first}").exists():
            os.kill(first, signal.SIGCONT)
    wait_for("the new child's series", lambda: "wattgate_apportioner_leader 1.0" in get(
        f"{gw}/metrics")[1].decode(), 30.0)
    metrics = get(f"{gw}/metrics")[1].decode()
    assert "wattgate_apportioner_restarts_total 1.0" in metrics
    assert "wattgate_apportioner_up 1.0" in metrics
    assert 'wattgate_accounting_lag_seconds{engine="e0"}' in metrics
    assert get(f"{gw}/admin/v1/energy-check")[0] == 200
    log = (ledger.parent / "gw.log").read_text()
    assert f"apportioner child (pid {first}) missed 3 liveness probes" in log
    assert "(last: TimeoutError)" in log


def test_a_ledger_deleted_under_the_gateway_turns_readyz_503_with_the_reason(
        stack: tuple[str, Any, Path]) -> None:
    """The ledger file removed while serving: the gateway stops saying it is ready (and why)
    instead of writing bills into a file nobody can read."""
    gw, _proc, ledger = stack
    wait_for("healthy engine", lambda: healthy(gw))
    traffic(gw, 2)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{ledger}{suffix}").unlink(missing_ok=True)
    traffic(gw, 2)  # the next flush finds the file gone

    def not_ready() -> dict[str, Any] | None:
        status, body = get(f"{gw}/readyz")
        return json.loads(body) if status == 503 else None

    body = wait_for("/readyz 503", not_ready)
    assert "deleted" in body["reason"] and str(ledger) in body["reason"]


def test_external_the_gateways_child_only_records_and_the_apportioner_elsewhere_bills(
        tmp_path: Path) -> None:
    """`apportioner: external`: `wattgate serve` starts a child that records its requests
    (off the gateway's loop) and does not apportion; a `wattgate apportioner` of its own
    apportions them."""
    eport, gport, aport = free_port(), free_port(), free_port()
    engine = f"http://127.0.0.1:{eport}"
    cfg = _config(tmp_path, engine, "external")
    sim = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "bf16",
                       "--port", str(eport))
    gw = f"http://127.0.0.1:{gport}"
    with running(sim, engine + "/health", timeout_s=60), \
            running(wattgate_cmd("apportioner", "--config", str(cfg), "--port", str(aport)),
                    f"http://127.0.0.1:{aport}/healthz", log=tmp_path / "ap.log",
                    timeout_s=60), \
            running(wattgate_cmd("serve", "--config", str(cfg), "--port", str(gport)),
                    gw + "/readyz", log=tmp_path / "gw.log", timeout_s=60) as proc:
        child = wait_for("the recording child", lambda: children(proc.pid))
        assert len(child) == 1
        argv = Path(f"/proc/{child[0]}/cmdline").read_bytes().split(b"\0")
        assert b"--record-only" in argv and b"--records-fd" in argv
        wait_for("a healthy engine", lambda: healthy(gw))
        ids = traffic(gw, 6)
        wait_for("the requests apportioned elsewhere", lambda: final(gw, ids))
        metrics = get(f"{gw}/metrics")[1].decode()
        assert "wattgate_apportioner_leader 1.0" not in metrics  # not the gateway's child
        assert get(f"{gw}/admin/v1/energy-check")[0] == 503
        totals = ledger_totals(tmp_path / "ledger.db")
        energy_j = sum(e for _, e, _ in totals["intervals"])
        idle_j = sum(i for _, _, i in totals["intervals"])
        assert totals["shares_j"] + idle_j == pytest.approx(energy_j, rel=1e-9)
