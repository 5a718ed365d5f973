"""N gateway processes on one host behind one port (`wattgate serve --reuse-port`), as
docs/operations.md describes: the kernel spreads connections over all of them, and when one
process dies, new connections go to the survivors."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from tests.support.gateway import KEY_A, raw_config
from tests.support.procs import free_port, running, wait_http, wattgate_cmd

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]

PROCESSES = 3
CONNECTIONS = 30  # P(some process gets none) = 3 * (2/3)^30, about 2e-5


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def established_inodes(port: int) -> set[str]:
    """Inodes of ESTABLISHED TCP sockets whose local port is `port` (server side)."""
    out = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local_port = int(fields[1].split(":")[1], 16)
            if local_port == port and fields[3] == "01":
                out.add(fields[9])
    return out


def chat(base: str) -> bytes:
    body = orjson.dumps({"model": "m", "stream": True, "max_tokens": 4,
                         "messages": [{"role": "user", "content": "hi"}]})
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {KEY_A}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        data: bytes = resp.read()
        return data


@contextlib.contextmanager
def gateways(tmp_path: Path) -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    eport, gport = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{eport}"
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump(raw_config(
        [{"name": "e1", "url": engine_url, "precision": "bf16"}],
        health={"interval_s": 1.0, "timeout_s": 0.5})))
    engine = [sys.executable, "-m", "tests.support.fake_engine", "--port", str(eport)]
    serve = wattgate_cmd("serve", "--config", str(cfg), "--port", str(gport), "--reuse-port")
    with contextlib.ExitStack() as stack:
        stack.enter_context(running(engine, engine_url + "/health"))
        procs = [stack.enter_context(running(serve, log=tmp_path / f"gw{i}.log"))
                 for i in range(PROCESSES)]
        wait_http(f"http://127.0.0.1:{gport}/healthz", 30)
        # Every process must be listening before connections are counted.
        deadline = time.monotonic() + 30
        while any(not (socket_inodes(p.pid) & listening_inodes(gport)) for p in procs):
            assert time.monotonic() < deadline, "not every gateway process is listening"
            assert all(p.poll() is None for p in procs)
            time.sleep(0.1)
        yield gport, procs


def listening_inodes(port: int) -> set[str]:
    with open("/proc/net/tcp") as f:
        next(f)
        return {fields[9] for fields in (line.split() for line in f)
                if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A"}


def open_connections(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


def per_process(port: int, pids: list[int]) -> dict[int, int]:
    established = established_inodes(port)
    return {pid: len(socket_inodes(pid) & established) for pid in pids}


def wait_accepted(port: int, pids: list[int], n: int) -> dict[int, int]:
    deadline = time.monotonic() + 10
    counts = per_process(port, pids)
    while sum(counts.values()) < n and time.monotonic() < deadline:
        time.sleep(0.05)
        counts = per_process(port, pids)
    return counts


def test_connections_spread_over_all_processes_and_survive_one_killed(tmp_path: Path) -> None:
    with gateways(tmp_path) as (port, procs):
        pids = [p.pid for p in procs]
        base = f"http://127.0.0.1:{port}"
        conns = open_connections(port, CONNECTIONS)
        try:
            counts = wait_accepted(port, pids, CONNECTIONS)
        finally:
            for c in conns:
                c.close()
        assert sum(counts.values()) == CONNECTIONS, counts
        assert all(n >= 1 for n in counts.values()), f"a process got no connection: {counts}"

        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        survivors = pids[1:]
        for _ in range(CONNECTIONS):  # fresh connections only reach live processes
            assert b"data: [DONE]" in chat(base)
        conns = open_connections(port, CONNECTIONS)
        try:
            counts = wait_accepted(port, survivors, CONNECTIONS)
        finally:
            for c in conns:
                c.close()
        assert sum(counts.values()) == CONNECTIONS and all(n >= 1 for n in counts.values())
