"""SQLite ledger: WAL, one connection on one worker thread so the event loop never blocks.

Several gateway processes on a host may share the file; exactly one apportions, chosen by an
exclusive `flock` on `<path>.apportioner.lock` (released by the OS if the process dies).

The ledger remembers which file it opened (device and inode) and, at most once a second,
checks that its path still names that file: one deleted or replaced under a running process
would otherwise take every later write into a file nobody can read again (a restarted
apportioner creates a fresh one at the path), so from then on every operation fails with
LedgerError and `fault` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar

from accounting.ledger import rollup_schema, sql
from accounting.ledger.base import LedgerError
from accounting.ledger.budget_store import Batch, Decide
from accounting.ledger.common import SqlLedger

T = TypeVar("T")

log = logging.getLogger("wattgate.accounting")

IDENTITY_CHECK_S = 1.0  # how often the path is checked to still name the file opened
BUSY_TIMEOUT_S = 10.0  # how long a statement waits for another connection's lock
BUSY_STEP_S = 0.0005  # a write transaction retries its lock this often while another holds it


class SqliteLedger(SqlLedger):
    kind = "sqlite"
    row_locks = False  # one writer at a time (BEGIN IMMEDIATE): no order of row locks to keep

    def __init__(self, path: str | Path):
        super().__init__()
        self.path = Path(path)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wattgate-ledger")
        self._conn: sqlite3.Connection | None = None
        # Long reads beside the writes (a tenant's bills: tenant_bills), on a connection and
        # thread of their own: WAL gives them a snapshot, and admissions do not queue behind.
        self._aside_pool = ThreadPoolExecutor(max_workers=1,
                                              thread_name_prefix="wattgate-ledger-read")
        self._aside: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        self._checked_at = 0.0  # monotonic time of the last identity check

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            if self._conn is None:
                raise LedgerError("sqlite ledger is not open")
            self._check_identity()
            try:
                return fn(self._conn)
            except sqlite3.Error as exc:
                raise LedgerError(f"sqlite ledger {self.path}: {exc}") from exc

        return await _submit(self._pool, call)

    async def _fetch_aside(self, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        def call() -> list[tuple[Any, ...]]:
            if self._conn is None:
                raise LedgerError("sqlite ledger is not open")
            if self.fault is not None:
                raise LedgerError(self.fault)
            try:
                if self._aside is None:
                    self._aside = sqlite3.connect(self.path, isolation_level=None,
                                                  check_same_thread=False, timeout=10.0)
                    self._aside.execute("PRAGMA busy_timeout=10000")
                return self._aside.execute(query, params).fetchall()
            except sqlite3.Error as exc:
                raise LedgerError(f"sqlite ledger {self.path}: {exc}") from exc

        return await _submit(self._aside_pool, call)

    def _connect(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=10.0)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a process crash loses nothing committed; only power loss can.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._identity = _identity(self.path)
        self._checked_at = time.monotonic()

    def _check_identity(self) -> None:
        """Raise LedgerError once the path no longer names the file opened (on the worker
        thread, before each operation; the stat itself at most every IDENTITY_CHECK_S)."""
        if self.fault is None:
            now = time.monotonic()
            if now - self._checked_at < IDENTITY_CHECK_S:
                return
            self._checked_at = now
            now_at = _identity(self.path)
            if now_at == self._identity:
                return
            self.fault = (f"sqlite ledger {self.path} was deleted while open" if now_at is None
                          else f"sqlite ledger {self.path} was replaced by another file while "
                          "open")
            log.error("%s: writes stop rather than go to a file no reader will see; restart "
                      "the gateways and the apportioner on the ledger at that path", self.fault)
        raise LedgerError(self.fault)

    async def open(self) -> None:
        """Connect and migrate; on failure the connection is closed again, so a later open
        tries again (the worker threads stay for it)."""
        if self._conn is not None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._connect)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open sqlite ledger {self.path}: {exc}") from exc
        try:
            await self._run(_migrate)
        except BaseException:
            await self._disconnect()
            raise

    async def _disconnect(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.get_running_loop().run_in_executor(self._pool, conn.close)

    async def close(self) -> None:
        await self.release_apportioner()
        await self._disconnect()

        def close_aside() -> None:  # on the reader's thread, after any read in flight
            if self._aside is not None:
                aside, self._aside = self._aside, None
                aside.close()

        with contextlib.suppress(RuntimeError):  # closed before: its thread is gone
            await asyncio.get_running_loop().run_in_executor(self._aside_pool, close_aside)
        self._pool.shutdown(wait=True)
        self._aside_pool.shutdown(wait=True)

    async def _fetch(self, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return await self._run(lambda c: c.execute(query, params).fetchall())

    async def _snapshot(self, queries: Sequence[tuple[str, tuple[Any, ...]]]
                        ) -> list[list[tuple[Any, ...]]]:
        def read(c: sqlite3.Connection) -> list[list[tuple[Any, ...]]]:
            c.execute("BEGIN")  # deferred: the first SELECT starts one read snapshot (WAL)
            try:
                return [c.execute(q, p).fetchall() for q, p in queries]
            finally:
                c.execute("COMMIT")

        return await self._run(read)

    async def _transaction(self, batches: Sequence[Batch]) -> None:
        def tx(c: sqlite3.Connection) -> None:
            begin_immediate(c)
            try:
                for statement, rows in batches:
                    if rows:
                        execute_rows(c, statement, rows)
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")

        await self._run(tx)

    async def _locked(self, key: int, queries: Sequence[tuple[str, tuple[Any, ...]]],
                      decide: Decide) -> None:
        def tx(c: sqlite3.Connection) -> None:
            begin_immediate(c)  # one writer at a time: the lock is the database's
            try:
                rows = [c.execute(q, p).fetchall() for q, p in queries]
                for statement, params in decide(rows):
                    if params:
                        c.executemany(statement, params)
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")

        await self._run(tx)

    async def acquire_apportioner(self) -> bool:
        if self._lock_fd is not None:
            return True
        fd = os.open(f"{self.path}.apportioner.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    async def release_apportioner(self) -> None:
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


ROWS_PER_STATEMENT = 256  # at most; fewer where the build allows fewer bound parameters
_WORK_KEY = attrgetter("engine", "interval_idx", "request_id")  # an EngineWork's key
_LAST_REQUEST = "SELECT MAX(rowid) FROM requests"
_MULTI_ROW = frozenset({sql.INSERT_REQUEST, sql.INSERT_WORK, sql.INSERT_SHARE})


def execute_rows(c: sqlite3.Connection, statement: str, rows: Sequence[Sequence[Any]]) -> None:
    """`executemany`, with the ledger's bulk statements run as multi-row statements of at
    most ROWS_PER_STATEMENT rows. The sqlite3 module lets go of the GIL around every
    statement step, and the event loop, on the same core, takes it each time: row by row that
    is a thread switch per row (about twice the CPU per row, measured in the gateway), in
    blocks one per block. Block sizes are powers of two, so few statement texts exist, and
    a block's parameters stay within the library's limit (32,766 since SQLite 3.32, 999
    before). Requests inserted are added to their hourly rollup after them."""
    if statement == sql.INSERT_REQUEST:
        # the rollup of the rows inserted (rowids above the largest before them)
        (before,), = c.execute(_LAST_REQUEST).fetchall()
        _execute_rows(c, statement, rows)
        c.execute(rollup_schema.ADD_NEW_REQUEST_HOURS, (before or 0,))
    else:
        _execute_rows(c, statement, rows)


def _execute_rows(c: sqlite3.Connection, statement: str, rows: Sequence[Sequence[Any]]) -> None:
    limit = c.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    if statement not in _MULTI_ROW or len(rows) < 2:
        c.executemany(statement, rows)
        return
    if statement == sql.INSERT_WORK:
        # In key order (a stable sort: of two rows with one key the first still wins). A flush
        # holds requests in finishing order, each with its intervals; inserted so, one
        # multi-row statement lands all over the clustered table and costs ~1.5x row by row.
        rows = sorted(rows, key=_WORK_KEY)
    for part in _blocks(rows, _block_rows(limit, len(rows[0]))):
        c.execute(sql.multi_row(statement, len(part)), list(chain.from_iterable(part)))


def _block_rows(parameters: int, columns: int) -> int:
    """The most rows, a power of two up to ROWS_PER_STATEMENT, whose parameters fit."""
    size = ROWS_PER_STATEMENT
    while size > 1 and size * columns > parameters:
        size //= 2
    return size


def _blocks(rows: Sequence[T], block: int = ROWS_PER_STATEMENT) -> Iterator[Sequence[T]]:
    """Consecutive slices of `block` rows (a power of two), the rest in falling powers of
    two."""
    i, n = 0, len(rows)
    size = block
    while i < n:
        while size > n - i:
            size //= 2
        yield rows[i:i + size]
        i += size


def _identity(path: Path) -> tuple[int, int] | None:
    """The (device, inode) the path names now; None when it names nothing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def begin_immediate(c: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE, retried every BUSY_STEP_S while another connection (the apportioner's,
    another gateway's) writes, for up to BUSY_TIMEOUT_S. SQLite's own busy handler sleeps 1,
    2, 5, 10, 15, 20, 25 ms... between tries: a write of 20 ms elsewhere cost 33 ms here, one
    of 35 ms cost 53, and an admission waiting for this transaction (a tenant's request) as
    long."""
    c.execute("PRAGMA busy_timeout=0")
    try:
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                c.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                busy = (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() >= deadline:
                    raise
            time.sleep(BUSY_STEP_S)
    finally:
        c.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")


def _migrate(c: sqlite3.Connection) -> None:
    begin_immediate(c)
    try:
        c.execute(sql.CREATE_VERSION)
        current = c.execute(sql.GET_VERSION).fetchone()[0] or 0
        for version, statements in sql.schema("sqlite"):
            if version <= current:
                continue
            for statement in statements:
                c.execute(statement)
            c.execute(sql.SET_VERSION, (version,))
    except BaseException:
        c.execute("ROLLBACK")
        raise
    c.execute("COMMIT")


def _submit(pool: ThreadPoolExecutor, call: Callable[[], T]) -> asyncio.Future[T]:
    """`call` on `pool`'s thread; a LedgerError where the pool is shut down (the ledger was
    closed), not the executor's RuntimeError."""
    try:
        return asyncio.get_running_loop().run_in_executor(pool, call)
    except RuntimeError as exc:
        raise LedgerError("sqlite ledger is not open") from exc
