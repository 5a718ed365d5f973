"""Failed work is not the tenant's, through real processes: `wattgate serve` (accounting
inline, SQLite ledger, the engine's model meter) in front of the fault engine. A request the
engine hangs on before its head (504) and a stream it stalls after two tokens land in the
engine's failed account, not on tenant-a's bill (the first wholly, the second after its
tokens); with `accounting.failed_energy: tenant` they are billed. Under both settings the
meters are tenants + idle + failed in /admin/v1/usage, in /v1/usage's tenant view against
the admin view, and in the accounting metrics; requests are counted by outcome class. Behind
a front (WATTGATE_TEST_REPLICAS), the same over the replicas' one PostgreSQL ledger, with
the metrics summed over the replicas (only the leading apportioner's move)."""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.faults.helpers import ep, write_config
from tests.support.gateway import ADMIN_KEY, KEY_A
from tests.support.procs import TEST_WORKERS, free_port, running
from tests.support.replicas import gateway_set, ledger_of, ledger_rows, members

pytestmark = pytest.mark.timeout(120)
TIMEOUTS = {"connect_s": 2, "first_byte_s": 1.5, "read_s": 1.5, "total_s": 30}


def call(url: str, key: str = ADMIN_KEY, data: dict[str, Any] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(
        url, data=None if data is None else json.dumps(data).encode(),
        method="GET" if data is None else "POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json",
                 **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(), dict(exc.headers)


def complete(gw: str, fault: str, stream: bool) -> tuple[int, bytes, str]:
    """One completion for tenant-a with the fault engine's `fault`; (status, body, id)."""
    status, raw, headers = call(f"{gw}/v1/completions", KEY_A,
                                {"model": "m", "prompt": "hello " * 50, "max_tokens": 8,
                                 "stream": stream}, {"x-fault": fault})
    return status, raw, headers["x-wattgate-request-id"]


def wait_for(what: str, check: Any, timeout_s: float = 40.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise TimeoutError(f"{what} not seen after {timeout_s} s")


def detail(gw: str, rid: str) -> dict[str, Any] | None:
    status, raw, _ = call(f"{gw}/admin/v1/requests/{rid}")
    got: dict[str, Any] = json.loads(raw)
    return got if status == 200 and got["final"] else None


def metric(text: str, name: str) -> float:
    """The sum of a counter family's samples on a /metrics page."""
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


def metrics_page(gw: str) -> str:
    """/metrics of the gateway, or of each replica behind the front one after another."""
    return "\n".join(call(f"{url}/metrics")[1].decode() for url in members(gw))


def healthy_everywhere(gw: str) -> bool:
    return all(json.loads(call(f"{url}/admin/v1/endpoints")[1])["endpoints"][0]["healthy"]
               for url in members(gw))


@contextmanager
def stack(tmp_path: Path, setting: str) -> Iterator[tuple[str, Path | str]]:
    eport = free_port()
    engine = f"http://127.0.0.1:{eport}"
    ledger = tmp_path / "ledger.db"
    config, port = write_config(tmp_path, [ep(engine)], timeouts=TIMEOUTS, accounting={
        "interval_s": 1, "settle_s": 1, "poll_s": 0.1, "flush_s": 0.3, "hold_s": 5,
        # inline where one process serves; several workers share the node's child
        "apportioner": "inline" if TEST_WORKERS == 1 else "process", "failed_energy": setting,
        "ledger": {"kind": "sqlite", "path": str(ledger)}})
    with running([sys.executable, "-m", "tests.support.fault_engine", "--port", str(eport)],
                 engine + "/health", timeout_s=30), \
            gateway_set(config, port, tmp_path / "gw.log") as gw:
        yield gw.url, ledger_of(gw, ledger)


def apportioned_past(ledger: Path | str, until_s: float) -> bool:
    rows = ledger_rows(ledger, "SELECT next_interval FROM engine_state WHERE engine = 'e1'")
    return bool(rows) and float(rows[0][0]) >= until_s + 1.0


def metered_j(ledger: Path | str, since_s: float, until_s: float) -> float:
    ((got,),) = ledger_rows(ledger, "SELECT COALESCE(SUM(energy_j), 0) FROM intervals "
                            "WHERE start_s >= ? AND start_s < ?", since_s, until_s)
    return float(got)


@pytest.mark.parametrize("setting", ["failed_account", "tenant"])
def test_a_hung_and_a_stalled_engine_request_are_billed_by_the_switch_and_conserved(
        tmp_path: Path, setting: str) -> None:
    since = float(int(time.time()) - 5)
    with stack(tmp_path, setting) as (gw, ledger):
        wait_for("a healthy engine", lambda: healthy_everywhere(gw))
        served = [complete(gw, "ok", stream=i % 2 == 0) for i in range(4)]
        assert all(s == 200 for s, _, _ in served)
        h_status, h_raw, hung = complete(gw, "hang-head", stream=False)
        assert h_status == 504, h_raw
        s_status, s_raw, stalled = complete(gw, "hang-mid", stream=True)
        assert s_status == 200 and b"upstream_timeout" in s_raw
        ids = [rid for _, _, rid in served] + [hung, stalled]
        details = wait_for("every request final", lambda: (
            got if all(got := [detail(gw, rid) for rid in ids]) else None))
        until = float(int(time.time()))
        wait_for("the window apportioned", lambda: apportioned_past(ledger, until))
        q = f"since={since}&until={until}&group_by=tenant"
        status, raw, _ = call(f"{gw}/admin/v1/usage?{q}")
        assert status == 200, raw
        admin = json.loads(raw)
        t_status, t_raw, _ = call(f"{gw}/v1/usage?{q}", KEY_A)
        assert t_status == 200, t_raw
        tenant_view = json.loads(t_raw)
        page = metrics_page(gw)
        meters_j = metered_j(ledger, since, until)

    by_id = dict(zip(ids, details, strict=True))
    h, s = by_id[hung], by_id[stalled]
    assert (h["outcome"], h["http_status"], s["outcome"]) == ("failed", 504, "failed")
    rows = {r["tenant"]: r for r in admin["rows"]}
    a = rows["tenant-a"]
    assert (a["served"], a["failed"], a["refused"], a["cancelled"]) == (4, 2, 0, 0)
    assert a["requests"] == 6
    # meters = tenants + idle + failed, in the admin view
    assert meters_j > 10.0
    assert admin["total"]["energy_j"] == pytest.approx(meters_j, rel=1e-9)
    parts = [r["energy_j"] for r in admin["rows"]]
    assert sum(parts) == pytest.approx(meters_j, rel=1e-9)
    # the tenant's own view is its row of the admin view
    (own,) = tenant_view["rows"]
    assert own["tenant"] == "tenant-a" and own["energy_j"] == pytest.approx(a["energy_j"])
    assert (own["served"], own["failed"]) == (4, 2)
    assert own["failed_energy_j"] == pytest.approx(a["failed_energy_j"])
    # and in the metrics, which the apportioner counts as it commits
    engine_j = metric(page, "wattgate_engine_energy_joules_total")
    split_j = (metric(page, "wattgate_tenant_energy_joules_total")
               + metric(page, "wattgate_engine_idle_energy_joules_total")
               + metric(page, "wattgate_engine_failed_energy_joules_total"))
    assert engine_j > 10.0 and split_j == pytest.approx(engine_j, rel=1e-6)
    if setting == "failed_account":
        failed_j = rows["(failed)"]["energy_j"]
        # the hung request: ~1.5 s of the engine's static power, none of it billed
        assert h["energy_j"] == 0.0 and h["cost_usd"] == 0.0 and h["failed_energy_j"] > 10.0
        # the stalled stream: its prompt and two tokens billed, the stall after them not
        assert 0.0 < s["energy_j"] < s["failed_energy_j"]
        assert failed_j == pytest.approx(h["failed_energy_j"] + s["failed_energy_j"],
                                         rel=1e-6)
        assert a["failed_energy_j"] == pytest.approx(failed_j, rel=1e-9)
        assert metric(page, "wattgate_engine_failed_energy_joules_total") >= failed_j * 0.999
        for _, _, rid in served:
            assert by_id[rid]["failed_energy_j"] == 0.0
    else:
        assert "(failed)" not in rows and a["failed_energy_j"] == 0.0
        assert h["energy_j"] > 10.0 and s["energy_j"] > 0.0
        assert h["failed_energy_j"] == 0.0 == s["failed_energy_j"]
        assert metric(page, "wattgate_engine_failed_energy_joules_total") == 0.0
