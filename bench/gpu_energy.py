"""The NVML meter on a real GPU, and the gateway charging that GPU's measured energy.

    python -m bench.gpu_energy                 # on a GPU node with PyTorch: ~2 minutes
    python -m bench.gpu_energy --dry-run       # anywhere: a fake NVML, sleeps for the load

Part 1, the meter: over an idle window and a fixed bf16 matmul load on GPU 0, the joules the
NVML meter (`engines.meters.nvml.NvmlMeter`, the gateway's own code path) reads against
`nvidia-smi --query-gpu=total_energy_consumption` read at the same moments, and against power
sampled at 20 Hz and integrated (instant power where the driver has it; the 1 s average
`nvmlDeviceGetPowerUsage` too, to show why it is not used). Also: how often the counter
steps, what a read costs, and `wattgate agent` serving the same counter.

Part 2, the gateway: a simulated engine's endpoint metered by `{kind: nvml, gpus: [0]}` while
the GPU runs the matmul load 5 s on, 5 s off, and two tenants stream requests through
`wattgate serve`. From its SQLite ledger: every interval's shares plus idle against the
interval's energy (conservation), each interval's energy against the counter sampled
independently at 20 Hz and interpolated at the interval's edges, and the tenants' bills.

Writes gpu_energy.{json,md,png} (default bench/results/). `--dry-run` runs the same code with
bench/fake_nvml/pynvml.py (a counter that is a function of the wall clock, so the gateway's
process reads the same one) and without nvidia-smi or PyTorch, to keep this script working on
machines without a GPU (tests/integration/test_gpu_energy_dry_run.py).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import hashlib
import itertools
import math
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench.gpu_energy_report import markdown, plot
from loadgen.metrics import percentile

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FAKE_NVML = REPO / "bench" / "fake_nvml"
MODEL = "llama-3.1-8b"
ENGINE = "gpu0"
KEYS = {"tenant-a": "sk-bench-a", "tenant-b": "sk-bench-b"}
ADMIN_KEY = "sk-bench-admin"


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def rel(a: float, b: float) -> float:
    """(a - b) / b, 0 when both are 0."""
    return (a - b) / b if b else (0.0 if a == 0 else math.inf)


# ---- the load ---------------------------------------------------------------------------------

class Load:
    """bf16 8192^3 matrix products on GPU 0 (PyTorch), or sleep in a dry run."""

    N = 8192

    def __init__(self, dry: bool):
        self.dry = dry
        self.products = 0
        self._lock = threading.Lock()
        if not dry:
            import torch

            self._torch = torch
            torch.manual_seed(0)
            self._a = torch.randn(self.N, self.N, dtype=torch.bfloat16, device="cuda")
            self._b = torch.randn(self.N, self.N, dtype=torch.bfloat16, device="cuda")
            torch.cuda.synchronize()

    def run_for(self, seconds: float) -> float:
        """Busy for `seconds`; returns the wall time it took (whole batches of 10 products)."""
        t0 = time.monotonic()
        if self.dry:
            time.sleep(seconds)
            return time.monotonic() - t0
        torch = self._torch
        torch.cuda.set_device(0)  # this thread's CUDA context (the load also runs on a thread)
        while time.monotonic() - t0 < seconds:
            for _ in range(10):
                torch.matmul(self._a, self._b)
            torch.cuda.synchronize()
            with self._lock:
                self.products += 10
        return time.monotonic() - t0

    @property
    def tflop(self) -> float:
        return self.products * 2 * self.N**3 / 1e12

    def pattern(self, on_s: float, off_s: float, stop: threading.Event,
                windows: list[tuple[float, float]]) -> None:
        """On/off until `stop`; appends each busy window (wall clock) to `windows`."""
        while not stop.is_set():
            start = time.time()
            self.run_for(on_s)
            windows.append((start, time.time()))
            stop.wait(off_s)


# ---- NVML sampling ----------------------------------------------------------------------------

@dataclass
class Samples:
    t: list[float] = field(default_factory=list)
    counter_j: list[float] = field(default_factory=list)
    avg_w: list[float] = field(default_factory=list)  # nvmlDeviceGetPowerUsage (1 s average)
    inst_w: list[float | None] = field(default_factory=list)  # NVML_FI_DEV_POWER_INSTANT

    def energy_at(self, t: float) -> float:
        """The counter linearly interpolated at wall time `t` (inside the sampled span)."""
        i = bisect.bisect_left(self.t, t)
        if i <= 0 or i >= len(self.t):
            raise ValueError(f"{t} is outside the sampled span {self.t[0]}..{self.t[-1]}")
        t0, t1 = self.t[i - 1], self.t[i]
        e0, e1 = self.counter_j[i - 1], self.counter_j[i]
        return e0 + (e1 - e0) * (t - t0) / (t1 - t0)

    def integrate(self, series: list[Any], t0: float, t1: float) -> float | None:
        """Trapezoid integral of a power series (W) over [t0, t1], None if any point is missing."""
        pts = [(t, w) for t, w in zip(self.t, series, strict=True) if t0 <= t <= t1]
        if len(pts) < 2 or any(w is None for _, w in pts):
            return None
        return math.fsum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in itertools.pairwise(pts))


class Sampler(threading.Thread):
    """Reads GPU 0's counter and power every `period_s` on its own thread, wall-clock stamped."""

    def __init__(self, nvml: Any, period_s: float = 0.05):
        super().__init__(daemon=True)
        self.nvml = nvml
        self.handle = nvml.nvmlDeviceGetHandleByIndex(0)
        self.period_s = period_s
        self.samples = Samples()
        self.instant_supported = True
        self._halt = threading.Event()

    def _instant_w(self) -> float | None:
        if not self.instant_supported:
            return None
        try:
            [fv] = self.nvml.nvmlDeviceGetFieldValues(self.handle, [self.nvml.NVML_FI_DEV_POWER_INSTANT])
            if fv.nvmlReturn != self.nvml.NVML_SUCCESS:
                raise self.nvml.NVMLError(fv.nvmlReturn)
            return float(fv.value.uiVal) / 1000.0
        except (self.nvml.NVMLError, AttributeError, ValueError):
            self.instant_supported = False
            return None

    def read(self) -> None:
        s = self.samples
        mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        s.t.append(time.time())
        s.counter_j.append(mj / 1000.0)
        s.avg_w.append(self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0)
        s.inst_w.append(self._instant_w())

    def run(self) -> None:
        next_t = time.monotonic()
        while not self._halt.is_set():
            self.read()
            next_t += self.period_s
            self._halt.wait(max(0.0, next_t - time.monotonic()))

    def stop(self) -> None:
        self._halt.set()
        self.join()


# ---- nvidia-smi -------------------------------------------------------------------------------

UNITS_J = {"mJ": 1e-3, "J": 1.0, "kJ": 1e3}


def parse_smi_csv(text: str) -> float:
    """Joules from `nvidia-smi --query-gpu=total_energy_consumption --format=csv` output, whose
    header names the unit, e.g. 'total_energy_consumption [mJ]' then '123456789'."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) < 2 or "[" not in lines[0]:
        raise ValueError(f"unexpected nvidia-smi output: {text!r}")
    unit = lines[0].split("[", 1)[1].split("]", 1)[0].strip()
    if unit not in UNITS_J:
        raise ValueError(f"unknown unit {unit!r} in {lines[0]!r}")
    value = lines[1].split()[0]
    return float(value) * UNITS_J[unit]


def smi_energy_j() -> tuple[float, float]:
    """(wall time at the midpoint of the call, joules) from nvidia-smi for GPU 0."""
    t0 = time.time()
    out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=total_energy_consumption",
                          "--format=csv"], capture_output=True, text=True, timeout=30, check=True)
    t1 = time.time()
    return (t0 + t1) / 2, parse_smi_csv(out.stdout)


# ---- part 1: the meter ------------------------------------------------------------------------

def window(name: str, seconds: float, busy: Callable[[float], Any] | None, meter: Any,
           sampler: Sampler, use_smi: bool) -> dict[str, Any]:
    """One measured window: meter and nvidia-smi read at both ends, power integrated between."""
    smi0 = smi_energy_j() if use_smi else None
    m0 = meter.read_sync()
    if busy is None:
        time.sleep(seconds)
    else:
        busy(seconds)
    m1 = meter.read_sync()
    smi1 = smi_energy_j() if use_smi else None
    time.sleep(3 * sampler.period_s)  # the sampler's span covers both ends
    s = sampler.samples
    meter_j = m1.total_j - m0.total_j
    dt = m1.timestamp_s - m0.timestamp_s
    out: dict[str, Any] = {"window": name, "seconds": dt, "meter_j": meter_j,
                           "meter_avg_w": meter_j / dt}
    if smi0 and smi1:
        # nvidia-smi reads at other moments (a process start each): compare each source over
        # its own span, and the meter's counter re-read by the sampler over nvidia-smi's span.
        out["smi_j"] = smi1[1] - smi0[1]
        out["smi_seconds"] = smi1[0] - smi0[0]
        out["sampler_over_smi_span_j"] = s.energy_at(smi1[0]) - s.energy_at(smi0[0])
        out["smi_vs_sampler_rel"] = rel(out["smi_j"], out["sampler_over_smi_span_j"])
        out["smi_avg_w"] = out["smi_j"] / out["smi_seconds"]
        out["meter_vs_smi_avg_power_rel"] = rel(out["meter_avg_w"], out["smi_avg_w"])
    out["sampler_j"] = s.energy_at(m1.timestamp_s) - s.energy_at(m0.timestamp_s)
    out["meter_vs_sampler_rel"] = rel(meter_j, out["sampler_j"])
    for key, series in (("instant_power_integral_j", s.inst_w), ("avg_power_integral_j", s.avg_w)):
        val = s.integrate(series, m0.timestamp_s, m1.timestamp_s)
        out[key] = val
        out[key.replace("_j", "_vs_meter_rel")] = None if val is None else rel(val, meter_j)
    say(f"{name}: {dt:.1f} s, meter {meter_j:.1f} J ({out['meter_avg_w']:.1f} W)"
        + (f", nvidia-smi {out['smi_j']:.1f} J over {out['smi_seconds']:.2f} s" if "smi_j" in out else ""))
    return out


def _q(xs: list[float], q: float) -> float:
    return percentile(sorted(xs), 100.0 * q)


def read_costs(nvml: Any, meter: Any, n: int = 2000) -> dict[str, float]:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    direct, via_meter = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        t1 = time.perf_counter()
        meter.read_sync()
        t2 = time.perf_counter()
        direct.append(t1 - t0)
        via_meter.append(t2 - t1)
    return {"nvml_call_us_median": statistics.median(direct) * 1e6,
            "nvml_call_us_p99": _q(direct, 0.99) * 1e6,
            "meter_read_sync_us_median": statistics.median(via_meter) * 1e6}


def counter_cadence(nvml: Any, seconds: float) -> dict[str, Any] | None:
    """Polls the counter as fast as it answers for `seconds`: how often its value changes."""
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    changes, reads, last = [], 0, None
    end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        value = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        reads += 1
        if last is not None and value != last:
            changes.append(now)
        last = value
    steps = [b - a for a, b in itertools.pairwise(changes)]
    if len(steps) < 3:
        return None
    return {"median_ms": statistics.median(steps) * 1e3, "p10_ms": _q(steps, 0.1) * 1e3,
            "p90_ms": _q(steps, 0.9) * 1e3, "changes": len(changes), "reads": reads}


def agent_check(nvml: Any) -> dict[str, Any]:
    """`wattgate agent` serving GPU 0: its joules against a direct read right after."""
    from loadgen.demo import free_port, started, wait_http

    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/energy"
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with tempfile.TemporaryFile("w+") as log, \
            started(["agent", "--host", "127.0.0.1", "--port", str(port), "--gpus", "0"], log) as proc:
        try:
            wait_http(url, proc, 60)
        except (RuntimeError, TimeoutError) as exc:
            log.seek(0)
            return {"error": f"{exc}: {log.read()[-2000:]}"}
        diffs = []
        for _ in range(5):
            with urllib.request.urlopen(url, timeout=5) as resp:
                doc = orjson.loads(resp.read())
            direct_j = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0
            after = time.time()
            agent_j = next(g["energy_j"] for g in doc["gpus"] if g["index"] == 0)
            diffs.append({"agent_j": agent_j, "direct_j": direct_j,
                          "direct_minus_agent_j": direct_j - agent_j,
                          "read_apart_s": after - doc["timestamp_s"]})
            time.sleep(0.2)
    return {"reads": diffs, "max_abs_diff_j": max(abs(d["direct_minus_agent_j"]) for d in diffs)}


def part_meter(nvml: Any, load: Load, sampler: Sampler, args: argparse.Namespace) -> dict[str, Any]:
    from engines.meters.nvml import NvmlMeter

    meter = NvmlMeter([0], nvml=nvml)
    use_smi, smi_note = True, None
    try:
        smi_energy_j()
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        use_smi = False  # then the NVML call read directly (the sampler) is the reference
        smi_note = f"{exc}: {getattr(exc, 'stdout', '') or ''}{getattr(exc, 'stderr', '') or ''}".strip()
        say(f"nvidia-smi cannot report the energy counter: {smi_note}")
    out: dict[str, Any] = {"smi_error": smi_note, "read_costs": read_costs(nvml, meter),
                           "cadence_idle": counter_cadence(nvml, 1.5)}
    out["windows"] = [window("idle", args.idle_s, None, meter, sampler, use_smi),
                      window("matmul", args.load_s, load.run_for, meter, sampler, use_smi)]
    mm = out["windows"][1]
    mm["tflop"] = load.tflop
    if not args.dry_run:
        mm["tflop_per_s"] = mm["tflop"] / mm["seconds"]
        mm["j_per_tflop"] = mm["meter_j"] / mm["tflop"]
    busy = threading.Thread(target=load.run_for, args=(2.5,), daemon=True)
    busy.start()
    time.sleep(0.5)
    out["cadence_busy"] = counter_cadence(nvml, 1.5)
    busy.join()
    out["agent"] = agent_check(nvml)
    return out


# ---- part 2: the gateway ----------------------------------------------------------------------

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
        "accounting": {"interval_s": 1, "flush_s": 0.5, "settle_s": 2,
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
        rows.append({"interval": idx, "start_s": start, "energy_j": energy, "idle_j": idle,
                     "shares_j": shared, "requests": n, "sampled_j": sampled})
    total = math.fsum(r["energy_j"] for r in rows)
    sampled_rows = [r for r in rows if r["sampled_j"] is not None]
    span_total = math.fsum(r["energy_j"] for r in sampled_rows)
    span_sampled = math.fsum(r["sampled_j"] for r in sampled_rows)
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
        "interval_vs_sampler_rel": ({"median_abs": statistics.median(abs_vs), "p95_abs": _q(abs_vs, 0.95),
                                     "max_abs": max(abs_vs), "n": len(abs_vs)} if abs_vs else None),
        "span_energy_vs_sampler_rel": rel(span_total, span_sampled) if span_sampled else None,
        "rows": rows,
    }


def part_gateway(load: Load, sampler: Sampler, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from loadgen.demo import free_port, started, wait_http

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


# ---- the run ------------------------------------------------------------------------------

def gpu_info(nvml: Any) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    info = {"name": text(nvml.nvmlDeviceGetName(handle)), "driver": text(nvml.nvmlSystemGetDriverVersion())}
    with contextlib.suppress(nvml.NVMLError, AttributeError):
        info["power_limit_w"] = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    return info


@contextlib.contextmanager
def nvml_module(dry: bool) -> Iterator[Any]:
    if dry:  # this process and the gateway and agent it starts read the fake counter
        sys.path.insert(0, str(FAKE_NVML))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")])
        os.environ["PATH"] = os.pathsep.join([str(FAKE_NVML), os.environ.get("PATH", "")])  # nvidia-smi
    import pynvml

    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--idle-s", type=float, default=8.0)
    p.add_argument("--load-s", type=float, default=30.0)
    p.add_argument("--traffic-s", type=float, default=30.0)
    p.add_argument("--on-s", type=float, default=5.0)
    p.add_argument("--off-s", type=float, default=5.0)
    p.add_argument("--skip-gateway", action="store_true")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                           "dry_run": args.dry_run, "host": platform.node(),
                           "python": platform.python_version()}
    with nvml_module(args.dry_run) as nvml, tempfile.TemporaryDirectory() as tmp:
        res["gpu"] = gpu_info(nvml)
        say(f"GPU 0: {res['gpu']}")
        load = Load(args.dry_run)
        sampler = Sampler(nvml)
        sampler.start()
        time.sleep(0.5)
        try:
            res["meter"] = part_meter(nvml, load, sampler, args)
            res["instant_power_supported"] = sampler.instant_supported
            _write(args.out, res)  # part 1 stands on its own if part 2 fails
            if not args.skip_gateway:
                try:
                    res["gateway"] = part_gateway(load, sampler, args, Path(tmp))
                except Exception as exc:
                    res["gateway"] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            sampler.stop()
        _write(args.out, res)
        try:
            plot(res, sampler.samples, args.out / "gpu_energy.png")
        except Exception as exc:
            say(f"plot failed: {exc!r}")
    say(f"wrote {args.out}/gpu_energy.{{json,md,png}}")
    print(markdown(res))


def _write(out: Path, res: dict[str, Any]) -> None:
    (out / "gpu_energy.json").write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    (out / "gpu_energy.md").write_text(markdown(res))


if __name__ == "__main__":
    main()
