"""Accounting for one process, assembled from the roles its `AccountingMode` (mode.py) gives
it: the recorder where it records, the meter poller and the apportioner where it apportions.

- inline (records here, apportions here): all three on this event loop (tests, and
  `accounting.apportioner: inline`);
- recorder only (apportions elsewhere): a gateway whose apportioner runs in another process
  (`external`, e.g. a Kubernetes Deployment); it reads the engines' apportioned boundaries
  back from the ledger for the routing models;
- linked (records in the child, `link=`): a gateway with an accounting child (started by
  `wattgate serve`): its records go to the child over a socket (link.py), which records,
  journals and writes them and, for `process`, apportions; the gateway only queues them and
  reads the boundaries back;
- apportioner only (records elsewhere), or apportioner and recorder of a linked gateway's
  records: the accounting child (process.py).

Wiring in an aiohttp app:  app.cleanup_ctx.append(service.cleanup_ctx)
and hand every finished RequestRecord to `service.record(rec)`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from accounting.apportioner import Apportioner, CounterDebt
from accounting.config import AccountingConfig
from accounting.ledger.base import EngineState, Ledger, LedgerError
from accounting.link import RecordLink
from accounting.metering import (
    EngineInfo,
    MeteredEngine,
    MeterPoller,
    make_ledger,
    metered_engines,
)
from accounting.metrics import ApportionerMetrics, RecorderMetrics
from accounting.mode import INLINE, AccountingMode
from accounting.prefill import PrefillRates
from accounting.recorder import INGEST_CHUNK, LedgerRecorder, pending_request
from core.records import RequestRecord
from core.tasks import cancel_and_wait
from engines.meters.base import Meter

log = logging.getLogger("wattgate.accounting")

__all__ = ["AccountingService", "EngineInfo", "make_ledger"]

STATES_EVERY_S = 1.0  # a recorder-only process re-reads the apportioned boundaries this often
LINK_DRAIN_S = 5.0  # a stopping linked gateway waits this long for its child to write its records


# A meter reading this long after each interval boundary: the energy at a boundary is
# interpolated between the readings around it, and readings poll_s (0.25 s, more on a loaded
# machine) apart gave an interval up to 30 J of its neighbour's when a burst's prefill began
# just before the boundary.
BOUNDARY_LAG_S = 0.002


def poll_pause(now: float, interval_s: float, poll_s: float) -> float:
    """Seconds until the next step: poll_s, or less where the next interval boundary (wall
    clock) comes sooner, then BOUNDARY_LAG_S past it."""
    edge = (now // interval_s + 1.0) * interval_s + BOUNDARY_LAG_S - now
    if edge > interval_s:  # just past a boundary, before its lag: that one
        edge -= interval_s
    return min(poll_s, max(edge, 0.0))


class AccountingService:
    def __init__(self, config: AccountingConfig, engines: Sequence[EngineInfo], *,
                 ledger: Ledger | None = None, meters: dict[str, Meter] | None = None,
                 registry: Any = None, clock: Callable[[], float] = time.time,
                 replica: str | None = None, mode: AccountingMode = INLINE,
                 link: RecordLink | None = None):
        """`mode`: the roles of this process (`accounting_mode`); `link`: to the accounting
        child, where the mode records there."""
        assert mode.enabled and (link is not None) == (mode.records == "child"), mode
        self.config = config
        self.mode = mode
        self.ledger = ledger if ledger is not None else make_ledger(config.ledger)
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}"
        self.infos = {e.name: e for e in engines}
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._stepped = asyncio.Event()  # one step done: the meters read, the ledger reached
        self.link = link
        self.recorder = (LedgerRecorder(config, self.ledger, self.replica, clock=clock,
                                        metrics=RecorderMetrics(registry)
                                        if registry is not None else None)
                         if mode.records_here else None)
        # Queue a finished request for the ledger (O(1), no I/O): the link's or the
        # recorder's own `record`, with no call in between on the hot path.
        self.record: Callable[[RequestRecord], None] = (
            link.record if link is not None
            else self.recorder.record if self.recorder is not None else self._no_record)
        self.engines: dict[str, MeteredEngine] = {}
        self.poller: MeterPoller | None = None
        self.apportioner: Apportioner | None = None
        self._ledger_errors: Any = None
        self.apportioner_metrics: ApportionerMetrics | None = None  # where this one apportions
        if mode.apportions_here:
            self.apportioner_metrics = metrics = (ApportionerMetrics(registry)
                                                  if registry is not None else None)
            self.engines = metered_engines(config, engines, meters)
            self.poller = MeterPoller(self.engines, self.ledger, metrics)
            self.apportioner = Apportioner(config, self.engines, self.ledger, metrics,
                                           started_s=clock())
            self._ledger_errors = metrics.ledger_errors if metrics else None
        if self.recorder is not None and self.recorder.metrics is not None:
            self._ledger_errors = self.recorder.metrics.ledger_errors
        self._states: dict[str, EngineState] = {}  # read back when apportioned elsewhere
        self._states_read = -STATES_EVERY_S

    # --- hot path ---------------------------------------------------------------------------

    @staticmethod
    def _no_record(rec: RequestRecord) -> None:
        raise AssertionError("this accounting service does not record")

    def watch(self, open_since: Callable[[], float | None]) -> None:
        """See `LedgerRecorder.watch`."""
        if self.recorder is not None:
            self.recorder.watch(open_since)
        if self.link is not None:
            self.link.watch(open_since)

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.ledger.open()
        if self.recorder is not None:
            try:
                await self.recorder.replay_journal()
            except BaseException:
                # a journal that cannot be replayed fails the start: the ledger it opened
                # (its connections, the apportioner lock) must not outlive it
                await self.ledger.close()
                raise
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="wattgate-accounting")

    async def stop(self) -> None:
        """Stop the loop, write everything recorded, store the counters, close the ledger
        (which releases the apportioner lock)."""
        self._stopping.set()
        await cancel_and_wait(self._task)
        self._task = None
        if self.recorder is not None:
            await self.recorder.stop()
        if self.link is not None:
            await self.link.drain(LINK_DRAIN_S)
        if self.poller is not None and self.is_apportioner:
            await self.poller.store_counters()
        await self.ledger.close()
        if self.poller is not None:
            await self.poller.close()

    async def cleanup_ctx(self, _app: object) -> AsyncIterator[None]:
        await self.start()
        yield
        await self.stop()

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.step()
                self._stepped.set()
            except LedgerError as exc:
                # The ledger may be briefly unreachable; records stay buffered until it is back.
                log.warning("accounting step failed: %s", exc)
                if self._ledger_errors is not None:
                    self._ledger_errors.inc()
            await asyncio.sleep(poll_pause(self._clock(), self.config.interval_s,
                                           self.config.poll_s))

    async def first_step(self) -> None:
        """Wait for the loop's first successful step (meters read, ledger reached)."""
        await self._stepped.wait()

    async def step(self) -> None:
        """Poll meters, write due batches, apportion what is ready (if this process may)."""
        if self.poller is not None:
            await self.poller.poll()
        if self.recorder is not None:
            await self.recorder.step()
        if self.link is not None:
            self.link.step()
        if self.apportioner is not None:
            await self.apportioner.step(self._clock())
        else:
            await self._read_states()

    async def _read_states(self) -> None:
        now = self._clock()
        if now - self._states_read >= STATES_EVERY_S:
            self._states_read = now
            self._states = await self.ledger.states()

    # --- the roles' operations, for tests and benchmarks driving one step at a time ----------

    async def poll_meters(self) -> None:
        assert self.poller is not None
        await self.poller.poll()

    async def ingest_chunked(self, chunk: int = INGEST_CHUNK) -> None:
        assert self.recorder is not None
        await self.recorder.ingest_chunked(chunk)

    def ingest(self) -> None:
        assert self.recorder is not None
        self.recorder.ingest()

    async def flush(self) -> None:
        assert self.recorder is not None
        await self.recorder.flush()

    async def apportion_ready(self, now: float) -> int:
        assert self.apportioner is not None
        return await self.apportioner.apportion_ready(now)

    async def take_apportioner(self) -> bool:
        assert self.apportioner is not None
        return await self.apportioner.take_leadership()

    @property
    def journal(self) -> Any:
        return self.recorder.journal if self.recorder is not None else None

    # --- reads for handlers -------------------------------------------------------------------

    @property
    def is_apportioner(self) -> bool:
        return self.apportioner is not None and self.apportioner.is_leader

    def boundary(self, engine: str) -> tuple[float, float] | None:
        """(wall-clock s, cumulative J) where the engine's apportioning stands (None: not yet):
        from memory where this process apportions, else as last read from the ledger."""
        eng = self.engines.get(engine)
        st = eng.state if eng is not None else self._states.get(engine)
        return None if st is None else (st.boundary_s, st.boundary_j)

    def counter_debt(self) -> dict[str, CounterDebt]:
        return self.apportioner.counter_debt() if self.apportioner is not None else {}

    def unaccounted_j(self, engine: str) -> float | None:
        return self.apportioner.unaccounted_j(engine) if self.apportioner is not None else None

    def energy_check(self) -> dict[str, Any] | None:
        """The apportioner's energy check (None: it runs in another process)."""
        return self.apportioner.energy_check() if self.apportioner is not None else None

    def estimated(self, engine: str) -> bool:
        """Whether the engine's energy is estimated (a model meter), not measured."""
        if engine in self.engines:
            return self.engines[engine].estimated
        return engine in self.infos and self.config.meter_for(engine).meter.kind == "model"

    def pending_request(self, request_id: str) -> dict[str, Any] | None:
        """A request recorded here but not yet written to the ledger (within one flush)."""
        if self.link is not None:
            return pending_request(request_id, self.link.unwritten_records(), [], self.config,
                                   self.replica, PrefillRates(), self.estimated)
        if self.recorder is None:
            return None
        return self.recorder.pending_request(request_id, self.estimated)
