"""A process's descendants and the TCP ports they listen on, read from /proc (Linux)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

_PROC = Path("/proc")
_SHELLS = frozenset({"bash", "sh", "dash"})
_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _parents() -> dict[int, int]:
    out = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                out[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return out


def descendants(pid: int) -> set[int]:
    """`pid` and every process below it."""
    parents = _parents()
    found, frontier = {pid}, [pid]
    while frontier:
        here = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == here and p not in found]
        found.update(kids)
        frontier.extend(kids)
    return found


def _listening_inodes() -> dict[str, int]:
    inodes = {}
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (_PROC / "net" / table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == _LISTEN:
                    inodes[f[9]] = int(f[1].rsplit(":", 1)[1], 16)
    return inodes


def listening_ports(pids: set[int]) -> set[int]:
    """The TCP ports any of `pids` listens on."""
    inodes = _listening_inodes()
    ports = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in (_PROC / str(pid) / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        ports.add(inodes[target[8:-1]])
    return ports


def terminate(pid: int) -> None:
    """SIGTERM to the program a job runs: through a shell that waits on it (a `{ ...; } &`
    group), to the shell's children, since a waiting shell does not pass the signal on."""
    with contextlib.suppress(OSError):
        name = (_PROC / str(pid) / "comm").read_text().strip()
        if name in _SHELLS:
            for child, parent in _parents().items():
                if parent == pid:
                    terminate(child)
            return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
