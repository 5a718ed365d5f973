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


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Yields a DSN for a fresh server (user wattgate, trust auth, database postgres)."""
    require_binaries()
    root = Path(tempfile.mkdtemp(prefix="wattgate-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data = root / "data"
    port = free_port()
    pg_ctl = shutil.which("pg_ctl") or "pg_ctl"
    started = False
    try:
        subprocess.run(_as_server_user(["initdb", "-D", str(data), "-A", "trust", "-U",
                                        "wattgate", "--no-sync"]),
                       check=True, capture_output=True, timeout=120)
        opts = (f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off")
        subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-o", opts, "-l",
                                        str(root / "log"), "-w", "-t", "60", "start"]),
                       check=True, capture_output=True, timeout=90)
        started = True
        yield f"postgresql://wattgate@127.0.0.1:{port}/postgres"
    finally:
        if started:
            subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-m", "immediate", "-w",
                                            "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


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
