"""Start a throwaway PostgreSQL server on 127.0.0.1 for ledger tests, and always stop it.

PostgreSQL refuses to run as root, so when the tests run as root the data directory is
handed to the `postgres` user and the server binaries run through `runuser`. Without the
binaries the tests are skipped, except where the extras are required (tests/support/extras.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support import extras
from tests.support.procs import free_port

BINARIES = ("initdb", "pg_ctl", "postgres")


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def require_binaries() -> None:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        extras.missing(f"PostgreSQL server binaries not installed ({', '.join(missing)})")


class PostgresServer:
    """A throwaway server that a test may stop (as a crash would) and start again."""

    def __init__(self, root: Path, port: int):
        self.root = root
        self.data = root / "data"
        self.port = port
        self.dsn = f"postgresql://wattgate@127.0.0.1:{port}/postgres"
        self.running = False
        self._pg_ctl = shutil.which("pg_ctl") or "pg_ctl"

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off")
        subprocess.run(_as_server_user([self._pg_ctl, "-D", str(self.data), "-o", opts, "-l",
                                        str(self.root / "log"), "-w", "-t", "60", "start"]),
                       check=True, capture_output=True, timeout=90)
        self.running = True

    def stop(self) -> None:
        """Stop at once, dropping every connection (`-m immediate`)."""
        subprocess.run(_as_server_user([self._pg_ctl, "-D", str(self.data), "-m", "immediate",
                                        "-w", "stop"]), capture_output=True, timeout=60)
        self.running = False


@contextlib.contextmanager
def postgres() -> Iterator[PostgresServer]:
    """A fresh server (user wattgate, trust auth, database postgres), stopped on exit."""
    require_binaries()
    root = Path(tempfile.mkdtemp(prefix="wattgate-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    server = PostgresServer(root, free_port())
    try:
        subprocess.run(_as_server_user(["initdb", "-D", str(server.data), "-A", "trust", "-U",
                                        "wattgate", "--no-sync"]),
                       check=True, capture_output=True, timeout=120)
        server.start()
        yield server
    finally:
        if server.running:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Yields a DSN for a fresh server (user wattgate, trust auth, database postgres)."""
    with postgres() as server:
        yield server.dsn


async def fresh_database(dsn: str, name: str) -> str:
    """Create database `name` on the server and return its DSN."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return dsn.rsplit("/", 1)[0] + "/" + name
