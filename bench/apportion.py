"""Apportioning throughput (requests/s per core) and the hot-path cost of `record()`.

    python -m bench.apportion            # ~20k requests, writes bench/results/apportion.{json,md}
    python -m bench.apportion --quick    # smaller, prints only

Throughput covers the pure pipeline the apportioner runs for each request: spreading the
record over the interval grid (work rows), grouping rows per (engine, interval), and
apportioning every interval as the service does (`apportion_by`, default BF16 coefficients:
instant sharing of static power and decode steps). The ledger round trip is not included
there. Both CPU time of this process (per core; the machine may be shared) and wall time are
reported. `record()` is timed on a service whose ledger does nothing.

The ledger is measured apart, on SQLite, as the gateway process pays for it: ingest plus the
batched write of requests and work rows (every replica), and the apportioner's step per
request (the one replica that apportions: read, apportion, price, write shares, mark done).
Then the whole service at steady state, records arriving as requests finish, with the
apportioner waiting for requests in flight (the default) and without (`hold_s: 0`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import platform
import random
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from engines.meters.base import EnergyReading
from gateway.accounting.apportion import apportion_by
from gateway.accounting.coefficients import default_for
from gateway.accounting.config import AccountingConfig
from gateway.accounting.ledger.sqlite import SqliteLedger
from gateway.accounting.service import AccountingService, EngineInfo
from gateway.accounting.work import Work, work_rows
from gateway.records import RequestRecord
from gateway.timing import Latency

RESULTS = Path(__file__).resolve().parent / "results"
T0 = 1_700_000_000.0
NO_LATENCY = Latency(None, None, None, (), ())


def make_records(n: int, engines: int, span_s: float, seed: int) -> list[RequestRecord]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        start = rnd.uniform(0, span_s)
        ttft = rnd.uniform(0.02, 0.5)
        out_tokens = rnd.choice([rnd.randint(4, 64), rnd.randint(100, 600)])
        tpot = rnd.uniform(0.01, 0.05)
        first = start + ttft
        events = max(1, out_tokens // 2)  # engines coalesce ~2 tokens per event
        gap = tpot * out_tokens / events
        times = tuple(first + j * gap for j in range(events))
        out.append(RequestRecord(
            request_id=f"r{i}", tenant=f"t{i % 8}", model="m", engine=f"e{i % engines}",
            precision="bf16", slo_class="d", status="ok", http_status=200, stream=True,
            arrived_wall_s=T0 + start, arrived_s=start, dispatched_s=start,
            first_byte_s=first, first_token_s=first, finished_s=times[-1],
            read_times=times, read_events=(1,) * events,
            prompt_tokens=rnd.choice([rnd.randint(16, 256), rnd.randint(1000, 4000)]),
            completion_tokens=out_tokens, attempts=1, latency=NO_LATENCY, slo_met=True))
    return out


def spread_records(records: list[RequestRecord], interval_s: float
                   ) -> dict[str, defaultdict[int, list[Work]]]:
    """Every replica's part: each record spread over the interval grid (work rows), grouped
    per engine, then per interval (no key tuple and no spare list per row)."""
    by_engine: dict[str, defaultdict[int, list[Work]]] = {}
    for rec in records:
        work = work_rows(rec, interval_s)
        if work:
            per = by_engine.get(rec.engine)
            if per is None:
                per = by_engine[rec.engine] = defaultdict(list)
            for row in work:
                per[row[1]].append(row)
    return by_engine


def apportion_all(by_engine: dict[str, defaultdict[int, list[Work]]], interval_s: float
                  ) -> tuple[int, int]:
    """The apportioner's part: every engine-interval's energy split over its work rows."""
    coefficients = default_for("bf16")
    rows = intervals = 0
    for per in by_engine.values():
        for group in per.values():
            apportion_by(400.0, interval_s, 90.0, group, coefficients)
            rows += len(group)
        intervals += len(per)
    return rows, intervals


def pipeline(records: list[RequestRecord], interval_s: float) -> tuple[int, int]:
    return apportion_all(spread_records(records, interval_s), interval_s)


def throughput(n: int, repeats: int) -> dict[str, Any]:
    records = make_records(n, engines=8, span_s=n / 200.0, seed=1)
    # The input (n records, ~90 reads each) is the benchmark's, not the service's, which holds
    # one flush window of records: keep it out of the collector's full scans.
    gc.collect()
    gc.freeze()
    cpu, wall, spread_cpu, apportion_cpu = [], [], [], []
    rows = intervals = 0
    for _ in range(repeats):
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        by_engine = spread_records(records, 1.0)
        c1 = time.process_time()
        rows, intervals = apportion_all(by_engine, 1.0)
        c2 = time.process_time()
        cpu.append(c2 - c0)
        wall.append(time.perf_counter() - w0)
        spread_cpu.append(c1 - c0)
        apportion_cpu.append(c2 - c1)
        del by_engine
    gc.unfreeze()
    best_cpu, best_wall = min(cpu), min(wall)
    return {
        "requests": n, "work_rows": rows, "rows_per_request": rows / n,
        "engine_intervals": intervals,
        "requests_per_s_per_core": n / best_cpu, "requests_per_s_wall": n / best_wall,
        "median_requests_per_s_per_core": n / statistics.median(cpu),
        "spread_requests_per_s_per_core": n / min(spread_cpu),
        "apportion_requests_per_s_per_core": n / min(apportion_cpu),
        "median_apportion_requests_per_s_per_core": n / statistics.median(apportion_cpu),
        "target_requests_per_s": 50_000,
    }


def record_cost(n: int) -> dict[str, Any]:
    class NullLedger:
        kind = "null"

    svc = AccountingService(AccountingConfig(), [EngineInfo("e0", "m", "bf16", 1)],
                            ledger=NullLedger())  # type: ignore[arg-type]
    records = make_records(2000, engines=1, span_s=10.0, seed=2)
    record = svc.record
    samples = []
    for _ in range(5):
        gc.collect()
        t0 = time.perf_counter_ns()
        for i in range(n):
            record(records[i % 2000])
        samples.append((time.perf_counter_ns() - t0) / n / 1000.0)
        svc._pending.clear()
    return {"record_us": min(samples), "record_us_median": statistics.median(samples),
            "target_record_us": 20.0}


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
            assert await svc._take_apportioner()
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
    orig_one = AccountingService._one

    async def counting_one(self: AccountingService, *args: Any) -> None:
        nonlocal apportioned
        apportioned += 1
        await orig_one(self, *args)

    with tempfile.TemporaryDirectory() as tmp:
        ledger = SqliteLedger(Path(tmp) / "ledger.db")
        svc = AccountingService(AccountingConfig(hold_s=hold_s), engines, ledger=ledger,
                                clock=clock, meters={e.name: _PowerMeter(clock) for e in engines})
        svc._one = counting_one.__get__(svc)  # type: ignore[method-assign]
        opened: list[float | None] = [None]
        svc.watch(lambda: opened[0])
        await ledger.open()
        await svc.poll_meters()
        assert await svc._take_apportioner()
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
                rows += len(svc._work)
                await svc.flush()
                c2 = time.process_time()
                await svc.apportion_ready(clock.t)
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


def cpu_reference_us() -> float:
    """Best time of sum(range(1000)) in us: a yardstick for comparing machines (a current
    desktop core does it in ~8-10 us)."""
    best = math.inf
    for _ in range(200):
        t0 = time.perf_counter_ns()
        sum(range(1000))
        best = min(best, (time.perf_counter_ns() - t0) / 1000.0)
    return best


def markdown(result: dict[str, Any]) -> str:
    t, r, w = result["throughput"], result["record"], result["ingest_write"]
    a = result["apportioner"]
    return "\n".join([
        "# Apportioning benchmark",
        "",
        f"Machine: {result['machine']}; Python {result['python']}; CPU yardstick "
        f"sum(range(1000)) = {result['cpu_reference_us']:.1f} us (a current desktop core: "
        "~8-10 us). One process, one core; CPU time of the process (the machine is shared).",
        "",
        "| measure | value | target |",
        "| --- | ---: | ---: |",
        f"| apportioning throughput, requests/s per core (best) | "
        f"{t['requests_per_s_per_core']:,.0f} | >= {t['target_requests_per_s']:,} |",
        f"| apportioning throughput, requests/s per core (median) | "
        f"{t['median_requests_per_s_per_core']:,.0f} | |",
        f"| apportioning throughput, requests/s wall | {t['requests_per_s_wall']:,.0f} | |",
        f"| of which spreading records over the grid (every replica, at ingest), requests/s "
        f"per core (best) | {t['spread_requests_per_s_per_core']:,.0f} | |",
        f"| of which apportioning the work rows (the apportioner), requests/s per core (best) "
        f"| {t['apportion_requests_per_s_per_core']:,.0f} | |",
        f"| of which apportioning the work rows, requests/s per core (median) "
        f"| {t['median_apportion_requests_per_s_per_core']:,.0f} | |",
        f"| work rows per request (1 s grid) | {t['rows_per_request']:.2f} | |",
        f"| hot path `record()`, us per request (best) | {r['record_us']:.3f} | <= "
        f"{r['target_record_us']:.0f} |",
        f"| hot path `record()`, us per request (median) | {r['record_us_median']:.3f} | |",
        f"| off-path ingest (record -> ledger rows), us per request | {w['ingest_us']:.1f} | |",
        f"| off-path SQLite ledger write, us per request | {w['ledger_write_us']:.1f} | |",
        f"| off-path ingest + ledger write, us per request | {w['ingest_write_us']:.1f} | "
        f"<= {w['target_ingest_write_us']:.0f} |",
        f"| apportioner step on SQLite (read work, apportion, price, write shares), us per "
        f"request | {a['apportioner_us']:.1f} | |",
        "",
        "At steady state: records arrive as requests finish, the service steps every 0.5 s "
        "(ingest, SQLite write, apportion), us of CPU per request:",
        "",
        "| apportioner | ingest | ledger write | apportioner step | total | apportioner, "
        "requests/s per core | times each interval was apportioned |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(f"| {label} | {x['ingest_us']:.1f} | {x['ledger_write_us']:.1f} | "
          f"{x['apportioner_us']:.1f} | {x['total_us']:.1f} | "
          f"{x['apportioner_requests_per_s_per_core']:,.0f} | "
          f"{x['apportionings_per_interval']:.2f} |"
          for label, x in (("waits for requests in flight (hold_s 60, the default)",
                            result["steady"]), ("does not wait (hold_s 0)",
                                                result["steady_no_hold"]))),
        "",
        f"Workload: {t['requests']:,} streamed requests on 8 engines, prompts 16-4000 tokens, "
        "outputs 4-600 tokens, ~2 tokens per SSE event, 1 s intervals. Ingest and ledger write: "
        f"{w['requests']:,} such requests into a fresh SQLite ledger, {w['batch']} per flush; "
        "CPU time of the process (the ledger's worker thread included). Apportioner step: "
        f"{a['requests']:,} such requests already in the ledger, apportioned interval by "
        "interval as the service does. Steady state: "
        f"{result['steady']['requests']:,} such requests arriving at "
        f"{result['steady']['rate']:,.0f}/s on 4 engines "
        f"({result['steady']['rows_per_request']:.2f} work rows each); the gateway's open "
        "requests are known to the service as the proxy reports them.",
        "",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 2000 if args.quick else 20_000
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_reference_us": cpu_reference_us(),
        "python": platform.python_version(),
        "throughput": throughput(n, 2 if args.quick else 5),
        "record": record_cost(20_000 if args.quick else 200_000),
        "ingest_write": ingest_write_cost(2000 if args.quick else 8000, 500),
        "apportioner": apportioner_cost(1000 if args.quick else 4000),
        "steady": steady_cost(1000 if args.quick else 4000, 500.0, 60.0),
        "steady_no_hold": steady_cost(1000 if args.quick else 4000, 500.0, 0.0),
    }
    md = markdown(result)
    print(md)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "apportion.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        (RESULTS / "apportion.md").write_text(md)


if __name__ == "__main__":
    main()
