"""A process's descendants and the TCP ports they listen on, read from /proc (Linux)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

_PROC = Path("/proc")
_SHELLS = frozenset({"bash", "sh", "dash"})
_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (state first); [] when it is gone."""
    try:
        return (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def started_at(pid: int) -> int | None:
    """The process's start time (clock ticks after boot): with the pid, who it is, since a
    pid is reused once its process is gone."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def alive(pid: int, started: int | None = None) -> bool:
    """Running, not a zombie waiting to be reaped (and, given `started`, the same process)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z" and started in (None, int(fields[19]))


def _parents() -> dict[int, int]:
    out = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                out[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return out


def tree(pid: int) -> dict[int, int]:
    """`pid` and every process below it, each with its start time."""
    found = {}
    for p in descendants(pid):
        started = started_at(p)
        if started is not None:
            found[p] = started
    return found


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


def kill_all(procs: dict[int, int]) -> None:
    """SIGKILL each process of `procs` (pid: start time) still running; not a pid's new owner."""
    for pid, started in procs.items():
        if alive(pid, started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
