"""Processes of the soak benchmark: free ports, the gateway's config, start and stop."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
MODEL = "llama-3.1-8b"
TENANTS = ("t0", "t1", "t2")


def api_key(tenant: str) -> str:
    return f"sk-soak-{tenant}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wattgate(*args: str) -> list[str]:
    return [sys.executable, "-m", "wattgate_cli", *args]


def gateway_config(engines: dict[str, tuple[str, str]], ledger: Path, port: int
                   ) -> dict[str, Any]:
    """`engines`: name -> (url, precision). Accounting on, with its defaults (SQLite ledger
    and the request journal next to it), `sim` meters."""
    def digest(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "routing": {"policy": "least_load"},
        "slo_classes": {"default": {"ttft_s": 10.0}},
        "default_slo_class": "default",
        "tenants": [{"name": t, "api_key_sha256": digest(api_key(t))} for t in TENANTS],
        "models": [{"name": MODEL, "endpoints": [
            {"name": n, "url": u, "kind": "vllm", "precision": p}
            for n, (u, p) in engines.items()]}],
        "timeouts": {"connect_s": 2, "first_byte_s": 30, "read_s": 30, "total_s": 120},
        "retries": {"max_attempts": 3, "deadline_s": 10},
        "health": {"interval_s": 0.5, "timeout_s": 1, "unhealthy_after": 1,
                   "healthy_after": 1},
        "accounting": {"ledger": {"kind": "sqlite", "path": str(ledger)},
                       "meters": {n: {"kind": "sim", "url": u}
                                  for n, (u, _) in engines.items()}},
    }


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} was up")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signal the process group (SIGTERM: graceful, the gateway flushes), then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def spawn(cmd: Sequence[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(cmd), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@contextlib.contextmanager
def process(cmd: Sequence[str], log: IO[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    proc = spawn(cmd, log)
    try:
        yield proc
    finally:
        stop(proc)
