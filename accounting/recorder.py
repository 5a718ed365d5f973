"""The recorder, on every gateway process: finished requests queued in O(1) on the hot path
(and journalled), turned into ledger rows off it in bounded chunks, written in batches with
this replica's watermark, and the watermark re-published as a heartbeat while requests are
open, so the apportioner (wherever it runs) knows what may still arrive.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from accounting.chunks import in_chunks
from accounting.config import AccountingConfig
from accounting.journal import Journal, recover
from accounting.ledger.base import Ledger, LedgerError, RequestRow, Watermark
from accounting.metrics import RecorderMetrics
from accounting.prefill import CHUNK_TOKENS, DEFAULT_TPOT_S, PrefillRates
from accounting.queued import queued_behind, queued_prompts
from accounting.work import Work, work_rows
from core.records import RequestRecord
from core.timing import Latency

# RequestRow.from_record in C (accounting/_requestrow.c), where it was built
compiled_request_row: Callable[..., RequestRow] | None
try:
    from accounting._requestrow import request_row as compiled_request_row
except ImportError:  # pragma: no cover - a build without a C compiler
    compiled_request_row = None
compiled_untrack: Callable[[list[Any], tuple[type, ...]], int] | None  # where it was built
try:
    from accounting._untrack import untrack as compiled_untrack
except ImportError:  # pragma: no cover - a build without a C compiler
    compiled_untrack = None

log = logging.getLogger("wattgate.accounting")

INGEST_CHUNK = 32  # records turned into rows between two yields to the event loop, at least
INGEST_SLICES = 16  # at most: a backlog goes in bigger slices, not over more loop turns
HEARTBEAT_S = 1.0  # a replica with requests open re-publishes its watermark at least this often


def child_gc() -> None:
    """The accounting child's garbage collector: what start-up made frozen out of its
    collections. The thresholds stay Python's: with the young generation collected every
    50,000 allocations (and the older ones 20 and 100 times less often) the child saved 3 us
    of CPU per record but its RSS grew 6 MB/h in the 30-minute soak (bench/soak.py), where
    it grows 1.5 MB/h with the defaults: cyclic garbage waited hours for a full collection."""
    gc.freeze()


def untrack(values: list[Any]) -> None:
    """Take records and request rows (their latencies and tuples with them) off the garbage
    collector's lists: they hold only strings and numbers, so no cycle can go through them,
    and each collection walked every one still waiting for a flush (accounting/_untrack.c).
    Where that module was not built, they stay tracked."""
    if compiled_untrack is not None:
        compiled_untrack(values, _NESTED)


_NESTED = (Latency,)  # what a record holds that may be untracked with it


def _nothing_open() -> float | None:
    return None


class _Held(NamedTuple):
    """A queued long prompt's record waiting for the records of the prompts read before it."""

    rec: RequestRecord
    seq: int  # its place in recording order
    floor: int  # the journal segment it may be in, at the lowest
    since: float  # when it began to wait (the recorder's clock)
    dispatched: float  # wall clock


class LedgerRecorder:
    """Writes finished requests to the ledger for one replica: queued, journalled, turned
    into rows and written in batches with the replica's watermark."""

    def __init__(self, config: AccountingConfig, ledger: Ledger, replica: str, *,
                 clock: Callable[[], float], metrics: RecorderMetrics | None = None):
        self.config = config
        self.ledger = ledger
        self.replica = replica
        self.metrics = metrics
        self._clock = clock
        self._pending: list[RequestRecord] = []
        self._requests: list[RequestRow] = []
        self._work: dict[str, list[Work]] = {}  # by engine, each row a WorkRow's fields
        self._last_flush = 0.0
        self._open_since: Callable[[], float | None] = _nothing_open
        self._published: tuple[float | None, float] | None = None  # (open since, when)
        self.prefill_rates = PrefillRates()  # learnt from the records, sizes prefill spans
        self.queued_prompts = queued_prompts()  # places queued prompts' chunks (queued.py)
        self._held: list[_Held] = []  # in recording order
        self._settled: set[str] = set()  # held records whose predecessors are all recorded
        self._taken = 0  # records taken from _pending, in recording order
        self._written_raw = 0  # records written, whatever their order
        jc = config.journal
        self.journal = (Journal(Path(jc.directory(config.ledger)), jc.fsync_s)
                        if jc.enabled else None)
        self._journal_ingested = 0  # records of journal segments below this are ingested
        self.records_written = 0  # records whose rows are in the ledger, in recording order
        self.on_written: Callable[[int], None] | None = None  # told `records_written` per flush
        if metrics is not None and self.journal is not None:
            journal = self.journal
            # A journal that failed (a full disk) stopped: records still reach the ledger,
            # but a crash now loses the flush window; say so
            metrics.journal_failed.set_function(lambda: float(journal.failed))

    def watch(self, open_since: Callable[[], float | None]) -> None:
        """Where to learn the wall-clock arrival of the oldest request still being served
        (None: none). The apportioner waits for such requests before it apportions the
        intervals they are in flight over, so a long stream does not make every interval it
        spans be apportioned again when it finishes (see `hold_s`)."""
        self._open_since = open_since

    def record(self, rec: RequestRecord) -> None:
        """Queue a finished request for the ledger (O(1), no I/O)."""
        self._pending.append(rec)
        if self.journal is not None:
            self.journal.append(rec)

    def record_encoded(self, recs: list[RequestRecord], lines: bytes) -> None:
        """Queue finished requests that arrive already encoded as journal lines (the
        accounting child's, from its gateway): the lines go to the journal as they are."""
        self._pending += recs
        if self.journal is not None:
            self.journal.append_encoded(lines, len(recs))

    async def step(self) -> None:
        """Ingest what was recorded; write a batch when one is due."""
        await self.ingest_chunked()
        if self._clock() - self._last_flush >= self.config.flush_s:
            await self.flush()

    async def stop(self) -> None:
        """Write everything recorded (the ledger stays open: its owner closes it)."""
        self.ingest()
        try:
            await self.flush()
        except LedgerError as exc:
            log.error("stopping with %d request records not written to the ledger: %s",
                      len(self._requests), exc)
        if self.journal is not None:
            await asyncio.to_thread(self.journal.close)

    async def replay_journal(self) -> None:
        """Write to the ledger the journalled records of gateway processes that are gone (a
        crash), then start this process's journal."""
        journal = self.journal
        if journal is None:
            return
        try:
            found = await asyncio.to_thread(recover, journal.directory, journal.owner)
        except OSError as exc:
            self._no_journal(exc)
            return
        if found.files:
            log.warning("replaying %d request records (%d torn lines skipped) from %d journal "
                        "files in %s", len(found.records), found.skipped_lines,
                        len(found.files), journal.directory)
            self._pending[:0] = found.records
            self.ingest()
            try:
                await self.flush()
            except LedgerError as exc:
                # The rows stay queued here and the files stay for the next start.
                log.error("journal replay not written to the ledger yet: %s", exc)
                found.abandon()
            else:
                await asyncio.to_thread(found.done)
        try:
            await asyncio.to_thread(journal.open)
        except OSError as exc:
            self._no_journal(exc)

    def _no_journal(self, exc: OSError) -> None:
        # A read-only or missing disk must not keep the gateway down: the ledger's own
        # batching still holds, with its longer crash window.
        log.error("request journal unavailable, running without it: %s", exc)
        self.journal = None

    async def ingest_chunked(self, chunk: int = INGEST_CHUNK,
                             slices: int = INGEST_SLICES) -> None:
        """`ingest` in chunks, yielding to the loop between them so a burst of records never
        holds up request handling for long (~10 us of CPU per record), in at most `slices`
        chunks. On a saturated gateway one loop turn serves every ready connection and lasts
        milliseconds; fixed 32-record chunks then spread one step's ingest over most of a
        second, and the ledger fell seconds behind the requests (a crash would have lost them)."""
        pending, self._pending = self._pending, []
        cut = self._journal_cut(pending)
        pending = self._hold(pending)
        chunk = max(chunk, -(-len(pending) // slices))
        done = 0
        try:
            async for part in in_chunks(pending, chunk):
                self._rows_from(part)
                done += len(part)
        finally:
            if done < len(pending):  # cancelled (stopping): the rest waits for the last ingest
                self._pending[:0] = pending[done:]
        self._journal_ingested = max(self._journal_ingested, cut)

    def ingest(self) -> None:
        """Turn every queued record into ledger rows now (held ones too)."""
        pending, self._pending = self._pending, []
        cut = self._journal_cut(pending)
        self._rows_from(self._hold(pending, release_all=True))
        self._journal_ingested = max(self._journal_ingested, cut)

    def _hold(self, pending: list[RequestRecord], release_all: bool = False
              ) -> list[RequestRecord]:
        """The records to turn into rows now: `pending` but the long prompts that queued
        behind others, which wait until every request that came before their dispatch is
        recorded (the gateways' watermark has passed it; at most `hold_s`), so that the
        prompts read before them are known (accounting/queued.py); then, after the others,
        in order of dispatch."""
        seq = self._taken
        self._taken += len(pending)
        hold_s = self.config.hold_s
        if hold_s <= 0.0 and not self._held:
            return pending
        now = self._clock()
        out: list[RequestRecord] = []
        rate = self.prefill_rates.rate
        for i, rec in enumerate(pending):
            if (hold_s > 0.0 and not release_all and rec.prompt_tokens > CHUNK_TOKENS
                    and rec.dispatched_s is not None and rec.first_token_s is not None
                    and queued_behind(rec, rate(rec.engine, rec.prompt_tokens))):
                wall = rec.dispatched_s + rec.arrived_wall_s - rec.arrived_s
                self._held.append(_Held(rec, seq + i, self._journal_ingested, now, wall))
            else:
                out.append(rec)
        if not self._held:
            return out
        since = None if release_all else self._open_since()
        go: list[_Held] = []
        keep: list[_Held] = []
        for h in self._held:
            if not release_all and (since is None or since > h.dispatched):
                self._settled.add(h.rec.request_id)  # every prompt before it is recorded
            elif not release_all and now - h.since < hold_s:
                keep.append(h)
                continue
            go.append(h)
        self._held = keep
        out += [h.rec for h in sorted(go, key=lambda h: h.dispatched)]
        return out

    def _journal_cut(self, pending: Sequence[RequestRecord]) -> int:
        """Cut the journal where `pending` ends (0: nothing to cut)."""
        if self.journal is None or not pending:
            return 0
        return self.journal.cut()

    def _rows_from(self, pending: Sequence[RequestRecord]) -> None:
        dt = self.config.interval_s
        replica = self.replica
        from_record = (RequestRow.from_record if compiled_request_row is None
                       else partial(compiled_request_row, RequestRow))
        append = self._requests.append
        by_engine = self._work
        rates = self.prefill_rates
        observe, rate, tpot = rates.observe, rates.rate, rates.tpot
        place, settled = self.queued_prompts.place, self._settled
        default_tpot = DEFAULT_TPOT_S
        new = len(self._requests)
        for rec in pending:
            observe(rec)
            engine = rec.engine
            # the decode pace places only the decode of a request without a token event
            stepped = rec.first_token_s is not None
            r = rate(engine, rec.prompt_tokens, stepped)
            # every record is remembered; a queued prompt's chunks are placed only where it
            # waited for the records of the prompts before it (_hold)
            chunks = place(rec, r) if stepped else None
            if chunks is not None and rec.request_id not in settled:
                chunks = None
            settled.discard(rec.request_id)
            work = work_rows(rec, dt, r, default_tpot if stepped else tpot(engine),
                             chunks=chunks)
            append(from_record(rec, dt, replica, work))
            if work:  # the ledger packs them by engine (ledger/packs.py): no row is rebuilt
                if engine in by_engine:
                    by_engine[engine] += work
                else:
                    by_engine[engine] = work
        untrack(self._requests[new:])
        if self.metrics:
            self.metrics.pending.set(len(self._requests))

    async def flush(self) -> None:
        now = self._last_flush = self._clock()
        since = self._watermark()
        if not self._requests and not self._work and not self._watermark_due(since, now):
            return
        requests, work = self._requests, self._work
        self._requests, self._work = [], {}
        try:
            await self.ledger.append(requests, work, Watermark(self.replica, since, now))
        except LedgerError:
            self._requests[:0] = requests
            for engine, rows in self._work.items():  # what came since goes after
                work.setdefault(engine, []).extend(rows)
            self._work = work
            raise
        self._published = (since, now)
        if self.journal is not None:  # a held record's segment stays
            self.journal.release(min([self._journal_ingested, *(h.floor for h in self._held)]))
        self._written_raw += len(requests)
        # in recording order: a held record's frame is not acknowledged before it is written
        self.records_written = (min(self._written_raw, self._held[0].seq) if self._held
                                else self._written_raw)
        if self.on_written is not None:
            self.on_written(self.records_written)

    def _watermark(self) -> float | None:
        """The earliest wall-clock time this replica may still record work at: the arrival of
        its oldest request being served, or recorded but not in this flush (None: none)."""
        since = self._open_since()
        for rec in (*self._pending, *(h.rec for h in self._held)):
            if since is None or rec.arrived_wall_s < since:
                since = rec.arrived_wall_s
        return since

    def _watermark_due(self, since: float | None, now: float) -> bool:
        """Publish without rows only when the watermark appears or goes, or as a heartbeat
        while it holds (an idle replica writes nothing)."""
        if self._published is None:
            return True
        last_since, last_at = self._published
        if since is None:
            return last_since is not None
        return last_since is None or now - last_at >= HEARTBEAT_S

    @property
    def queued(self) -> int:
        """Records recorded and not yet written (or written after a held one), whether turned
        into rows or not."""
        return (len(self._pending) + len(self._requests) + len(self._held)
                + self._written_raw - self.records_written)

    @property
    def unwritten(self) -> int:
        """Requests turned into rows and not yet written to the ledger."""
        return len(self._requests)

    @property
    def unwritten_work(self) -> int:
        """Work rows not yet written to the ledger."""
        return sum(map(len, self._work.values()))

    def drop_queued(self) -> None:
        """Forget the records queued and not yet ingested (benchmarks of `record` only)."""
        self._pending.clear()

    def pending_request(self, request_id: str, estimated: Callable[[str], bool]
                        ) -> dict[str, Any] | None:
        """A request recorded here but not yet written to the ledger (within one flush);
        `estimated(engine)`: whether that engine's energy is estimated."""
        return pending_request(request_id, [*self._pending, *(h.rec for h in self._held)],
                               self._requests, self.config,
                               self.replica, self.prefill_rates, estimated)


def pending_request(request_id: str, records: Sequence[RequestRecord],
                    rows: Sequence[RequestRow], config: AccountingConfig, replica: str,
                    rates: PrefillRates, estimated: Callable[[str], bool]
                    ) -> dict[str, Any] | None:
    """The request `request_id` among records not yet turned into rows and rows not yet
    written, as the ledger's request read shows it (no energy yet, not final)."""
    dt = config.interval_s
    found = [RequestRow.from_record(r, dt, replica, work_rows(
                 r, dt, rates.rate(r.engine, r.prompt_tokens, r.first_token_s is not None),
                 rates.tpot(r.engine)))
             for r in records if r.request_id == request_id]
    found += [r for r in rows if r.request_id == request_id]
    if not found:
        return None
    r = found[0]
    return {"request_id": r.request_id, "tenant": r.tenant, "model": r.model,
            "engine": r.engine, "precision": r.precision, "slo_class": r.slo_class,
            "status": r.status, "stream": bool(r.stream), "arrived_s": r.arrived_s,
            "finished_s": r.finished_s, "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens, "slo_met": bool(r.slo_met),
            "energy_j": 0.0, "energy_kwh": 0.0, "carbon_g": 0.0, "cost_usd": 0.0,
            "final": False, "estimated": estimated(r.engine), "replica": r.replica,
            "prompt_source": r.prompt_source, "http_status": r.http_status,
            "outcome": r.outcome, "failed_energy_j": 0.0}
