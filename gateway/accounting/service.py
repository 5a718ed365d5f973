"""The accounting service: hot-path `record()`, and a background loop that polls meters,
writes the ledger in batches and (in exactly one replica) apportions closed intervals.

Wiring in an aiohttp app:  app.cleanup_ctx.append(service.cleanup_ctx)
and hand every finished RequestRecord to `service.record(rec)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
from pathlib import Path
from typing import Any

from engines.meters.base import Meter, MeterError
from engines.meters.model import ModelMeter
from engines.meters.registry import make_meter
from gateway.accounting.apportion import apportion_by
from gateway.accounting.chunks import in_chunks
from gateway.accounting.coefficients import Coefficients, default_for, fit_intervals, fitted
from gateway.accounting.config import AccountingConfig, LedgerConfig
from gateway.accounting.counters import EngineCounters, begin_check, unaccounted_j
from gateway.accounting.energy import Boundary, EnergyTrack
from gateway.accounting.journal import Journal, recover
from gateway.accounting.ledger.base import (
    EngineState,
    EngineWork,
    IntervalRow,
    Ledger,
    LedgerError,
    PendingWork,
    RequestRow,
    ShareRow,
    Watermark,
    engine_work,
    hour_of,
)
from gateway.accounting.metrics import AccountingMetrics
from gateway.accounting.prefill import PrefillRates
from gateway.accounting.work import Work, interval_index, work_rows
from gateway.records import RequestRecord

log = logging.getLogger("wattgate.accounting")

DEFAULT_IDLE_W_PER_GPU = 80.0  # REFERENCE.md: 60-120 W per GPU holding a CUDA context
MAX_INTERVALS_PER_STEP = 600  # bounds one catch-up step after a long stop
INGEST_CHUNK = 32  # records turned into rows between two yields to the event loop, at least
INGEST_SLICES = 16  # at most: a backlog goes in bigger slices, not over more loop turns
BUSY_ROWS = 1024  # an interval with more rows yields to the loop between apportioning and booking
HEARTBEAT_S = 1.0  # a replica with requests open re-publishes its watermark at least this often
REPLICA_STALE_S = 10.0  # a replica not heard from this long (killed) holds nothing back
# (or four flush windows, when flush_s is long: replicas publish at most once per flush)
_new_tuple = tuple.__new__  # a NamedTuple row without its Python-level __new__


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the gateway config says about one endpoint."""

    name: str
    model: str
    precision: str
    gpus: int = 1
    kind: str = "vllm"  # engine kind: its default work coefficients differ


def make_ledger(cfg: LedgerConfig) -> Ledger:
    if cfg.kind == "postgres":
        from gateway.accounting.ledger.postgres import PostgresLedger

        return PostgresLedger(cfg.dsn)
    from gateway.accounting.ledger.sqlite import SqliteLedger

    return SqliteLedger(cfg.path)


def _nothing_open() -> float | None:
    return None


@dataclass
class _Engine:
    info: EngineInfo
    meter: Meter
    idle_power_w: float | None  # None until configured or published by the meter
    coeffs: Coefficients
    estimated: bool
    track: EnergyTrack = field(default_factory=EnergyTrack)
    counters: EngineCounters = field(default_factory=EngineCounters)
    state: EngineState | None = None
    carry_j: float = 0.0
    samples: deque[tuple[float, ...]] = field(
        default_factory=lambda: deque(maxlen=300))
    since_fit: int = 0


class AccountingService:
    def __init__(self, config: AccountingConfig, engines: Sequence[EngineInfo], *,
                 ledger: Ledger | None = None, meters: dict[str, Meter] | None = None,
                 registry: Any = None, clock: Callable[[], float] = time.time,
                 replica: str | None = None):
        self.config = config
        self.ledger = ledger if ledger is not None else make_ledger(config.ledger)
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}"
        self._clock = clock
        self._pending: list[RequestRecord] = []
        self._requests: list[RequestRow] = []
        self._work: list[EngineWork] = []
        self._last_flush = 0.0
        self._open_since: Callable[[], float | None] = _nothing_open
        self._published: tuple[float | None, float] | None = None  # (open since, when)
        self._is_apportioner = False
        self._counters_resumed = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.metrics = AccountingMetrics(registry) if registry is not None else None
        self._owed: dict[str, list[float]] = {}
        self.prefill_rates = PrefillRates()  # learnt from the records, sizes prefill spans
        self.engines: dict[str, _Engine] = {}
        for info in engines:
            cfg = config.meter_for(info.name)
            meter = (meters or {}).get(info.name) or make_meter(cfg.meter)
            idle = cfg.idle_power_w
            if isinstance(meter, ModelMeter):
                idle = meter.model.idle_power_w
            self.engines[info.name] = _Engine(
                info=info, meter=meter, idle_power_w=idle,
                coeffs=cfg.coefficients or default_for(info.precision, info.kind),
                estimated=meter.estimated,
                samples=deque(maxlen=config.fit.window))
        self._started_s = clock()
        jc = config.journal
        self.journal = (Journal(Path(jc.directory(config.ledger)), jc.fsync_s)
                        if jc.enabled else None)
        self._journal_ingested = 0  # records of journal segments below this are ingested

    def watch(self, open_since: Callable[[], float | None]) -> None:
        """Where to learn the wall-clock arrival of the oldest request still being served
        (None: none). The apportioner waits for such requests before it apportions the
        intervals they are in flight over, so a long stream does not make every interval it
        spans be apportioned again when it finishes (see `hold_s`)."""
        self._open_since = open_since

    # --- hot path ---------------------------------------------------------------------------

    def record(self, rec: RequestRecord) -> None:
        """Queue a finished request for the ledger (O(1), no I/O)."""
        self._pending.append(rec)
        if self.journal is not None:
            self.journal.append(rec)

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.ledger.open()
        if self.journal is not None:
            await self._replay_journal(self.journal)
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="wattgate-accounting")

    async def stop(self) -> None:
        """Stop the loop, write everything recorded, release the apportioner lock."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.ingest()
        try:
            await self.flush()
        except LedgerError as exc:
            log.error("stopping with %d request records not written to the ledger: %s",
                      len(self._requests), exc)
        await self._store_counters()
        if self.journal is not None:
            await asyncio.to_thread(self.journal.close)
        await self.ledger.close()
        for eng in self.engines.values():
            with contextlib.suppress(MeterError):
                await eng.meter.close()

    async def _replay_journal(self, journal: Journal) -> None:
        """Write to the ledger the journalled records of gateway processes that are gone (a
        crash), then start this process's journal."""
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

    async def cleanup_ctx(self, _app: object) -> AsyncIterator[None]:
        await self.start()
        yield
        await self.stop()

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.step()
            except LedgerError as exc:
                # The ledger may be briefly unreachable; records stay buffered until it is back.
                log.warning("accounting step failed: %s", exc)
                if self.metrics:
                    self.metrics.ledger_errors.inc()
            await asyncio.sleep(self.config.poll_s)

    # --- one step -----------------------------------------------------------------------------

    async def step(self) -> None:
        """Poll meters, write due batches, apportion what is ready (if this replica may)."""
        await self.poll_meters()
        await self.ingest_chunked()
        now = self._clock()
        if now - self._last_flush >= self.config.flush_s:
            await self.flush()
        if await self._take_apportioner():
            await self.apportion_ready(now)

    async def poll_meters(self) -> None:
        if not self._counters_resumed:
            await self._resume_counters()
        engines = [e for e in self.engines.values() if not isinstance(e.meter, ModelMeter)]
        results = await asyncio.gather(*(e.meter.read() for e in engines),
                                       return_exceptions=True)
        for eng, res in zip(engines, results, strict=True):
            if isinstance(res, MeterError):
                log.warning("meter of %s: %s", eng.info.name, res)
                if self.metrics:
                    self.metrics.meter_errors.labels(eng.info.name).inc()
                continue
            if isinstance(res, BaseException):
                raise res
            # The raw counters, not the meter's own monotonic series: the offsets the meter
            # adds live in its process only; ours are kept in the ledger (counters.py).
            total_j = eng.counters.update(res.timestamp_s, res.raw_j or res.energy_j)
            if total_j is None:
                continue  # stale or repeated reading
            eng.track.add(res.timestamp_s, total_j, estimated=res.estimated)
            if eng.idle_power_w is None and res.idle_power_w is not None:
                eng.idle_power_w = res.idle_power_w
            if self.metrics:
                self.metrics.meter_resets.labels(eng.info.name).set(
                    eng.counters.resets + eng.track.resets)

    async def _resume_counters(self) -> None:
        """Before the first reading: continue each engine's counters where the ledger's
        apportioner left them, so this process counts on the same series (no re-base, the
        downtime charged what the counters grew by)."""
        states = await self.ledger.states()
        for name, eng in self.engines.items():
            st = states.get(name)
            eng.counters = EngineCounters(None if st is None else st.counter)
        self._counters_resumed = True

    async def _store_counters(self) -> None:
        """At a clean stop, the apportioner stores its counters as last read, so a reset
        during the downtime hides only what was spent between this read and the reset."""
        if not self._is_apportioner:
            return
        for name, eng in self.engines.items():
            counter = eng.counters.state()
            if eng.state is None or counter is None:
                continue
            try:
                await self.ledger.store_counter(name, counter)
            except LedgerError as exc:
                log.warning("stopping without storing the counters of %s: %s", name, exc)
                return

    async def ingest_chunked(self, chunk: int = INGEST_CHUNK,
                             slices: int = INGEST_SLICES) -> None:
        """`ingest` in chunks, yielding to the loop between them so a burst of records never
        holds up request handling for long (~10 us of CPU per record), in at most `slices`
        chunks. On a saturated gateway one loop turn serves every ready connection and lasts
        milliseconds; fixed 32-record chunks then spread one step's ingest over most of a
        second, and the ledger fell seconds behind the requests (a crash would have lost them)."""
        pending, self._pending = self._pending, []
        cut = self._journal_cut(pending)
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
        """Turn every queued record into ledger rows now."""
        pending, self._pending = self._pending, []
        cut = self._journal_cut(pending)
        self._rows_from(pending)
        self._journal_ingested = max(self._journal_ingested, cut)

    def _journal_cut(self, pending: Sequence[RequestRecord]) -> int:
        """Cut the journal where `pending` ends (0: nothing to cut)."""
        if self.journal is None or not pending:
            return 0
        return self.journal.cut()

    def _rows_from(self, pending: Sequence[RequestRecord]) -> None:
        dt = self.config.interval_s
        replica = self.replica
        from_record = RequestRow.from_record
        append = self._requests.append
        extend = self._work.extend
        rates = self.prefill_rates
        observe, rate, tpot = rates.observe, rates.rate, rates.tpot
        for rec in pending:
            observe(rec)
            work = work_rows(rec, dt, rate(rec.engine, rec.prompt_tokens), tpot(rec.engine))
            append(from_record(rec, dt, replica, work))
            extend(engine_work(rec.engine, work))
        if self.metrics:
            self.metrics.pending.set(len(self._requests))

    async def flush(self) -> None:
        now = self._last_flush = self._clock()
        since = self._watermark()
        if not self._requests and not self._work and not self._watermark_due(since, now):
            return
        requests, work = self._requests, self._work
        self._requests, self._work = [], []
        try:
            await self.ledger.append(requests, work, Watermark(self.replica, since, now))
        except LedgerError:
            self._requests[:0] = requests
            self._work[:0] = work
            raise
        self._published = (since, now)
        if self.journal is not None:
            self.journal.release(self._journal_ingested)

    def _watermark(self) -> float | None:
        """The earliest wall-clock time this replica may still record work at: the arrival of
        its oldest request being served, or recorded but not in this flush (None: none)."""
        since = self._open_since()
        for rec in self._pending:
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

    async def _take_apportioner(self) -> bool:
        held = await self.ledger.acquire_apportioner()
        if held and not self._is_apportioner:
            # Newly in charge: continue exactly where the previous apportioner stopped.
            states = await self.ledger.states()
            for name, eng in self.engines.items():
                st = states.get(name)
                eng.state = None
                eng.carry_j = 0.0
                if st is not None:
                    eng.track.anchor(Boundary(st.boundary_s, st.boundary_j))
                    own = eng.track.energy_at(st.boundary_s)
                    eng.state = self._checked(eng, replace(
                        st, boundary_j=st.boundary_j if own is None else own))
        self._is_apportioner = held
        return held

    # --- apportioning -------------------------------------------------------------------------

    def _init_state(self, eng: _Engine) -> EngineState | None:
        dt = self.config.interval_s
        if isinstance(eng.meter, ModelMeter):
            k0 = interval_index(self._started_s, dt)
            return EngineState(eng.info.name, k0, k0 * dt, 0.0)
        first = eng.track.first
        if first is None:
            return None
        # The engine's first interval is the one its first reading falls in, measured from that
        # reading on (the counter is taken as flat before it): requests served before the
        # next whole interval still get the energy measured while they ran.
        k0 = interval_index(first.time_s, dt)
        e0 = eng.track.energy_at(k0 * dt)
        return None if e0 is None else self._checked(eng, EngineState(eng.info.name, k0, k0 * dt,
                                                                      e0))

    def _checked(self, eng: _Engine, st: EngineState) -> EngineState:
        """`st` with the check's apportioned sum, begun here where no stored count goes on."""
        if isinstance(eng.meter, ModelMeter):
            return st  # no counter to check against
        latest = eng.track.latest
        pending_j = 0.0 if latest is None else latest.energy_j - st.boundary_j
        return replace(st, apportioned_j=begin_check(eng.counters, st.apportioned_j, pending_j))

    def _limit(self, now: float, open_since: float | None) -> float:
        """The latest interval end that may be apportioned: settled, and before `open_since`
        (the earliest arrival of a request still open on any replica) unless held `hold_s`."""
        limit = now - self.config.settle_s
        if open_since is not None:
            limit = min(limit, max(open_since, now - self.config.hold_s))
        return limit

    def _ready(self, eng: _Engine, st: EngineState, now: float, limit: float
               ) -> list[tuple[int, float | None]]:
        """Intervals that end by `limit`, with the cumulative energy at their end."""
        dt = self.config.interval_s
        out: list[tuple[int, float | None]] = []
        k = st.next_interval
        while (k + 1) * dt <= limit and len(out) < MAX_INTERVALS_PER_STEP:
            t_end = (k + 1) * dt
            if isinstance(eng.meter, ModelMeter):
                out.append((k, None))
            else:
                e_end = eng.track.energy_at(t_end)
                if e_end is None:
                    if now - t_end <= self.config.max_lag_s:
                        break  # wait for the meter to catch up
                    # The meter is silent: close the interval with what it has shown; the rest
                    # stays in the counter and lands in a later interval.
                    e_end = eng.track.energy_at(t_end, hold=True)
                    e_end = st.boundary_j if e_end is None else e_end
                out.append((k, e_end))
            k += 1
        return out

    async def apportion_ready(self, now: float) -> int:
        """Apportion every settled interval and every interval revised by late work."""
        stale_s = max(REPLICA_STALE_S, 4.0 * self.config.flush_s)
        open_since = (await self.ledger.open_since(now - stale_s)
                      if self.config.hold_s > 0.0 else None)
        limit = self._limit(now, open_since)
        if self.metrics:
            self.metrics.held.set(now - self.config.settle_s - limit)
        done = 0
        for eng in self.engines.values():
            if eng.state is None:
                eng.state = self._init_state(eng)
            if eng.state is not None:
                done += await self._apportion_engine(eng, eng.state, now, limit)
        return done

    async def _apportion_engine(self, eng: _Engine, st: EngineState, now: float,
                                limit: float) -> int:
        ready = self._ready(eng, st, now, limit)
        dirty = await self.ledger.dirty(eng.info.name, st.next_interval)
        if not ready and not dirty:
            self._publish_residual(eng, st)
            return 0
        name = eng.info.name
        # The rows of the ready intervals and of the revised ones, with the versions of their
        # intervals as read: an interval written to after this read stays dirty.
        ranges = ([(ready[0][0], ready[-1][0])] if ready else []) + (
            [(dirty[0], dirty[-1])] if dirty else [])
        snap = await self.ledger.snapshot(name, ranges)
        wanted = set(dirty)  # the dirty range may hold clean intervals between dirty ones
        by_idx: dict[int, list[PendingWork]] = {}
        for pw in snap.rows:
            k = pw.row.interval_idx
            if k >= st.next_interval or k in wanted:
                by_idx.setdefault(k, []).append(pw)
        done = [(k, snap.versions[k]) for k in (*(k for k, _ in ready), *dirty)
                if k in snap.versions]
        intervals: list[IntervalRow] = []
        shares: list[ShareRow] = []
        tenant_new: dict[str, list[float]] = {}
        boundary_s, boundary_j = st.boundary_s, st.boundary_j
        for k, e_end in ready:
            rows = by_idx.get(k, [])
            if e_end is None:  # estimated from the work itself
                assert isinstance(eng.meter, ModelMeter)
                energy = eng.meter.interval_energy_j(
                    self.config.interval_s, math.fsum(p.row.prefill_tokens for p in rows),
                    math.fsum(p.row.decode_tokens for p in rows))
                e_end = boundary_j + energy
            raw = e_end - boundary_j + eng.carry_j
            eng.carry_j = min(raw, 0.0)  # a negative step is carried, never dropped
            boundary_s, boundary_j = (k + 1) * self.config.interval_s, e_end
            await self._one(eng, k, max(raw, 0.0), rows, intervals, shares, tenant_new)
            await asyncio.sleep(0)  # one interval at a time: requests keep flowing meanwhile
        stored = {i.interval_idx: i for i in await self.ledger.intervals(name, dirty)}
        if dirty and self.metrics:
            # A revision moves joules between requests: count the change, not the total.
            for k, tenant, energy, carbon, cost in await self.ledger.tenant_shares(
                    name, dirty[0], dirty[-1]):
                if k in stored:
                    acc = tenant_new.setdefault(tenant, [0.0, 0.0, 0.0])
                    acc[0] -= energy
                    acc[1] -= carbon
                    acc[2] -= cost
        for k in dirty:
            old = stored.get(k)
            if old is None:
                # Work from before this engine was first metered: no measured energy to share
                # (the interval is marked clean all the same).
                continue
            await self._one(eng, k, old.energy_j, by_idx.get(k, []), intervals, shares,
                            tenant_new)
            if self.metrics:
                self.metrics.revisions.labels(name).inc()
        new_state = EngineState(
            name, ready[-1][0] + 1 if ready else st.next_interval, boundary_s, boundary_j,
            eng.track.resets, eng.counters.state() or st.counter,
            None if st.apportioned_j is None
            else st.apportioned_j + math.fsum(i.energy_j for i in intervals[:len(ready)]))
        await self.ledger.commit(name, intervals, shares, done, new_state)
        eng.state = new_state
        eng.track.prune(boundary_s)
        revised = intervals[len(ready):]
        idle_delta = math.fsum([*(i.idle_j for i in intervals[:len(ready)]),
                                *(i.idle_j - stored[i.interval_idx].idle_j for i in revised)])
        self._after_commit(eng, new_state, intervals[:len(ready)], tenant_new, idle_delta)
        return len(intervals)

    async def _one(self, eng: _Engine, k: int, energy_j: float, rows: list[PendingWork],
                   intervals: list[IntervalRow], shares: list[ShareRow],
                   tenant_new: dict[str, list[float]]) -> None:
        dt = self.config.interval_s
        info = eng.info
        idle_w = (eng.idle_power_w if eng.idle_power_w is not None
                  else DEFAULT_IDLE_W_PER_GPU * info.gpus)
        work = [p.row for p in rows]
        c = eng.coeffs
        result = apportion_by(energy_j, dt, idle_w, work, c)
        if len(rows) > BUSY_ROWS:
            # A busy interval (thousands of requests) takes milliseconds to apportion and about
            # as long to book: let requests through in between.
            await asyncio.sleep(0)
        t0 = k * dt
        pricing = self.config.pricing
        estimated = eng.estimated or eng.track.estimated
        intervals.append(IntervalRow(
            info.name, k, t0, dt, info.model, info.precision, info.gpus, energy_j,
            result.static_j, result.dynamic_j, result.idle_j, result.idle_s,
            pricing.carbon_g(result.idle_j, result.idle_s * info.gpus, t0),
            pricing.cost_usd(result.idle_j, result.idle_s * info.gpus, t0),
            estimated, c.alpha, c.beta, c.gamma))
        rids, energies, statics, dynamics, busys = result.columns
        if rids:
            # Column-wise: carbon and cost priced once per interval, rows built by zip.
            gpus = info.gpus
            gpu_s = [b * gpus for b in busys]
            carbon, cost = pricing.charges(energies, gpu_s, t0)
            shares.extend(map(_new_tuple, repeat(ShareRow), zip(
                rids, repeat(info.name), repeat(k), repeat(t0), repeat(hour_of(t0)), energies,
                statics, dynamics, gpu_s, carbon, cost, repeat(1 if estimated else 0))))
            tenant_of = {p.row.request_id: p.tenant for p in rows}
            setdefault = tenant_new.setdefault
            for rid, e, cg, usd in zip(rids, energies, carbon, cost, strict=True):
                acc = setdefault(tenant_of[rid], [0.0, 0.0, 0.0])
                acc[0] += e
                acc[1] += cg
                acc[2] += usd
        if work and self.config.fit.enabled:
            eng.samples.append((energy_j, dt, math.fsum(r.prefill_tokens for r in work),
                                math.fsum(r.decode_tokens for r in work),
                                math.fsum(r.kv_tokens for r in work),
                                max(r.decode_tokens for r in work)))

    def _after_commit(self, eng: _Engine, st: EngineState, new: list[IntervalRow],
                      tenant_new: dict[str, list[float]], idle_delta: float) -> None:
        if self.config.fit.enabled:
            eng.since_fit += len(new)
            if eng.since_fit >= self.config.fit.every:
                eng.since_fit = 0
                fit = fit_intervals(list(eng.samples))
                if fit is not None:
                    eng.coeffs = fitted(fit)
                    if fit.idle_power_w > 0:
                        eng.idle_power_w = fit.idle_power_w
        m = self.metrics
        if m is None:
            return
        for tenant, delta in tenant_new.items():
            for i, counter in enumerate((m.tenant_energy, m.tenant_carbon, m.tenant_cost)):
                self._count(counter, tenant, i, delta[i])
        self._count(m.engine_idle, eng.info.name, 3, idle_delta)
        m.engine_energy.labels(eng.info.name).inc(math.fsum(i.energy_j for i in new))
        self._publish_residual(eng, st)

    def _count(self, counter: Any, label: str, slot: int, delta: float) -> None:
        """Counters only go up: a label whose value a revision lowered owes the difference,
        netted against its next increments (`counter_debt` shows what is owed)."""
        owed = self._owed.setdefault(label, [0.0, 0.0, 0.0, 0.0])
        total = delta + owed[slot]
        if total > 0.0:
            counter.labels(label).inc(total)
            owed[slot] = 0.0
        else:
            owed[slot] = total

    def counter_debt(self) -> dict[str, list[float]]:
        """Per label: [energy J, carbon g, cost USD, idle J] not yet netted (<= 0)."""
        return {k: list(v) for k, v in self._owed.items()}

    def _publish_residual(self, eng: _Engine, st: EngineState) -> None:
        latest = eng.track.latest
        if self.metrics and latest is not None:
            self.metrics.residual.labels(eng.info.name).set(
                max(0.0, latest.energy_j - st.boundary_j - eng.carry_j))
            gap_j = self.unaccounted_j(eng.info.name)
            if gap_j is not None:
                self.metrics.unaccounted.labels(eng.info.name).set(gap_j)
                self.metrics.counter_step.labels(eng.info.name).set(eng.counters.step_j)

    def unaccounted_j(self, engine: str) -> float | None:
        """Joules the engine's counters grew by that no apportioned interval holds and none
        will (0 while none is lost; counters.py); None where nothing is checked (no counter,
        or not apportioned by this replica)."""
        eng = self.engines[engine]
        st, latest, metered_j = eng.state, eng.track.latest, eng.counters.metered_j
        if st is None or st.apportioned_j is None or latest is None or metered_j is None:
            return None
        pending_j = latest.energy_j - st.boundary_j + eng.carry_j
        return unaccounted_j(metered_j, st.apportioned_j, pending_j)

    # --- reads for handlers -------------------------------------------------------------------

    @property
    def is_apportioner(self) -> bool:
        return self._is_apportioner

    def work_rows_of(self, rec: RequestRecord) -> list[Work]:
        rates = self.prefill_rates
        return work_rows(rec, self.config.interval_s, rates.rate(rec.engine, rec.prompt_tokens),
                         rates.tpot(rec.engine))

    def pending_request(self, request_id: str) -> dict[str, Any] | None:
        """A request recorded here but not yet written to the ledger (within one flush)."""
        dt = self.config.interval_s
        rows = [RequestRow.from_record(r, dt, self.replica, self.work_rows_of(r))
                for r in self._pending if r.request_id == request_id]
        rows += [r for r in self._requests if r.request_id == request_id]
        if not rows:
            return None
        r = rows[0]
        est = self.engines[r.engine].estimated if r.engine in self.engines else False
        return {"request_id": r.request_id, "tenant": r.tenant, "model": r.model,
                "engine": r.engine, "precision": r.precision, "slo_class": r.slo_class,
                "status": r.status, "stream": bool(r.stream), "arrived_s": r.arrived_s,
                "finished_s": r.finished_s, "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens, "slo_met": bool(r.slo_met),
                "energy_j": 0.0, "energy_kwh": 0.0, "carbon_g": 0.0, "cost_usd": 0.0,
                "final": False, "estimated": est, "replica": r.replica,
                "prompt_source": r.prompt_source}
