"""`wattgate serve --workers 2` through real processes over a simulated engine: requests from
many connections land on both workers, one ledger (one accounting child) holds every one,
energy is conserved, one /metrics scrape sums both workers; a worker SIGKILLed under load
loses no request whose response reached its client, and is started again."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_apportioner_process import (
    MODEL,
    _config,
    children,
    complete,
    final,
    get,
    healthy,
    ledger_totals,
    wait_for,
)
from tests.support.gateway import KEY_A
from tests.support.procs import free_port, running, wattgate_cmd

pytestmark = pytest.mark.timeout(240)


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def workers_of(parent: int) -> list[int]:
    """The parent's worker processes (its other child is the accounting child)."""
    return sorted(p for p in children(parent) if " serve " in cmdline(p))


def samples(text: str, name: str) -> dict[str, float]:
    """`name`'s samples by their labels' text."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[json.dumps(s.labels, sort_keys=True)] = s.value
    return out


def in_ledger(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT request_id FROM requests")}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[str, Any, Path]]:
    eport, gport = free_port(), free_port()
    engine = f"http://127.0.0.1:{eport}"
    cfg = _config(tmp_path, engine, "process")
    sim = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "bf16",
                       "--port", str(eport))
    gw = f"http://127.0.0.1:{gport}"
    with running(sim, engine + "/health", timeout_s=60), \
            running(wattgate_cmd("serve", "--workers", "2", "--config", str(cfg),
                                 "--port", str(gport)),
                    gw + "/readyz", log=tmp_path / "gw.log", timeout_s=90) as proc:
        wait_for("two workers", lambda: len(workers_of(proc.pid)) == 2, 60.0)
        wait_for("both workers serving", lambda: samples(
            get(f"{gw}/metrics")[1].decode(), "wattgate_worker_up") == {
            '{"worker": "0"}': 1.0, '{"worker": "1"}': 1.0}, 60.0)
        time.sleep(0.5)  # a worker's series answer just before it binds the port
        wait_for("a healthy engine on every worker",
                 lambda: all(healthy(gw) for _ in range(6)), 60.0)
        yield gw, proc, tmp_path / "ledger.db"


def many_connections(gw: str, n: int, threads: int = 8) -> list[str]:
    """`n` completions, each on a new connection, from `threads` threads."""
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda i: complete(gw, KEY_A, stream=i % 2 == 0), range(n)))


def test_two_workers_share_the_port_one_ledger_and_one_scrape(
        node: tuple[str, Any, Path]) -> None:
    gw, _proc, ledger = node
    before = sum(samples(get(f"{gw}/metrics")[1].decode(), "wattgate_requests_total").values())
    ids = many_connections(gw, 60)
    assert len(set(ids)) == 60
    wait_for("every request in the one ledger", lambda: set(ids) <= in_ledger(ledger), 30.0)
    metrics = get(f"{gw}/metrics")[1].decode()
    per_worker = samples(metrics, "wattgate_worker_requests_total")
    assert set(per_worker) == {'{"worker": "0"}', '{"worker": "1"}'}
    assert all(v > 0 for v in per_worker.values()), per_worker  # traffic on both workers
    total = sum(samples(metrics, "wattgate_requests_total").values())
    assert total - before == 60  # one scrape counts both workers' requests
    assert sum(per_worker.values()) == total
    assert samples(metrics, "wattgate_worker_up") == {'{"worker": "0"}': 1.0,
                                                       '{"worker": "1"}': 1.0}
    families = [line.split()[2] for line in metrics.splitlines() if line.startswith("# TYPE")]
    assert len(families) == len(set(families))  # one valid exposition, no family twice
    assert "wattgate_apportioner_leader 1.0" in metrics  # the one child's series, once
    wait_for("every request apportioned", lambda: final(gw, ids), 45.0)
    # one admin view: whichever worker a new connection reaches answers the same
    usage = [json.loads(get(f"{gw}/admin/v1/usage?tenant=tenant-a")[1])["total"]
             for _ in range(8)]
    assert all(u == usage[0] for u in usage), usage
    assert usage[0]["requests"] >= 60
    got = ledger_totals(ledger)
    energy_j = sum(e for _, e, _ in got["intervals"])
    idle_j = sum(i for _, _, i in got["intervals"])
    assert energy_j > 0.0
    assert got["shares_j"] + idle_j == pytest.approx(energy_j, rel=1e-9)
    status, check = get(f"{gw}/admin/v1/energy-check")
    assert status == 200 and json.loads(check)["engines"]["e0"]["alarm"] is False


class Cut(Exception):
    """An answer that began (its head came) and did not end."""


def short(gw: str, stream: bool = False, max_tokens: int = 2) -> str:
    """One short completion (many per second: many records in flight when a worker dies); a
    stream is read as the openai SDK reads one, up to its `[DONE]`, then the connection is
    closed. Raises Cut for an answer that began and did not end."""
    body = {"model": MODEL, "prompt": [1] * 20, "max_tokens": max_tokens, "stream": stream}
    req = urllib.request.Request(
        f"{gw}/v1/completions", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {KEY_A}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        try:
            if stream:
                while b"data: [DONE]" not in (line := resp.readline()):
                    if not line:
                        raise Cut("the stream ended without [DONE]")
            else:
                resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise Cut(repr(exc)[:200]) from exc
        return str(resp.headers["x-wattgate-request-id"])


KILLS = 3


def test_a_worker_killed_under_load_loses_no_answered_request(
        node: tuple[str, Any, Path]) -> None:
    gw, proc, ledger = node
    answered: list[str] = []
    stop = threading.Event()

    def client(stream: bool) -> None:
        while not stop.is_set():
            # cut off by a kill: not answered, so it need not be recorded
            with contextlib.suppress(OSError, ValueError, http.client.HTTPException, Cut):
                answered.append(short(gw, stream))

    threads = [threading.Thread(target=client, args=(i % 2 == 0,)) for i in range(12)]
    for t in threads:
        t.start()
    killed: list[int] = []
    try:
        for _ in range(KILLS):
            n = len(answered)
            wait_for("traffic", lambda n=n: len(answered) >= n + 100, 60.0)
            victim = workers_of(proc.pid)[0]
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
            wait_for("the worker started again", lambda: len(
                [p for p in workers_of(proc.pid) if p not in killed]) == 2, 30.0)
        n = len(answered)
        wait_for("traffic after the kills", lambda: len(answered) >= n + 50, 60.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    with contextlib.suppress(TimeoutError):
        wait_for("every answered request in the ledger",
                 lambda: set(answered) <= in_ledger(ledger), 20.0)
    missing = set(answered) - in_ledger(ledger)
    # A worker sends a request's record before its answer's last write: a kill at any instant
    # has either not answered the request or already handed its record to the kernel.
    assert not missing, f"{len(missing)} of {len(answered)} answered requests not in the ledger"
    wait_for("every answered request apportioned", lambda: final(gw, answered[-20:]), 60.0)
    got = ledger_totals(ledger)
    energy_j = sum(e for _, e, _ in got["intervals"])
    idle_j = sum(i for _, _, i in got["intervals"])
    assert got["shares_j"] + idle_j == pytest.approx(energy_j, rel=1e-9)


def accounting_child(parent: int) -> list[int]:
    return [p for p in children(parent) if " apportioner " in cmdline(p)]


def test_the_node_child_killed_is_restarted_and_every_worker_reaches_its_successor(
        node: tuple[str, Any, Path]) -> None:
    gw, proc, ledger = node
    first = wait_for("the accounting child", lambda: accounting_child(proc.pid))
    before = many_connections(gw, 20)
    os.kill(first[0], signal.SIGKILL)
    during = many_connections(gw, 20)  # recorded by the workers while no child runs
    second = wait_for("a successor", lambda: [
        p for p in accounting_child(proc.pid) if p not in first])
    assert len(second) == 1
    after = many_connections(gw, 20)
    ids = before + during + after
    wait_for("every request in the ledger", lambda: set(ids) <= in_ledger(ledger), 45.0)
    wait_for("every request apportioned", lambda: final(gw, ids), 60.0)
    got = ledger_totals(ledger)
    ks = [k for k, _, _ in got["intervals"]]
    assert ks == list(range(ks[0], ks[-1] + 1))  # none skipped across the restart
    energy_j = sum(e for _, e, _ in got["intervals"])
    idle_j = sum(i for _, _, i in got["intervals"])
    assert got["shares_j"] + idle_j == pytest.approx(energy_j, rel=1e-9)
    metrics = get(f"{gw}/metrics")[1].decode()
    assert samples(metrics, "wattgate_worker_up") == {'{"worker": "0"}': 1.0,
                                                       '{"worker": "1"}': 1.0}
    # the parent's count, once for the node (not once per worker)
    assert samples(metrics, "wattgate_apportioner_restarts_total") == {"{}": 1.0}


def test_sigterm_drains_the_workers_then_stops_the_child(node: tuple[str, Any, Path]) -> None:
    gw, proc, ledger = node
    family = [*workers_of(proc.pid), *accounting_child(proc.pid)]
    assert len(family) == 3
    ids = many_connections(gw, 10)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    for pid in family:  # nothing outlives the parent
        wait_for(f"process {pid} gone", lambda pid=pid: not Path(f"/proc/{pid}").exists()
                 or "zombie" in Path(f"/proc/{pid}/status").read_text(), 10.0)
    assert set(ids) <= in_ledger(ledger)  # every record written before the child stopped


def test_sigterm_under_load_ends_every_answer_it_began(node: tuple[str, Any, Path]) -> None:
    """Streams and whole answers in flight when the parent gets SIGTERM: each one the node
    began to answer ends whole (none cut off), and each is in the ledger."""
    gw, proc, ledger = node
    answered: list[str] = []
    cut: list[str] = []
    stop = threading.Event()

    def client(stream: bool) -> None:
        while not stop.is_set():
            try:
                answered.append(short(gw, stream, max_tokens=30))
            except Cut as exc:  # an answer begun and not ended
                cut.append(str(exc))
            except (OSError, http.client.HTTPException):
                time.sleep(0.05)  # refused (503, or the port closed): not begun

    threads = [threading.Thread(target=client, args=(i % 2 == 0,)) for i in range(12)]
    for t in threads:
        t.start()
    try:
        wait_for("traffic", lambda: len(answered) >= 40, 60.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not cut, cut[:3]
    assert set(answered) <= in_ledger(ledger)


def test_inline_accounting_with_several_workers_is_refused_in_one_line(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "http://127.0.0.1:9", "inline")
    out = subprocess.run(wattgate_cmd("serve", "--workers", "2", "--config", str(cfg),
                                      "--port", str(free_port())),
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "wattgate: --workers: accounting.apportioner: inline records and apportions in the "
        "serving process; several workers need `process` (or `external`), or --workers 1"]
    assert not (tmp_path / "ledger.db").exists()  # refused before anything started
