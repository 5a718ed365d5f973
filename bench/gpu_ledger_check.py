"""Part 2 of `bench.gpu_energy`: the gateway charging GPU 0's measured energy, checked from its
SQLite ledger (conservation per interval, intervals against the independent sampler, bills)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import math
import random
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench.gpu_meter_check import quantile
from bench.gpu_sampling import Load, Sampler, Samples, rel, say

REPO = Path(__file__).resolve().parents[1]
MODEL = "llama-3.1-8b"
ENGINE = "gpu0"
KEYS = {"tenant-a": "sk-bench-a", "tenant-b": "sk-bench-b"}
ADMIN_KEY = "sk-bench-admin"
# The gateway reads the meter every 0.25 s (the default) and places an interval's ends by
# interpolating linearly between the readings around them.
POLL_S = 0.25


def gateway_config(engine_url: str, ledger: Path, port: int) -> dict[str, Any]:
    def digest(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "slo_classes": {"interactive": {"ttft_s": 1.0, "tpot_s": 0.1}},
        "tenants": [{"name": name, "api_key_sha256": digest(key)} for name, key in KEYS.items()],
        "admin": {"api_key_sha256": digest(ADMIN_KEY)},
        "models": [{"name": MODEL, "endpoints": [
            {"name": ENGINE, "url": engine_url, "kind": "vllm", "precision": "bf16"}]}],
        "health": {"interval_s": 0.5, "timeout_s": 1},
        "accounting": {"interval_s": 1, "flush_s": 0.5, "settle_s": 2, "poll_s": POLL_S,
                       "ledger": {"kind": "sqlite", "path": str(ledger)},
                       "region": "US", "pue": 1.2, "price_usd_per_kwh": 0.08, "gpu_hour_usd": 3.0,
                       "meters": {ENGINE: {"kind": "nvml", "gpus": [0]}}},
    }


async def traffic(base: str, seconds: float, concurrency: int, max_requests: int,
                  seed: int) -> dict[str, Any]:
    """Two tenants stream completions for `seconds` (and at most `max_requests`)."""
    import aiohttp

    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    counts: dict[str, int] = {"ok": 0, "failed": 0}
    sent = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while time.monotonic() < deadline and sent < max_requests:
            sent += 1
            tenant = rng.choice(list(KEYS))
            body = {"model": MODEL, "stream": True, "max_tokens": rng.randint(16, 256),
                    "prompt": " ".join(["token"] * rng.randint(16, 1024))}
            headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
            try:
                async with session.post(f"{base}/v1/completions", json=body, headers=headers) as r:
                    await r.read()
                    counts["ok" if r.status == 200 else "failed"] += 1
            except aiohttp.ClientError:
                counts["failed"] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return {**counts, "sent": sent}


def wait_apportioned(ledger: Path, until_s: float, timeout_s: float) -> bool:
    """True once the ledger has apportioned the engine's intervals up to wall time `until_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.Error), contextlib.closing(
                sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT MAX(start_s + interval_s) FROM intervals WHERE engine = ?",
                             (ENGINE,)).fetchone()
            if row and row[0] is not None and row[0] >= until_s:
                return True
        time.sleep(0.5)
    return False


def interpolation_bound_j(samples: Samples, t: float, gap_s: float = POLL_S) -> float:
    """How far a value interpolated at `t` between readings `gap_s` apart can miss the counter
    when the power steps at `t`: |P_after - P_before| x gap / 4 (the worst phase of the
    readings). Power is read off the independent samples; 0 where they do not reach."""
    try:
        before = (samples.energy_at(t) - samples.energy_at(t - gap_s)) / gap_s
        after = (samples.energy_at(t + gap_s) - samples.energy_at(t)) / gap_s
    except ValueError:
        return 0.0
    return abs(after - before) * gap_s / 4


def ledger_check(ledger: Path, samples: Samples) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(ledger)) as db:
        intervals = db.execute(
            """SELECT i.interval_idx, i.start_s, i.interval_s, i.energy_j, i.idle_j,
                      COALESCE(SUM(s.energy_j), 0), COUNT(s.request_id)
               FROM intervals i LEFT JOIN shares s
                 ON s.engine = i.engine AND s.interval_idx = i.interval_idx
               WHERE i.engine = ? GROUP BY i.interval_idx ORDER BY i.interval_idx""",
            (ENGINE,)).fetchall()
        tenants = db.execute(
            """SELECT r.tenant, COUNT(DISTINCT r.request_id), SUM(s.energy_j), SUM(s.carbon_g),
                      SUM(s.cost_usd)
               FROM shares s JOIN requests r ON r.request_id = s.request_id
               WHERE s.engine = ? GROUP BY r.tenant ORDER BY r.tenant""", (ENGINE,)).fetchall()
        requests = db.execute("SELECT COUNT(*) FROM requests WHERE engine = ?", (ENGINE,)).fetchone()[0]
        unshared = db.execute(
            """SELECT COUNT(*) FROM requests r WHERE r.engine = ? AND NOT EXISTS
                 (SELECT 1 FROM shares s WHERE s.request_id = r.request_id)""", (ENGINE,)).fetchone()[0]
    rows, conservation, vs_sampler = [], [], []
    for i, (idx, start, length, energy, idle, shared, n) in enumerate(intervals):
        try:
            # The engine's first interval is measured from the gateway's first reading on,
            # a moment this process does not know: it is left out of the comparison.
            sampled = None if i == 0 else samples.energy_at(start + length) - samples.energy_at(start)
        except ValueError:
            sampled = None
        cons = abs(shared + idle - energy) / energy if energy else abs(shared + idle)
        conservation.append(cons)
        if sampled:
            vs_sampler.append(rel(energy, sampled))
        rows.append({"interval": idx, "start_s": start, "end_s": start + length,
                     "energy_j": energy, "idle_j": idle, "shares_j": shared,
                     "requests": n, "sampled_j": sampled})
    total = math.fsum(r["energy_j"] for r in rows)
    sampled_rows = [r for r in rows if r["sampled_j"] is not None]
    span_total = math.fsum(r["energy_j"] for r in sampled_rows)
    span_sampled = math.fsum(r["sampled_j"] for r in sampled_rows)
    # Both ends of the span are interpolated by the gateway; where the power steps there (a
    # load switched on at an interval boundary), each end can miss by the bound below.
    span_bound = (interpolation_bound_j(samples, sampled_rows[0]["start_s"])
                  + interpolation_bound_j(samples, sampled_rows[-1]["end_s"])
                  if sampled_rows else 0.0)
    bills = [{"tenant": t, "requests": n, "energy_j": e, "carbon_g": c, "cost_usd": u}
             for t, n, e, c, u in tenants]
    idle_total = math.fsum(r["idle_j"] for r in rows)
    abs_vs = [abs(x) for x in vs_sampler]
    return {
        "intervals": len(rows), "requests": requests, "requests_without_shares": unshared,
        "energy_j": total, "idle_j": idle_total,
        "bills": bills,
        "bills_plus_idle_vs_energy_rel": rel(math.fsum(b["energy_j"] for b in bills) + idle_total, total),
        "conservation_max_rel": max(conservation) if conservation else None,
        "interval_vs_sampler_rel": ({"median_abs": statistics.median(abs_vs),
                                     "p95_abs": quantile(abs_vs, 0.95), "max_abs": max(abs_vs),
                                     "n": len(abs_vs)} if abs_vs else None),
        "span_energy_vs_sampler_rel": rel(span_total, span_sampled) if span_sampled else None,
        "span_energy_j": span_total, "span_sampled_j": span_sampled,
        "span_interpolation_bound_j": span_bound,
        "rows": rows,
    }


def part_gateway(load: Load, sampler: Sampler, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from loadgen.procs import free_port, started, wait_http

    sim_port, gw_port = free_port(), free_port()
    ledger = tmp / "ledger.db"
    cfg_path = tmp / "gateway.yaml"
    cfg_path.write_text(yaml.safe_dump(gateway_config(f"http://127.0.0.1:{sim_port}", ledger, gw_port)))
    base = f"http://127.0.0.1:{gw_port}"
    windows: list[tuple[float, float]] = []
    with open(tmp / "engine.log", "w") as elog, open(tmp / "gateway.log", "w") as glog, \
            started(["sim", "--gpu", "h200", "--model", MODEL, "--precision", "bf16",
                     "--port", str(sim_port)], elog) as engine:
        wait_http(f"http://127.0.0.1:{sim_port}/health", engine, 60)
        with started(["serve", "--config", str(cfg_path)], glog) as gw:
            try:
                wait_http(f"{base}/readyz", gw, 60)
            except (RuntimeError, TimeoutError) as exc:
                glog.flush()
                return {"error": f"{exc}: {(tmp / 'gateway.log').read_text()[-3000:]}"}
            say(f"gateway up (nvml meter on GPU 0); {args.traffic_s:.0f} s of traffic, "
                f"GPU load {args.on_s:.0f} s on / {args.off_s:.0f} s off")
            stop = threading.Event()
            loader = threading.Thread(target=load.pattern, args=(args.on_s, args.off_s, stop, windows),
                                      daemon=True)
            t_start = time.time()
            loader.start()
            counts = asyncio.run(traffic(base, args.traffic_s, 8, 5000, seed=1))
            t_end = time.time()
            stop.set()
            loader.join()
            say(f"traffic done: {counts}; waiting for the ledger to apportion it")
            done = wait_apportioned(ledger, t_end + 1.0, timeout_s=30)
        # the gateway is stopped here (SIGTERM): its last records are flushed
    out = ledger_check(ledger, sampler.samples)
    out.update({"traffic": counts, "traffic_start_s": t_start, "traffic_end_s": t_end,
                "apportioned_in_time": done, "load_windows": windows,
                "report": report_json(ledger, t_start - 5, t_end + 5)})
    return out


def report_json(ledger: Path, since: float, until: float) -> Any:
    proc = subprocess.run([sys.executable, "-m", "wattgate_cli", "report", "--sqlite", str(ledger),
                           "--since", f"{since:.0f}", "--until", f"{until:.0f}", "--group-by", "tenant",
                           "--format", "json"], capture_output=True, text=True, cwd=REPO, timeout=60)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return orjson.loads(proc.stdout)
