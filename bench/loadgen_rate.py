"""How fast can the load generator keep its schedule?

Against a zero-delay streaming engine (`wattgate loadgen selftest-engine`, 16-token streams,
16-token prompts), step the Poisson rate up and record, per rate: achieved rate, schedule lag
p50/p99/max, errors, client CPU per request. A rate is *sustained* when every request succeeds,
the achieved rate is within 3% of the requested one, and schedule lag p99 <= 1 ms.
Configurations: one process, and several worker processes. When the machine has spare cores,
the engine and the single client are pinned to different cores (one core each).

    .venv/bin/python -m bench.loadgen_rate [--duration 3] [--repeats 3] [--workers 2]

Writes bench/results/loadgen_rate.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import uvloop

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadgen import lengths, run_summary  # noqa: E402
from loadgen.arrivals import Poisson  # noqa: E402
from loadgen.client import ClientOptions, Target, run_plan  # noqa: E402
from loadgen.procs import free_port  # noqa: E402
from loadgen.workers import run_workers  # noqa: E402
from loadgen.workload import TenantSpec, Workload, build_plan  # noqa: E402

RESULTS = REPO / "bench" / "results"
LAG_P99_LIMIT_S = 0.001
RELAXED_LAG_P99_S = 0.010


async def _timer_floor(rate: float, duration_s: float) -> list[float]:
    """Lag of a bare absolute-schedule loop (no HTTP): what the machine alone costs."""
    from loadgen.schedule import sleep_until as _sleep_until

    plan = build_plan(workload(rate, duration_s))
    t0 = time.monotonic() + 0.1
    lags = []
    for r in plan:
        await _sleep_until(t0 + r.intended_s)
        lags.append(time.monotonic() - t0 - r.intended_s)
    return lags


def timer_floor(rate: float, duration_s: float) -> dict[str, float]:
    lags = sorted(uvloop.run(_timer_floor(rate, duration_s)))
    return {"rate_rps": rate, "lag_p50_ms": round(run_summary.percentile(lags, 50) * 1e3, 3),
            "lag_p99_ms": round(run_summary.percentile(lags, 99) * 1e3, 3),
            "lag_max_ms": round(lags[-1] * 1e3, 3)}
TOKENS = 16


@contextlib.contextmanager
def running(cmd: list[str], ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(ready_url, timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def workload(rate: float, duration_s: float) -> Workload:
    tenant = TenantSpec("bench", prompt_tokens=lengths.fixed(TOKENS),
                        output_tokens=lengths.fixed(TOKENS))
    return Workload("bench", (tenant,), Poisson(rate), duration_s=duration_s, seed=1)


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime + ch.ru_utime + ch.ru_stime


def one_rate(url: str, rate: float, duration_s: float, workers: int) -> dict[str, Any]:
    w = workload(rate, duration_s)
    plan = build_plan(w)
    target = Target(url, "bench")
    opts = ClientOptions()
    c0 = cpu_s()
    if workers > 1:
        results, _ = run_workers(plan, target, workers, opts=opts)
    else:
        results = uvloop.run(run_plan(plan, target, t0=time.monotonic() + 0.2, opts=opts))
    cpu = cpu_s() - c0
    s, _ = run_summary.summarize(results, w.slo, requested_rate_rps=rate,
                             lag_threshold_s=LAG_P99_LIMIT_S)
    requested = (len(plan) - 1) / (plan[-1].intended_s - plan[0].intended_s)
    kept = s.ok == s.requests and s.achieved_rate_rps >= 0.97 * requested
    sustained = kept and s.lag_s.p99 <= LAG_P99_LIMIT_S
    return {
        "rate_rps": rate, "planned_rate_rps": round(requested, 1), "requests": s.requests,
        "ok": s.ok, "errors": s.errors, "achieved_rate_rps": round(s.achieved_rate_rps, 1),
        "lag_p50_ms": round(s.lag_s.p50 * 1e3, 3), "lag_p99_ms": round(s.lag_s.p99 * 1e3, 3),
        "lag_max_ms": round(s.lag_s.max * 1e3, 3),
        "ttft_send_p50_ms": round(s.from_send.ttft_s.p50 * 1e3, 3),
        "ttft_intended_p50_ms": round(s.from_intended.ttft_s.p50 * 1e3, 3),
        "client_cpu_us_per_request": round(cpu / max(1, s.requests) * 1e6, 1) if workers == 1
        else None,
        "sustained": sustained,
        "sustained_lag_p99_10ms": kept and s.lag_s.p99 <= RELAXED_LAG_P99_S,
        "kept_rate": kept,
    }


def ladder(url: str, rates: list[float], duration_s: float, workers: int, label: str,
           repeats: int) -> dict[str, Any]:
    rows = []
    misses = 0
    for rate in rates:
        # Repeat and keep the run with the median lag p99: one preemption burst on a shared
        # machine should not decide a rate either way.
        runs = sorted((one_rate(url, rate, duration_s, workers)
                       for _ in range(repeats)), key=lambda r: r["lag_p99_ms"])
        row = runs[len(runs) // 2]
        row["lag_p99_ms_all_repeats"] = [r["lag_p99_ms"] for r in runs]
        rows.append(row)
        print(f"{label:>22} {rate:7.0f} req/s: achieved {row['achieved_rate_rps']:8.1f}, lag p50 "
              f"{row['lag_p50_ms']:7.3f} ms p99 {row['lag_p99_ms']:9.3f} ms, ok {row['ok']}/"
              f"{row['requests']} -> {'sustained' if row['sustained'] else 'NOT sustained'}",
              file=sys.stderr)
        # Keep climbing while the rate is still achieved; stop once it collapses twice.
        misses = 0 if row["kept_rate"] else misses + 1
        if misses >= 2:
            break
    best = max((r["rate_rps"] for r in rows if r["sustained"]), default=None)
    relaxed = max((r["rate_rps"] for r in rows if r["sustained_lag_p99_10ms"]), default=None)
    return {"label": label, "workers": workers, "rows": rows,
            "max_sustained_rps": best, "max_sustained_rps_lag_p99_10ms": relaxed}


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    out = ["# Load generator: highest sustained request rate", "",
           f"Zero-delay engine, {TOKENS}-token prompts and streams, Poisson arrivals, "
           f"{doc['duration_s']:g} s per run, {doc['repeats']} runs per rate (the run with the "
           f"median lag p99 is shown). Sustained = no errors, achieved >= 97% of "
           f"requested, schedule lag p99 <= {LAG_P99_LIMIT_S * 1e3:g} ms.", "",
           f"Machine: {m['cpus']} CPUs ({m['machine']}), Python {m['python']}; load average "
           f"{m['loadavg_start']} at start, {m['loadavg_end']} at end (other work on the machine "
           f"competes for the same cores). Pinning: {m['pinning']}.", "",
           f"Timer floor (the schedule loop alone, no HTTP, {doc['floor']['rate_rps']:g} req/s, "
           f"same pinning): lag p50 {doc['floor']['lag_p50_ms']} ms, p99 "
           f"{doc['floor']['lag_p99_ms']} ms, max {doc['floor']['lag_max_ms']} ms, measured once "
           f"before the ladders. On a shared machine other processes come and go during the "
           f"ladders, so a lag p99 miss at a rate below a sustained one is the machine "
           f"preempting the client, not the client's own cost.",
           ""]
    for cfg in doc["configs"]:
        out += [f"## {cfg['label']}: max sustained {cfg['max_sustained_rps'] or 'none'} req/s "
                f"(lag p99 <= 1 ms); {cfg['max_sustained_rps_lag_p99_10ms'] or 'none'} req/s "
                f"with lag p99 <= 10 ms",
                "", "| rate | achieved | lag p50 ms | lag p99 ms | lag max ms | ok | TTFT send p50 "
                "ms | TTFT intended p50 ms | client CPU us/req (incl. sub-ms spin-wait) | "
                "sustained | lag p99 ms, all runs |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in cfg["rows"]:
            out.append(f"| {r['rate_rps']:g} | {r['achieved_rate_rps']} | {r['lag_p50_ms']} | "
                       f"{r['lag_p99_ms']} | {r['lag_max_ms']} | {r['ok']}/{r['requests']} | "
                       f"{r['ttft_send_p50_ms']} | {r['ttft_intended_p50_ms']} | "
                       f"{r['client_cpu_us_per_request']} | {'yes' if r['sustained'] else 'no'} | "
                       f"{', '.join(str(x) for x in r['lag_p99_ms_all_repeats'])} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--rates", default="500,1000,1500,2000,2500,3000,4000,5000,6000,8000")
    ap.add_argument("--repeats", type=int, default=3, help="runs per rate (median lag p99 kept)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    cpus = os.cpu_count() or 1
    port = free_port()
    engine_cmd = [sys.executable, "-m", "wattgate_cli", "loadgen", "selftest-engine", "--port",
                  str(port)]
    pin = cpus >= 2
    if pin:
        engine_cmd = ["taskset", "-c", str(cpus - 1), *engine_cmd]
    machine = {"cpus": cpus, "machine": platform.machine(), "python": platform.python_version(),
               "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
               "pinning": (f"engine on CPU {cpus - 1}, single-process client on CPU 0; workers "
                           f"unpinned" if pin else "none (one CPU)")}
    url = f"http://127.0.0.1:{port}"
    configs = []
    with running(engine_cmd, f"{url}/health"):
        all_cpus = os.sched_getaffinity(0)
        if pin:
            os.sched_setaffinity(0, {0})
        floor = timer_floor(1000.0, args.duration)
        print(f"timer floor: {floor}", file=sys.stderr)
        configs.append(ladder(url, rates, args.duration, 1, "1 process", args.repeats))
        os.sched_setaffinity(0, all_cpus)
        if args.workers > 1:
            configs.append(ladder(url, rates, args.duration, args.workers,
                                  f"{args.workers} workers", args.repeats))
    machine["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    doc = {"benchmark": "loadgen_rate", "duration_s": args.duration, "repeats": args.repeats,
           "tokens": TOKENS,
           "lag_p99_limit_ms": LAG_P99_LIMIT_S * 1e3, "machine": machine, "floor": floor,
           "configs": configs,
           "unix_time": int(time.time())}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "loadgen_rate.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    (RESULTS / "loadgen_rate.md").write_text(markdown(doc) + "\n")
    print(markdown(doc))


if __name__ == "__main__":
    main()
