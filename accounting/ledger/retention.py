"""Per-request rows kept for a retention, then pruned in small batches (the hourly rollups,
rollup_schema.py, keep their sums for ever).

Only final rows go: an interval's work, shares, version and row once its engine has
apportioned past it and no interval at or before it waits for late work, and a request once
every interval of its work is such an interval (one no engine ran, once it is older than
the retention). A batch is one transaction of at most about `batch_rows` rows of each
table; the apportioner runs one batch per step while there is more to prune, then looks
again a minute later (`Pruner`), so pruning a year-old ledger's backlog never holds the
ledger for long.

Work recorded later than the retention (a replica's journal replayed after it was down that
long) finds its intervals gone: it is counted in the request rollups and charged nothing
(the apportioner marks such an interval clean, as it does work from before an engine was
metered).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from accounting.ledger.base import Ledger

Fetch = Callable[[str, tuple[Any, ...]], Awaitable[list[tuple[Any, ...]]]]
Batch = tuple[str, Sequence[Sequence[Any]]]
Transaction = Callable[[Sequence[Batch]], Awaitable[None]]

PRUNE_BATCH_ROWS = 5000
PRUNE_EVERY_S = 60.0  # how often to look again once nothing is left to prune

_ENGINES = "SELECT engine, next_interval FROM engine_state"
_FIRST_DIRTY = "SELECT MIN(interval_idx) FROM work_versions WHERE engine = ? AND dirty = 1"
_FIRST_INTERVAL = "SELECT MIN(interval_idx) FROM intervals WHERE engine = ?"
# Work is in packs (packs.py), and in per-row `work` where written before them
_WORK_TABLES = ("work", "work_packs")
_FIRST_WORK = tuple(f"SELECT MIN(interval_idx) FROM {table} WHERE engine = ?"
                    for table in _WORK_TABLES)
# The interval of the work row (or pack) `batch_rows` rows on: prune below it and a batch
# holds fewer.
_WORK_AT = tuple(f"""SELECT interval_idx FROM {table} WHERE engine = ? AND interval_idx < ?
    ORDER BY interval_idx LIMIT 1 OFFSET ?""" for table in _WORK_TABLES)
_DELETE_BELOW = tuple(f"DELETE FROM {table} WHERE engine = ? AND interval_idx < ?"
                      for table in (*_WORK_TABLES, "shares", "intervals", "work_versions"))
_FINAL_REQUESTS = """SELECT request_id FROM requests WHERE finished_s < ? AND engine = ?
    AND last_interval < ? LIMIT ?"""
_UNRUN_REQUESTS = """SELECT request_id FROM requests WHERE finished_s < ?
    AND last_interval IS NULL LIMIT ?"""
_DELETE_REQUEST = "DELETE FROM requests WHERE request_id = ?"


async def prune(fetch: Fetch, transaction: Transaction, before_s: float, interval_s: float,
                batch_rows: int = PRUNE_BATCH_ROWS) -> bool:
    """Prune one batch of final rows older than `before_s` (wall clock); True when more is
    left."""
    # nothing is older than the epoch: a retention longer than the clock (1e300 days) must
    # not reach SQLite as an integer past 64 bits, nor floor() as -inf
    before_s = max(before_s, 0.0)
    more = False
    requests: list[str] = []
    intervals: list[Batch] = []
    last_wanted = math.floor(before_s / interval_s)  # intervals below it are old enough
    for engine, next_interval in await fetch(_ENGINES, ()):
        first_dirty = (await fetch(_FIRST_DIRTY, (engine,)))[0][0]
        # apportioned past, the interval after too (its shares' requests are final), clean
        below = min(last_wanted, int(next_interval) - 1,
                    int(first_dirty) if first_dirty is not None else last_wanted)
        hi, left = await _interval_batch(fetch, engine, below, batch_rows)
        more = more or left
        if hi is not None:
            intervals += [(q, [(engine, hi)]) for q in _DELETE_BELOW]
        ids = await fetch(_FINAL_REQUESTS, (before_s, engine, below, batch_rows))
        requests += [r[0] for r in ids]
        more = more or len(ids) == batch_rows
    ids = await fetch(_UNRUN_REQUESTS, (before_s, batch_rows))
    requests += [r[0] for r in ids]
    more = more or len(ids) == batch_rows
    if intervals or requests:
        await transaction([*intervals, (_DELETE_REQUEST, [(r,) for r in requests])])
    return more


async def _interval_batch(fetch: Fetch, engine: str, below: int, batch_rows: int
                          ) -> tuple[int | None, bool]:
    """The interval to prune `engine` below in this batch (None: nothing), and whether older
    intervals than `below` remain after it."""
    firsts = [(await fetch(q, (engine,)))[0][0] for q in (_FIRST_INTERVAL, *_FIRST_WORK)]
    known = [int(f) for f in firsts if f is not None]
    if not known or min(known) >= below:
        return None, False
    start = min(known)
    hi = min(below, start + batch_rows)  # intervals hold a row each: at most batch_rows
    for query in _WORK_AT:
        at = await fetch(query, (engine, hi, batch_rows))
        if at:
            hi = max(int(at[0][0]), start + 1)  # a lone interval with more work goes whole
    return hi, hi < below


class Pruner:
    """Runs `Ledger.prune` from the apportioner's steps: a batch per step while more is left,
    then every PRUNE_EVERY_S."""

    def __init__(self, ledger: Ledger, retention_s: float, interval_s: float, *,
                 batch_rows: int = PRUNE_BATCH_ROWS, every_s: float = PRUNE_EVERY_S):
        self.ledger = ledger
        self.retention_s = retention_s
        self.interval_s = interval_s
        self.batch_rows = batch_rows
        self.every_s = every_s
        self._next_s = -math.inf

    async def step(self, now: float) -> bool:
        """Prune a batch if one is due; True when it ran and more is left."""
        if now < self._next_s:
            return False
        more = await self.ledger.prune(now - self.retention_s, self.interval_s,
                                       self.batch_rows)
        self._next_s = now if more else now + self.every_s
        return more
