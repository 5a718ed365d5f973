"""Start real processes on 127.0.0.1 free ports for integration tests, and always stop them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from loadgen.procs import free_port, stop

__all__ = ["REPO", "TEST_WORKERS", "free_port", "running", "stop", "wait_http", "wattgate_cmd"]

REPO = Path(__file__).resolve().parents[2]
# `wattgate serve`'s workers where a test does not name them: 1, as the tests and the demo have
# always measured (serve's default is a worker per core); `make test-workers` runs the
# process-level fault tests again on 2
TEST_WORKERS = int(os.environ.get("WATTGATE_TEST_WORKERS", "1"))


def wattgate_cmd(*args: str) -> list[str]:
    """The `wattgate` CLI run with this interpreter (works without the console script)."""
    if args[:1] == ("serve",) and "--workers" not in args:
        args = ("serve", "--workers", str(TEST_WORKERS), *args[1:])
    return [sys.executable, "-m", "wattgate_cli", *args]


def wait_http(url: str, timeout_s: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            exc.close()  # it holds the response and its socket: close it, not the GC
            if exc.code < 500:
                return
            last = exc
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout_s}s: {last}")


@contextlib.contextmanager
def running(cmd: Sequence[str], ready_url: str | None = None, *, timeout_s: float = 30.0,
            env: dict[str, str] | None = None, log: Path | None = None,
            out: IO[bytes] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run `cmd` in its own process group; wait for `ready_url`; kill the group on exit. Its
    output goes to `log` (a file of its own) or `out` (a file the caller holds open)."""
    dest: IO[bytes] | int = (open(log, "wb") if log  # noqa: SIM115 - closed below
                             else out if out is not None else subprocess.DEVNULL)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(list(cmd), cwd=REPO, env=full_env, stdout=dest, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        if ready_url:
            wait_http(ready_url, timeout_s, proc)
        yield proc
    finally:
        stop(proc)
        if log and not isinstance(dest, int):
            dest.close()
