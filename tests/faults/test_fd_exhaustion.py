"""20,000 idle connections against a `wattgate serve` process whose file descriptors are capped
at 1024: the gateway keeps serving normal requests during the attack, answers the excess 503
overloaded (or 408 once a head never came), and never ejects an engine for its own EMFILE.
Behind a front (WATTGATE_TEST_REPLICAS), each replica is capped at 1024, the connections are
spread over them, and each one's engine view and /metrics are checked."""

from __future__ import annotations

import contextlib
import errno
import json
import resource
import select
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.helpers import ADMIN, AUTH, ep, gateway_process, write_config
from tests.support.procs import free_port, running
from tests.support.replicas import members

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
IDLE_CONNECTIONS = 20_000
GATEWAY_NOFILE = 1024


@contextlib.contextmanager
def _own_fd_limit(wanted: int) -> Iterator[int]:
    """Raise this process's RLIMIT_NOFILE to `wanted` (the hard limit too, as root may); yields
    the soft limit got, restores the old one after."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(wanted, old[0]), max(wanted, old[1])))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (old[1], old[1]))
    try:
        yield resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, old)


def _request(url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
             timeout_s: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def _until_ok(url: str, limit_s: float, **kw: object) -> tuple[int, bytes, int]:
    """Retry a request (bounded) until it is answered 200; returns (status, body, tries)."""
    deadline = time.monotonic() + limit_s
    tries = 0
    status, body = 0, b""
    while time.monotonic() < deadline:
        tries += 1
        try:
            status, body = _request(url, **kw)  # type: ignore[arg-type]
        except OSError:
            status, body = 0, b""
        if status == 200:
            break
        if status not in (0, 503, 408):
            raise AssertionError(f"{url}: {status} {body[:200]!r}")
        if status == 503:
            assert json.loads(body)["error"]["code"] == "overloaded", body
        time.sleep(0.2)
    return status, body, tries


def _open_idle(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", port))
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
            s.close()
            break
        socks.append(s)
    return socks


def _outcomes(socks: list[socket.socket]) -> dict[bytes, int]:
    """Status lines the gateway sent on the idle connections (a sample of 2,000)."""
    seen: dict[bytes, int] = {}
    sample = socks[:2000]
    poller = select.poll()  # select() cannot take descriptors above 1023
    by_fd = {s.fileno(): s for s in sample}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    for fd, _ in poller.poll(0):
        s = by_fd[fd]
        try:
            data = s.recv(4096)
        except OSError:
            data = b"<reset>"
        line = data.split(b"\r\n", 1)[0][:40] or b"<closed>"
        seen[line] = seen.get(line, 0) + 1
        if data.startswith(b"HTTP/1.1 503"):
            assert b"overloaded" in data and b"retry-after" in data.lower(), data
    return seen


def test_20000_idle_connections_at_1024_fds_leave_the_gateway_serving(tmp_path: Path) -> None:
    """A normal request succeeds during the attack (retried while answered 503 overloaded), the
    idle connections get only 503 overloaded with Retry-After or 408 or a close, the engine
    stays healthy and not ejected, and the log shows no ejection."""
    port = free_port()
    engine_url = f"http://127.0.0.1:{port}"
    engine_cmd = [sys.executable, "-m", "tests.support.fault_engine", "--port", str(port)]
    config, gw_port = write_config(tmp_path, [ep(engine_url, "engine")],
                                   listen={"header_timeout_s": 10})
    log = tmp_path / "gateway.log"
    payload = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 2}).encode()
    headers = {**AUTH, "Content-Type": "application/json"}
    with _own_fd_limit(IDLE_CONNECTIONS + 4096) as soft, \
            running(engine_cmd, engine_url + "/health"), \
            gateway_process(config, gw_port, log, nofile=GATEWAY_NOFILE) as gw:
        count = min(IDLE_CONNECTIONS, soft - 512)
        socks = _open_idle(gw_port, count)
        try:
            assert len(socks) >= min(count, 15_000), len(socks)
            time.sleep(1.0)
            # during the attack: a normal request is served (retried while answered 503)
            status, body, _ = _until_ok(gw + "/v1/completions", 60, data=payload,
                                        headers=headers)
            assert status == 200 and b"tok" in body, body
            pages = []
            for url in members(gw):  # behind a front: each replica, under its share
                status, body, _ = _until_ok(url + "/admin/v1/endpoints", 60, headers=ADMIN)
                assert status == 200
                row = json.loads(body)["endpoints"][0]
                assert row["healthy"] and not row.get("ejected_until"), (url, row)
                status, text, _ = _until_ok(url + "/metrics", 60)
                pages.append(text.decode())
            outcomes = _outcomes(socks)
        finally:
            for s in socks:
                s.close()
        assert all(line.startswith((b"HTTP/1.1 503", b"HTTP/1.1 408")) or line in
                   (b"<closed>", b"<reset>") for line in outcomes), outcomes
        metrics = "\n".join(pages)
        assert all('wattgate_endpoint_healthy{engine="engine"' in page for page in pages)
        assert [line for line in metrics.splitlines()
                if line.startswith("wattgate_endpoint_healthy{")
                and line.endswith(" 0.0")] == []
        # after the attack: served at once
        status, body = _request(gw + "/v1/completions", data=payload, headers=headers,
                                timeout_s=10)
        assert status == 200
    text_log = log.read_text(errors="replace")
    assert "ejected" not in text_log, "an engine was ejected for the gateway's own fd shortage"
    assert "Traceback" not in text_log
