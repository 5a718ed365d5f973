"""The accounting service on a SQLite ledger, as the gateway pays for it: ingest and write (every
replica), the apportioner's step (one replica), and the whole service at steady state."""

from __future__ import annotations

import asyncio
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from accounting.config import AccountingConfig
from accounting.ledger.sqlite import SqliteLedger
from accounting.service import AccountingService, EngineInfo
from bench.apportion_workload import T0, make_records
from engines.meters.base import EnergyReading


def ingest_write_cost(n: int, batch: int) -> dict[str, Any]:
    """What the gateway process spends per request off the hot path: ingest (record -> ledger
    rows, on the event loop) and the SQLite write (the ledger's worker thread), in batches of
    `batch` records (one flush window: flush_s 0.5 s at 1,000 requests/s). CPU time of the
    whole process, so the worker thread counts."""
    return asyncio.run(_ingest_write(n, batch))


async def _ingest_write(n: int, batch: int) -> dict[str, Any]:
    engines = [EngineInfo(f"e{i}", "m", "bf16", 1) for i in range(8)]
    records = make_records(n, engines=8, span_s=n / 1000.0, seed=3)
    # As in `throughput`: the benchmark's input stays out of the collector's full scans.
    gc.collect()
    gc.freeze()
    with tempfile.TemporaryDirectory() as tmp:
        ledger = SqliteLedger(Path(tmp) / "ledger.db")
        svc = AccountingService(AccountingConfig(), engines, ledger=ledger)
        await ledger.open()
        ingest_s = write_s = 0.0
        try:
            for i in range(0, n, batch):
                for rec in records[i:i + batch]:
                    svc.record(rec)
                c0 = time.process_time()
                svc.ingest()
                c1 = time.process_time()
                await svc.flush()
                c2 = time.process_time()
                ingest_s += c1 - c0
                write_s += c2 - c1
        finally:
            await ledger.close()
            gc.unfreeze()
    ingest_us, write_us = ingest_s / n * 1e6, write_s / n * 1e6
    return {"requests": n, "batch": batch, "ingest_us": ingest_us, "ledger_write_us": write_us,
            "ingest_write_us": ingest_us + write_us, "target_ingest_write_us": 20.0}


class _PowerMeter:
    """A counter at constant power on the benchmark's clock."""

    kind = "bench"
    estimated = False

    def __init__(self, clock: _Clock, power_w: float = 400.0):
        self._clock, self._power_w = clock, power_w

    async def read(self) -> EnergyReading:
        t = self._clock()
        return EnergyReading(t, (self._power_w * (t - T0 + 100.0),))

    async def close(self) -> None:
        return None


class _Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def apportioner_cost(n: int) -> dict[str, Any]:
    """The apportioner's step per request, as the service runs it on a SQLite ledger: read the
    interval's work, apportion, price, write shares and intervals, mark the work done. CPU
    time of the process (the ledger's worker thread included)."""
    return asyncio.run(_apportioner(n))


async def _apportioner(n: int) -> dict[str, Any]:
    clock = _Clock(T0 - 1.0)
    engines = [EngineInfo(f"e{i}", "m", "bf16", 1) for i in range(8)]
    records = make_records(n, engines=8, span_s=n / 1000.0, seed=3)
    end = max(r.wall(r.finished_s) for r in records) + 5.0
    gc.collect()
    gc.freeze()
    with tempfile.TemporaryDirectory() as tmp:
        ledger = SqliteLedger(Path(tmp) / "ledger.db")
        svc = AccountingService(AccountingConfig(), engines, ledger=ledger, clock=clock,
                                meters={e.name: _PowerMeter(clock) for e in engines})
        await ledger.open()
        cpu_s = 0.0
        try:
            for rec in records:
                svc.record(rec)
            svc.ingest()
            await svc.flush()
            await svc.poll_meters()
            assert await svc.take_apportioner()
            while clock.t < end:
                clock.t += 1.0
                await svc.poll_meters()
                c0 = time.process_time()
                await svc.apportion_ready(clock.t)
                cpu_s += time.process_time() - c0
        finally:
            await ledger.close()
            gc.unfreeze()
    return {"requests": n, "apportioner_us": cpu_s / n * 1e6}


def steady_cost(n: int, rate: float, hold_s: float) -> dict[str, Any]:
    """The service at steady state on SQLite: requests arrive at `rate` per second on 4 engines
    and are recorded as they finish (long streams finish many intervals after they began),
    with the gateway's steps every 0.5 s: ingest, write, apportion. The proxy's open requests
    are known to the service as in the gateway (`watch`); with `hold_s` 0 the apportioner does
    not wait for them and re-apportions every interval a late record reaches. CPU time of the
    process per request (the ledger's worker thread included)."""
    return asyncio.run(_steady(n, rate, hold_s))


async def _steady(n: int, rate: float, hold_s: float) -> dict[str, Any]:
    step_s = 0.5
    # The meters start 3 s before the first request: all the work is metered (work from before
    # an engine's first reading gets no share, and is looked at again each time it grows).
    clock = _Clock(T0 - 3.0)
    engines = [EngineInfo(f"e{i}", "m", "bf16", 1) for i in range(4)]
    records = sorted(make_records(n, engines=4, span_s=n / rate, seed=5),
                     key=lambda r: r.finished_s)
    by_arrival = sorted(records, key=lambda r: r.arrived_s)
    gc.collect()
    gc.freeze()
    apportioned = 0
    with tempfile.TemporaryDirectory() as tmp:
        ledger = SqliteLedger(Path(tmp) / "ledger.db")
        svc = AccountingService(AccountingConfig(hold_s=hold_s), engines, ledger=ledger,
                                clock=clock, meters={e.name: _PowerMeter(clock) for e in engines})
        opened: list[float | None] = [None]
        svc.watch(lambda: opened[0])
        await ledger.open()
        await svc.poll_meters()
        assert await svc.take_apportioner()
        ingest_s = write_s = apportion_s = 0.0
        rows = i = 0
        t = -3.0
        end = records[-1].finished_s + 5.0
        try:
            while t < end:
                t += step_s
                clock.t = T0 + t
                while i < n and records[i].finished_s <= t:
                    svc.record(records[i])
                    i += 1
                opened[0] = next((r.arrived_wall_s for r in by_arrival
                                  if r.arrived_s <= t < r.finished_s), None)
                await svc.poll_meters()
                c0 = time.process_time()
                svc.ingest()
                c1 = time.process_time()
                assert svc.recorder is not None
                rows += svc.recorder.unwritten_work
                await svc.flush()
                c2 = time.process_time()
                apportioned += await svc.apportion_ready(clock.t)  # revisions included
                c3 = time.process_time()
                ingest_s += c1 - c0
                write_s += c2 - c1
                apportion_s += c3 - c2
            intervals = (await ledger._fetch("SELECT COUNT(*) FROM intervals", ()))[0][0]
        finally:
            await ledger.close()
            gc.unfreeze()
    return {"requests": n, "rate": rate, "hold_s": hold_s, "rows_per_request": rows / n,
            "ingest_us": ingest_s / n * 1e6, "ledger_write_us": write_s / n * 1e6,
            "apportioner_us": apportion_s / n * 1e6,
            "total_us": (ingest_s + write_s + apportion_s) / n * 1e6,
            "apportioner_requests_per_s_per_core": n / apportion_s if apportion_s else 0.0,
            "engine_intervals": intervals,
            "apportionings_per_interval": apportioned / intervals if intervals else 0.0}
