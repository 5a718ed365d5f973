"""A file-descriptor flood against `wattgate serve` with accounting, its descriptors capped at
256 and at 1024 (prlimit): idle connections past the cap get a clean 503 `overloaded` JSON
and a close (never an EOF or a reset), more concurrent streams than the cap are either served
to their end or refused 503 at once (no livelock), the process never runs out of descriptors,
its accounting child is never killed for it, and every request answered 200 is in the ledger
after the flood and again after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import select
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.front.fdbudget import connection_budget
from tests.faults.test_fd_exhaustion import _own_fd_limit
from tests.support.gateway import KEY_A, raw_config
from tests.support.procs import TEST_WORKERS, free_port, running, wattgate_cmd
from tests.support.replicas import gateway_set, ledger_rows, shared_postgres, stop_all

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]
MODEL = "llama-3.1-8b"
MAX_STREAMS = 600  # concurrent streams at most (the cap at 1024 is 479)


def _config(tmp: Path, engine_url: str, port: int) -> Path:
    raw: dict[str, Any] = raw_config(
        [{"name": "e0", "url": engine_url, "precision": "bf16", "model": MODEL}],
        listen={"host": "127.0.0.1", "port": port, "header_timeout_s": 60})
    raw["accounting"] = {"interval_s": 1, "flush_s": 0.5, "settle_s": 1.0,
                         "ledger": {"kind": "sqlite", "path": str(tmp / "ledger.db")}}
    path = tmp / "gw.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(p) for p in (task / "children").read_text().split()]
    return out


def _open_idle(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        if s.connect_ex(("127.0.0.1", port)) not in (0, errno.EINPROGRESS, errno.EAGAIN):
            s.close()
            break
        socks.append(s)
    return socks


def _idle_outcomes(socks: list[socket.socket]) -> dict[str, int]:
    """What each idle connection got: held (nothing yet), 503 (a whole overloaded JSON error,
    then the close), or anything else by its first bytes."""
    seen = {"held": 0, "503": 0}
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    ready = {fd for fd, _ in poller.poll(0)}
    for fd, s in by_fd.items():
        if fd not in ready:
            seen["held"] += 1
            continue
        s.setblocking(True)
        s.settimeout(3.0)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except OSError as exc:
            data += f"<{type(exc).__name__}>".encode()
        head, _, body = data.partition(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 503") and json.loads(body)["error"]["code"] == "overloaded":
            seen["503"] += 1
        else:
            key = data[:40].decode("latin-1") or "<eof>"
            seen[key] = seen.get(key, 0) + 1
    return seen


async def _stream(port: int, n: int) -> tuple[int, str | None, bool]:
    """One streaming request on its own connection: (status, request id, whole stream)."""
    body = json.dumps({"model": "m", "prompt": f"flood {n}", "max_tokens": 8,
                       "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        async with asyncio.timeout(60):
            data = await reader.read(-1)  # to the close
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    top, _, rest = data.partition(b"\r\n\r\n")
    status = int(top.split(b" ", 2)[1]) if top.startswith(b"HTTP/1.1 ") else 0
    rid = None
    for line in top.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"x-wattgate-request-id":
            rid = value.strip().decode()
    if status == 503:
        assert json.loads(rest)["error"]["code"] == "overloaded", rest
    return status, rid, b"data: [DONE]" in rest


async def _streams(port: int, count: int) -> list[tuple[int, str | None, bool]]:
    return await asyncio.gather(*(_stream(port, n) for n in range(count)))


def _ledger_ids(tmp: Path, dsn: str) -> set[str]:
    return {r[0] for r in ledger_rows(dsn or tmp / "ledger.db", "SELECT request_id FROM requests")}


@pytest.mark.parametrize("nofile", [256, 1024])
def test_fd_flood_is_shed_with_503_and_loses_no_record(tmp_path: Path, nofile: int) -> None:
    """Behind a front (WATTGATE_TEST_REPLICAS), each replica is capped at `nofile` and the
    flood is spread over them: the idle connections held are at most the replicas' budgets
    together, each replica keeps its own accounting child, and the one ledger holds every
    answer."""
    budget = connection_budget(nofile, 1024, 1)
    eport, gport = free_port(), free_port()
    engine = f"http://127.0.0.1:{eport}"
    cfg = _config(tmp_path, engine, gport)
    sim = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "bf16",
                       "--port", str(eport))
    with _own_fd_limit(8192), shared_postgres() as dsn, \
            running(sim, engine + "/health", timeout_s=60, log=tmp_path / "sim.log"):
        answered, stats = _flood_once(tmp_path, cfg, gport, nofile, budget, dsn)
        log = (tmp_path / "gw1.log").read_text(errors="replace")
        assert "Too many open files" not in log and "Traceback" not in log, log[-3000:]
        assert "killing it" not in log and "could not start" not in log, log[-3000:]
        assert answered - _ledger_ids(tmp_path, dsn) == set()
        # a restart: nothing replayed or revised loses a row
        with gateway_set(cfg, gport, tmp_path / "gw2.log", nofile=nofile, ready="/readyz",
                         dsn=dsn) as gw2:
            stop_all(gw2)
        assert answered - _ledger_ids(tmp_path, dsn) == set()
    print(f"nofile {nofile}: cap {budget}, {stats}", file=sys.stderr)


def _flood_once(tmp_path: Path, cfg: Path, gport: int, nofile: int, budget: int, dsn: str
                ) -> tuple[set[str], str]:
    """Flood the gateway with idle connections, then with streams; stop it. Returns the ids
    answered 200 and what was seen."""
    with gateway_set(cfg, gport, tmp_path / "gw1.log", nofile=nofile, ready="/readyz",
                     dsn=dsn) as gw:
        # each process's accounting child, and its workers where several serve
        children = [_children(proc.pid) for proc in gw.procs]
        for child in children:
            assert len(child) == 1 + (TEST_WORKERS if TEST_WORKERS > 1 else 0), child
        # each worker of each replica holds up to `budget` (connections are spread over them)
        budget *= TEST_WORKERS * len(gw.procs)
        socks = _open_idle(gport, budget + 100)
        try:
            time.sleep(1.5)
            idle = _idle_outcomes(socks)
        finally:
            for s in socks:
                s.close()
        assert set(idle) == {"held", "503"}, idle  # no EOF, no reset, no other answer
        assert idle["503"] >= 100 and idle["held"] <= budget, idle
        time.sleep(0.5)  # the flood's connections closed
        results = asyncio.run(_streams(gport, min(nofile + 50, MAX_STREAMS)))
        served = [r for r in results if r[0] == 200]
        assert all(status in (200, 503) for status, _, _ in results), results[:5]
        assert served and all(whole for _, _, whole in served), "a stream did not complete"
        assert len(served) >= min(budget, len(results)) // 4, len(served)
        answered = {rid for _, rid, _ in served if rid}
        assert len(answered) == len(served)
        assert [_children(proc.pid) for proc in gw.procs] == children, \
            "an accounting child (or a worker) was replaced"
        assert stop_all(gw) == [0] * len(gw.procs)
    return answered, f"idle {idle}, streams {len(results)}, served {len(served)}"
