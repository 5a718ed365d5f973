"""Processes the demo and the benchmarks start: free ports, readiness, and a process group
that is always stopped (SIGTERM, then SIGKILL after a deadline)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TextIO

ROOT = Path(__file__).resolve().parents[1]
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook that has the kernel send SIGTERM to the child when the process that
    started it dies, however it dies (SIGKILL included): nothing started here outlives it.
    libc is resolved here, in the parent, so the forked child only makes one call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    return hook


_PRE_EXEC = _die_with_parent()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, ok: int = 200) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == ok:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait_s: float = 15.0) -> None:
    """Signal the process group (SIGTERM: graceful, a gateway flushes its ledger), then SIGKILL
    after `wait_s`."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def wattgate(*args: str) -> list[str]:
    """The `wattgate` CLI run with this interpreter (no console script needed)."""
    if args[:1] == ("serve",) and "--workers" not in args:
        # one process, as the tests and the demo have always measured (serve's default is
        # a worker per core)
        args = ("serve", "--workers", "1", *args[1:])
    return [sys.executable, "-m", "wattgate_cli", *args]


def spawn(cmd: Sequence[str], log: IO[bytes] | TextIO, *, die_with_parent: bool = False
          ) -> subprocess.Popen[bytes]:
    """Start `cmd` from the repository root in a process group of its own, output to `log`.
    `die_with_parent`: the kernel stops it when the thread that started it ends (use it only
    from a thread that lives as long as the process should)."""
    return subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=_PRE_EXEC if die_with_parent else None)


@contextlib.contextmanager
def process(cmd: Sequence[str], log: IO[bytes] | TextIO, *, die_with_parent: bool = False
            ) -> Iterator[subprocess.Popen[bytes]]:
    """`spawn`, always stopped on exit."""
    proc = spawn(cmd, log, die_with_parent=die_with_parent)
    try:
        yield proc
    finally:
        stop(proc)


@contextlib.contextmanager
def started(args: list[str], log: TextIO) -> Iterator[subprocess.Popen[bytes]]:
    """`wattgate ARGS` for the demo: stopped on exit, and with the demo if it is killed."""
    with process(wattgate(*args), log, die_with_parent=True) as proc:
        yield proc
