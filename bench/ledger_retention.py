"""What a ledger that lives for years costs: bytes per million requests and a report's time,
with per-request rows only ("before": every row kept, reports read them all) and with the
hourly rollups and a retention ("after": reports read whole hours from the rollups, the
per-request rows older than the retention are pruned).

    python -m bench.ledger_retention                  # 1M requests in 30 days; writes
                                                      # bench/results/ledger_retention.*
    python -m bench.ledger_retention --requests 10000000  # the benchmark's 10M in a month;
                                                      # writes ledger_retention_10m.*
    python -m bench.ledger_retention --quick          # 50k requests in 1.5 days, prints only

Requests are synthesised and written through the ledger API as the accounting child writes
them: `append` (requests and their work rows, in flush-sized batches) and `commit` (each
engine's intervals and shares, at most 600 intervals a commit, the apportioner's step), on a
SQLite ledger in a temporary directory. By default the requests span a month, so the
rollups hold a month of hours and a month's report from them is measured; reads of the
per-request rows grow with the rows read (the run times them over parts of the month too),
so for 10M requests they are the measured ones scaled by 10M over the rows written, unless
`--requests 10000000` measures them. Bytes are SQLite's pages in use per table and index
(`dbstat`).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import platform
import random
import sqlite3
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from accounting.config import RETENTION_DAYS
from accounting.ledger.base import EngineState, EngineWork, IntervalRow, RequestRow, ShareRow
from accounting.ledger.sqlite import SqliteLedger
from accounting.report import GROUP_KEYS, build_report
from bench.provenance import commit

RESULTS = Path(__file__).resolve().parent / "results"
HOUR_S = 3600.0
MONTH_ROWS = 10_000_000  # a busy month of requests
MONTH_H = 30 * 24
PER_REQUEST = ("requests", "work", "shares", "intervals", "work_versions")
ROLLUPS = ("request_hours", "share_hours", "engine_hours")
APPEND_N = 2000  # requests per append (a flush)
COMMIT_N = 600  # intervals per commit (accounting/apportioner.py MAX_INTERVALS_PER_STEP)
T0_S = 1_767_225_600.0  # 2026-01-01T00:00Z
SCALE_ROWS = 5_000_000  # per-request reports of this many rows are read once
MAX_S = 3.0  # the longest request


class Synth:
    """Requests of `tenants` tenants on `engines` engines (half bf16, half fp8), 0.5-3 s each,
    one work row and one share per 1 s interval they span."""

    def __init__(self, ledger: SqliteLedger, rows: int, days: float, tenants: int,
                 engines: int, seed: int = 1):
        self.ledger, self.rows, self.span_s = ledger, rows, days * 86400.0
        self.tenants = [f"tenant-{i:03d}" for i in range(tenants)]
        self.engines = [f"engine-{i}" for i in range(engines)]
        self.rnd = random.Random(seed)
        self.versions: dict[tuple[str, int], int] = defaultdict(int)
        self.pending: dict[str, dict[int, list[ShareRow]]] = {e: {} for e in self.engines}
        self.boundary_j = dict.fromkeys(self.engines, 0.0)
        self.written = 0

    def precision(self, engine: str) -> str:
        return "bf16" if self.engines.index(engine) % 2 == 0 else "fp8"

    def request(self, i: int, arrived_s: float) -> tuple[RequestRow, list[EngineWork]]:
        rnd = self.rnd
        engine = self.engines[i % len(self.engines)]
        finished = arrived_s + rnd.uniform(0.5, MAX_S)
        first, last = math.floor(arrived_s), math.floor(finished)
        failed = rnd.random() < 0.01
        row = RequestRow(
            request_id=f"req-{i:09d}", tenant=rnd.choice(self.tenants), model="llama-8b",
            engine=engine, precision=self.precision(engine),
            slo_class="interactive" if i % 3 else "batch",
            status="upstream_timeout" if failed else "ok", stream=1, arrived_s=arrived_s,
            finished_s=finished, finished_hour=math.floor(finished / HOUR_S),
            prompt_tokens=rnd.randint(50, 2000), completion_tokens=rnd.randint(10, 400),
            slo_met=0 if failed else 1, first_interval=first, last_interval=last,
            replica="bench", prompt_source="engine", http_status=504 if failed else 200,
            outcome="failed" if failed else "served", delivered_s=None)
        work = [EngineWork(request_id=row.request_id, interval_idx=k, prefill_tokens=10.0,
                           decode_tokens=20.0, residency_s=0.5, start_s=float(k),
                           kv_tokens=100.0, head_s=0.0, head_decode=0.0,
                           engine=engine)
                for k in range(first, last + 1)]
        return row, work

    async def run(self) -> None:
        # arrivals end MAX_S before the span does: every request finishes inside it, in the
        # reports' window (at 10M requests the last ones would otherwise finish past it)
        step_s = (self.span_s - MAX_S) / self.rows
        hour = math.floor(T0_S / HOUR_S)
        i = 0
        while i < self.rows:
            end_s = (hour + 1) * HOUR_S
            batch: list[RequestRow] = []
            work: list[EngineWork] = []
            while i < self.rows and T0_S + i * step_s < end_s:
                row, rows = self.request(i, T0_S + i * step_s)
                batch.append(row)
                work += rows
                i += 1
                if len(batch) == APPEND_N:
                    await self.append(batch, work)
                    batch, work = [], []
            await self.append(batch, work)
            await self.commit(math.floor(end_s) if i < self.rows else None)
            hour += 1

    async def append(self, batch: list[RequestRow], work: list[EngineWork]) -> None:
        if not batch:
            return
        await self.ledger.append(batch, work)
        self.written += len(batch)
        for key in {(w.engine, w.interval_idx) for w in work}:
            self.versions[key] += 1
        for w in work:
            energy = 5.0 + (w.interval_idx % 7)
            share = ShareRow(request_id=w.request_id, engine=w.engine,
                             interval_idx=w.interval_idx, start_s=float(w.interval_idx),
                             hour_idx=math.floor(w.interval_idx / HOUR_S), energy_j=energy,
                             static_j=0.3 * energy, dynamic_j=0.7 * energy, gpu_s=0.5,
                             carbon_g=energy * 1e-4, cost_usd=energy * 2e-8, estimated=0)
            self.pending[w.engine].setdefault(w.interval_idx, []).append(share)

    async def commit(self, below: int | None) -> None:
        """Apportion every pending interval below `below` (None: all)."""
        for engine, pending in self.pending.items():
            ready = sorted(k for k in pending if below is None or k < below)
            for c in range(0, len(ready), COMMIT_N):
                idxs = ready[c:c + COMMIT_N]
                intervals, shares = [], []
                for k in idxs:
                    got = pending.pop(k)
                    shares += got
                    idle = 1.0
                    total = math.fsum(s.energy_j for s in got) + idle
                    self.boundary_j[engine] += total
                    intervals.append(IntervalRow(
                        engine=engine, interval_idx=k, start_s=float(k), interval_s=1.0,
                        model="llama-8b", precision=self.precision(engine), gpus=1,
                        energy_j=total, static_j=0.3 * total, dynamic_j=0.7 * total,
                        idle_j=idle, idle_s=0.1, idle_carbon_g=idle * 1e-4,
                        idle_cost_usd=idle * 2e-8, estimated=False, alpha=0.03, beta=1.0,
                        gamma=0.0))
                state = EngineState(engine=engine, next_interval=idxs[-1] + 1,
                                    boundary_s=float(idxs[-1] + 1),
                                    boundary_j=self.boundary_j[engine])
                done = [(k, self.versions.pop((engine, k))) for k in idxs]
                await self.ledger.commit(engine, intervals, shares, done, state)


def table_bytes(path: Path) -> dict[str, int]:
    """Bytes of the pages in use by each table and its indexes."""
    conn = sqlite3.connect(path)
    try:
        owners = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master"))
        out: dict[str, int] = defaultdict(int)
        for name, used in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            out[owners.get(name, name)] += int(used)
        return dict(out)
    finally:
        conn.close()


def progress(what: str) -> None:
    """A line on stderr per phase: a 10M run takes an hour."""
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


async def report_s(ledger: SqliteLedger, since: float, until: float, per_request: bool,
                   group_by: tuple[str, ...], rows: int = 0) -> tuple[float, dict[str, Any]]:
    """Best wall time of usage + build_report (of 3 reading per-request rows, once past
    SCALE_ROWS as each read takes minutes; 9 reading the rollups: this machine is shared),
    and the report's total."""
    best, total = math.inf, {}
    repeats = 9 if not per_request else 1 if rows >= SCALE_ROWS else 3
    for _ in range(repeats):
        t = time.perf_counter()
        data = await ledger.usage(since, until, None, per_request=per_request,
                                  group_by=group_by)
        total = build_report(data, group_by, since, until).total
        best = min(best, time.perf_counter() - t)
    return best, total


async def measure(tmp: Path, rows: int, days: float, tenants: int, engines: int,
                  retention_days: float) -> dict[str, Any]:
    path = tmp / "ledger.db"
    ledger = SqliteLedger(path)
    await ledger.open()
    synth = Synth(ledger, rows, days, tenants, engines)
    t = time.perf_counter()
    await synth.run()
    write_s = time.perf_counter() - t
    progress(f"written {rows:,} requests in {write_s:.0f} s")
    await ledger.close()
    size = table_bytes(path)
    per_request_b = sum(size.get(n, 0) for n in PER_REQUEST)
    rollup_b = sum(size.get(n, 0) for n in ROLLUPS)
    progress(f"per-request rows {per_request_b / 1e6:.0f} MB, rollups {rollup_b / 1e6:.1f} MB")
    ledger = SqliteLedger(path)
    await ledger.open()
    first_h = math.floor(T0_S / HOUR_S)
    hours = math.ceil(days * 24)
    since, until = first_h * HOUR_S, (first_h + hours) * HOUR_S
    reports: dict[str, Any] = {}
    for name, group_by in (("by tenant", ("tenant",)), ("by every key", GROUP_KEYS)):
        rows_s, rows_total = await report_s(ledger, since, until, True, group_by, rows)
        roll_s, roll_total = await report_s(ledger, since, until, False, group_by)
        progress(f"report {name}: per-request rows {rows_s:.2f} s, rollups {roll_s:.3f} s")
        counted = (roll_total["requests"], rows_total["requests"], rows)
        assert counted[0] == counted[1] == rows, f"rollups, rows, written: {counted}"
        rel = abs(roll_total["energy_j"] - rows_total["energy_j"]) / rows_total["energy_j"]
        assert rel < 1e-9, rel
        reports[name] = {"per_request_s": rows_s, "rollups_s": roll_s,
                         "energy_rel_diff": rel}
    scaling: dict[str, dict[str, float]] = {"per_request_s": {}, "rollups_s": {}}
    # per-request reads grow with the rows read (measured at scale: the parts are skipped)
    for part in (0.25, 0.5) if rows < SCALE_ROWS else ():
        cut = since + round(hours * part) * HOUR_S
        for key, per_request in (("per_request_s", True), ("rollups_s", False)):
            scaling[key][str(part)] = (await report_s(ledger, since, cut, per_request,
                                                      ("tenant",), rows))[0]
    progress(f"reports over parts: {scaling}")
    t = time.perf_counter()
    before = until - retention_days * 86400.0
    batches = 1
    while await ledger.prune(before, 1.0):
        batches += 1
    prune_s = time.perf_counter() - t
    progress(f"pruned in {prune_s:.0f} s")
    kept = int((await ledger._fetch("SELECT COUNT(*) FROM requests", ()))[0][0])
    after_s, after_total = await report_s(ledger, since, until, False, ("tenant",))
    assert after_total["requests"] == rows
    await ledger.close()
    pruned_size = table_bytes(path)
    return {
        "rows": rows, "days": days, "tenants": tenants, "engines": engines,
        "hours": hours,
        "write_s": write_s, "bytes": size, "per_request_bytes": per_request_b,
        "rollup_bytes": rollup_b,
        "per_request_bytes_per_million": per_request_b / rows * 1e6,
        "rollup_bytes_per_hour": rollup_b / hours,
        "reports": reports, "report_s_by_part": scaling,
        "retention_days": retention_days, "prune_s": prune_s, "prune_batches": batches,
        "pruned_requests": rows - kept, "prune_requests_per_s": (rows - kept) / prune_s,
        "after_prune_bytes": pruned_size,
        "after_prune_per_request_bytes": sum(pruned_size.get(n, 0) for n in PER_REQUEST),
        "report_after_prune_s": after_s,
    }


def month(m: dict[str, Any]) -> dict[str, Any]:
    """The month of 10M requests, from the measured run: per-request bytes and reads scale
    with rows, rollup bytes and reads with hours (the default run's are a month's)."""
    rows_x, hours_x = MONTH_ROWS / m["rows"], MONTH_H / m["hours"]
    by = m["reports"]["by tenant"]
    year_rows = 12 * MONTH_ROWS
    keep_rows = RETENTION_DAYS / 30.0 * MONTH_ROWS
    per_m = m["per_request_bytes_per_million"]
    return {
        "measured_at_scale": m["rows"] >= MONTH_ROWS and m["hours"] >= MONTH_H,
        "report_per_request_s": by["per_request_s"] * rows_x,
        "report_rollups_s": by["rollups_s"] * hours_x,
        "bytes_before_per_year": per_m * year_rows / 1e6,
        "bytes_after_steady": per_m * keep_rows / 1e6 + m["rollup_bytes_per_hour"] * 24 * 365,
        "rollup_bytes_per_year": m["rollup_bytes_per_hour"] * 24 * 365,
    }


def parts_text(m: dict[str, Any]) -> str:
    """Report times over the first parts of the run (none when measured at scale)."""
    parts, by = m["report_s_by_part"], m["reports"]["by tenant"]
    if not parts["per_request_s"]:
        return ""
    return ("Reports by tenant over the first part of the run, per-request rows: "
            + ", ".join(f"{float(p) * 100:.0f} % {s:.2f} s"
                        for p, s in parts["per_request_s"].items())
            + f", 100 % {by['per_request_s']:.2f} s (they grow with the rows read); rollups: "
            + ", ".join(f"{float(p) * 100:.0f} % {s * 1e3:.1f} ms"
                        for p, s in parts["rollups_s"].items())
            + f", 100 % {by['rollups_s'] * 1e3:.1f} ms. ")


def markdown(m: dict[str, Any], mo: dict[str, Any], meta: dict[str, Any]) -> str:
    mb = 1e6
    by, every = m["reports"]["by tenant"], m["reports"]["by every key"]
    scale = "measured" if mo["measured_at_scale"] else "extrapolated from the run above"
    lines = [
        "# Ledger retention and hourly rollups",
        "",
        f"`python -m bench.ledger_retention {meta['args']}` on commit {meta['commit']}, "
        f"{meta['machine']}, SQLite {sqlite3.sqlite_version}.",
        "",
        f"{m['rows']:,} requests over {m['days']:g} days ({m['hours']} hours; "
        f"{m['tenants']} tenants, {m['engines']} engines, 0.5-3 s each, a work row and a share "
        f"per 1 s interval), written through `append` and `commit` in {m['write_s']:.0f} s.",
        "",
        "| | before: per-request rows only | after: rollups + retention |",
        "| --- | --- | --- |",
        f"| bytes per million requests (per-request rows) | "
        f"{m['per_request_bytes_per_million'] / mb:.0f} MB | the same, for the retention "
        f"({m['retention_days']:g} days) only |",
        f"| rollup bytes | - | {m['rollup_bytes'] / mb:.2f} MB "
        f"({m['rollup_bytes_per_hour'] / 1e3:.1f} kB per hour) |",
        f"| report of the run's {m['hours']} h, by tenant | {by['per_request_s']:.2f} s | "
        f"{by['rollups_s'] * 1e3:.1f} ms |",
        f"| report of the run's {m['hours']} h, by every key | {every['per_request_s']:.2f} s | "
        f"{every['rollups_s'] * 1e3:.1f} ms |",
        "",
        parts_text(m) + "Rollup and per-request totals agree to "
        f"{max(by['energy_rel_diff'], every['energy_rel_diff']):.1e} relative; each per-request "
        f"report was read {'once' if m['rows'] >= SCALE_ROWS else 'best of 3'}, each rollup "
        "report best of 9.",
        "",
        f"Pruning to {m['retention_days']:g} days: {m['pruned_requests']:,} requests and their "
        f"rows in {m['prune_batches']} batches, {m['prune_s']:.1f} s "
        f"({m['prune_requests_per_s']:,.0f} requests/s); per-request pages in use "
        f"{m['per_request_bytes'] / mb:.0f} MB -> "
        f"{m['after_prune_per_request_bytes'] / mb:.0f} MB (SQLite reuses the freed pages; "
        f"the file shrinks only on VACUUM). The whole run's report after pruning, from the "
        f"rollups: {m['report_after_prune_s'] * 1e3:.1f} ms, every request counted.",
        "",
        f"## 10M requests a month ({scale}; rows kept for {RETENTION_DAYS:g} days, the "
        "default retention)",
        "",
        "| | before | after |",
        "| --- | --- | --- |",
        f"| a month's report, by tenant | {mo['report_per_request_s']:.0f} s | "
        f"{mo['report_rollups_s'] * 1e3:.0f} ms |",
        f"| ledger after a year at 10M requests a month | "
        f"{mo['bytes_before_per_year'] / 1e9:.0f} GB | "
        f"{mo['bytes_after_steady'] / 1e9:.1f} GB ({RETENTION_DAYS:g} days of rows, "
        f"{mo['rollup_bytes_per_year'] / mb:.0f} MB of rollups) |",
        "",
        "The year is twelve of these months: per-request bytes for the retention, rollup "
        "bytes for every hour (a row per hour per tenant, engine, model, precision and SLO "
        "class, whatever the request rate)." if scale == "measured" else
        "Scaling: per-request bytes and reads by the month's rows over the run's, rollup "
        "bytes and reads by the month's hours over the run's (the rollups hold a row per hour "
        "per tenant, engine, model, precision and SLO class, whatever the request rate).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", "--rows", dest="requests", type=int, default=1_000_000,
                    help="requests (default 1M)")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where the temporary ledger goes (default: the system's temp dir)")
    ap.add_argument("--days", type=float, default=30.0, help="days they span (default 30)")
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--retention-days", type=float, default=None,
                    help="pruned to this (default: a third of the span)")
    ap.add_argument("--quick", action="store_true", help="50k requests, print only")
    args = ap.parse_args()
    ran_on = commit()
    rows = 50_000 if args.quick else args.requests
    days = 1.5 if args.quick else args.days
    retention = args.retention_days if args.retention_days is not None else days / 3
    with tempfile.TemporaryDirectory(prefix="wattgate-ledger-bench-", dir=args.dir) as tmp:
        m = asyncio.run(measure(Path(tmp), rows, days, args.tenants, args.engines, retention))
    mo = month(m)
    shown = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                     if v is not None and k not in ("quick", "dir") and v != ap.get_default(k))
    meta = {"commit": ran_on, "machine": f"{platform.machine()}, {platform.processor() or ''}"
            .rstrip(", "), "args": shown or "", "python": platform.python_version()}
    md = markdown(m, mo, meta)
    print(md)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        # the default run keeps its files; the 10M run has its own beside them
        stem = "ledger_retention" if rows == ap.get_default("rows") else \
            f"ledger_retention_{rows / 1e6:g}m"
        (RESULTS / f"{stem}.json").write_bytes(orjson.dumps(
            {"meta": meta, "run": m, "month": mo}, option=orjson.OPT_INDENT_2))
        (RESULTS / f"{stem}.md").write_text(md)


if __name__ == "__main__":
    main()
