"""A gateway a process-level test starts, as one `wattgate serve` or as a set of replicas.

With WATTGATE_TEST_REPLICAS=N (N > 1; `make test-replicas` sets 3) each gateway such a test
starts becomes N `wattgate serve` processes behind a round-robin TCP front on the port the
test chose (tests/support/rr_front.py), sharing one PostgreSQL server: every config is
rewritten here, in one place, to that server's ledger (`accounting:` added where the test had
none), each replica with a port and a request journal of its own, and, where a tenant has a
rate limit, the shared rate store on the same server (`on_store_down: closed`, so a request
admitted at all went through it). The replicas' output goes to the test's one log file
(appended, a line at a time). What differs per process (its /metrics page, its descriptors,
its accounting child) is reached through the `GatewaySet` the context yields.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.support.postgres import postgres
from tests.support.procs import free_port, running, stop, wait_http, wattgate_cmd

__all__ = ["TEST_REPLICAS", "GatewaySet", "gateway_set", "ledger_rows", "members",
           "replica_configs", "shared_postgres"]

TEST_REPLICAS = int(os.environ.get("WATTGATE_TEST_REPLICAS", "1"))
RATE_LIMITS = ("requests_per_second", "requests_per_minute", "tokens_per_minute")
_T = TypeVar("_T")


@dataclass
class GatewaySet:
    """What a test reaches: `url` (the front, or the one process), each replica's URL and
    process (one of each without replicas), and the ledger (a SQLite path or a DSN)."""

    url: str
    urls: list[str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    dsn: str = ""


_SETS: dict[str, GatewaySet] = {}


def members(url: str) -> list[str]:
    """Each replica's URL behind the front at `url`; `[url]` for one process."""
    got = _SETS.get(url)
    return list(got.urls) if got is not None else [url]


def replica_configs(config: Path, dsn: str, n: int) -> list[tuple[Path, int]]:
    """The test's config rewritten for `n` replicas on the PostgreSQL at `dsn`: (path, port)
    of each, written beside it."""
    raw: dict[str, Any] = yaml.safe_load(config.read_text())  # JSON is YAML
    out = []
    for i in range(n):
        port = free_port()
        doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(raw))  # a deep copy
        doc["listen"] = {**doc.get("listen", {}), "host": "127.0.0.1", "port": port}
        acct = doc.setdefault("accounting", {})
        acct["ledger"] = {"kind": "postgres", "dsn": dsn}
        journal = acct.setdefault("journal", {})
        if journal.get("enabled", True):
            journal["path"] = str(config.parent / f"{config.stem}.r{i}.journal")
        if any(set(RATE_LIMITS) & set(t.get("limits", {})) for t in doc.get("tenants", [])):
            controls = doc.setdefault("tenant_controls", {})
            controls.setdefault("shared_store", {"on_store_down": "closed"})
        path = config.parent / f"{config.stem}.r{i}.yaml"
        path.write_text(yaml.safe_dump(doc))
        out.append((path, port))
    return out


@contextlib.contextmanager
def shared_postgres() -> Iterator[str]:
    """A fresh PostgreSQL server's DSN where replicas run, "" where one process runs (a test
    whose gateway restarts on the same ledger holds it across both)."""
    if TEST_REPLICAS == 1:
        yield ""
        return
    with postgres() as server:
        yield server.dsn


def _prefixed(cmd: Sequence[str], nofile: int | None) -> list[str]:
    return ["prlimit", f"--nofile={nofile}:{nofile}", "--", *cmd] if nofile else list(cmd)


@contextlib.contextmanager
def gateway_set(config: Path, port: int, log: Path, *, nofile: int | None = None,
                ready: str = "/healthz", dsn: str = "", timeout_s: float = 60
                ) -> Iterator[GatewaySet]:
    """`wattgate serve --config config` on `port` (stdout and stderr to `log`), or replicas of
    it behind a front there; `nofile` caps RLIMIT_NOFILE of each serving process. Ready once
    `ready` answers on each; always stopped."""
    url = f"http://127.0.0.1:{port}"
    if TEST_REPLICAS == 1:
        cmd = _prefixed(wattgate_cmd("serve", "--config", str(config)), nofile)
        with running(cmd, url + ready, timeout_s=timeout_s, log=log) as proc:
            yield GatewaySet(url, [url], [proc])
        return
    with contextlib.ExitStack() as stack:
        if not dsn:
            dsn = stack.enter_context(shared_postgres())
        log.write_bytes(b"")
        # one file for all: appended, so each process's lines land whole
        out = stack.enter_context(open(log, "ab"))
        procs, urls = [], []
        for path, rport in replica_configs(config, dsn, TEST_REPLICAS):
            cmd = _prefixed(wattgate_cmd("serve", "--config", str(path)), nofile)
            procs.append(stack.enter_context(running(cmd, out=out)))
            urls.append(f"http://127.0.0.1:{rport}")
        stack.callback(stop_all, GatewaySet(url, urls, procs))  # before each one's own stop
        for proc, rurl in zip(procs, urls, strict=True):
            wait_http(rurl + ready, timeout_s, proc)
        front = [sys.executable, "-m", "tests.support.rr_front", "--port", str(port),
                 "--to", ",".join(u.rsplit(":", 1)[1] for u in urls)]
        stack.enter_context(running(front, url + ready, timeout_s=timeout_s))
        got = _SETS[url] = GatewaySet(url, urls, procs, dsn)
        stack.callback(_SETS.pop, url, None)
        yield got


def stop_all(gw: GatewaySet) -> list[int | None]:
    """Stop the serving processes together (SIGTERM to each, then SIGKILL to any still
    running 15 s on); their exit codes."""
    for proc in gw.procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    for proc in gw.procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(15)
        stop(proc, signal.SIGKILL)
    return [proc.returncode for proc in gw.procs]


def _blocking(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run `coro` to its end on a loop of its own (whether or not the caller runs one)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result(timeout=60)


async def _pg_rows(dsn: str, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


def ledger_rows(ledger: Path | str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of `sql` (`?` placeholders) on the ledger: a SQLite file, or a PostgreSQL DSN."""
    if isinstance(ledger, Path):
        with contextlib.closing(sqlite3.connect(ledger)) as db:
            return [tuple(r) for r in db.execute(sql, args)]
    count = iter(range(1, len(args) + 1))
    return _blocking(_pg_rows(ledger, re.sub(r"\?", lambda _: f"${next(count)}", sql), args))


def ledger_of(gw: GatewaySet, sqlite_path: Path) -> Path | str:
    """The ledger the test's config named (`sqlite_path`), or the replicas' shared one."""
    return gw.dsn or sqlite_path

