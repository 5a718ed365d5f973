"""Routing benchmark: `least_load` against `slo_energy` on a simulated fleet, the same seeded
schedule per policy, at about 30/60/90 % of the fleet's SLO capacity.

    python -m bench.routing [--quick] [--out bench/results]

Fleet: four simulated H100s serving Llama-3.1-8B (vLLM BF16 and FP8, TensorRT-LLM BF16 and
FP8: two precisions, both dialects), run slower than real time (`time_scale` < 1) so that the
load the SLO allows fits two shared CPU cores; SLO limits are given in engine time and
scaled to wall time. Per policy one gateway process (accounting on, `sim` meters), the loads
in increasing order. Energy: the gateway's ledger (requests' apportioned joules, via
`wattgate loadgen`) and the simulator's counters (every engine, idle included). Writes
routing.json, routing.md and routing.svg (attainment against J per output token).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from gateway.routing import RoutingContext
from gateway.routing.capacity import slo_capacity
from gateway.routing.models import EndpointModel
from gateway.routing.priors import prior_for
from loadgen import traces
from loadgen.procs import free_port, process, wait_http, wattgate
from loadgen.truth.fleet import ADMIN_KEY, MODEL, _digest

ENGINES = (("vllm-bf16", "vllm", "bf16"), ("vllm-fp8", "vllm", "fp8"),
           ("trt-bf16", "trtllm", "bf16"), ("trt-fp8", "trtllm", "fp8"))
POLICIES = ("least_load", "slo_energy")
TTFT_SLO_S = 0.5  # engine time
TPOT_SLO_S = 0.012  # engine time: tight, so that the fleet's SLO capacity stays small
PROMPT_TOKENS, OUTPUT_TOKENS = 128, 96
API_KEY = "sk-routing-bench"
# "poisson": Poisson arrivals, fixed lengths; "trace": a replayed Azure-format trace (bursty
# arrivals, lognormal lengths; `trace_workload` below)
SCHEDULES = ("poisson", "trace")
TRACE_BURSTINESS = 0.2  # gamma shape of the trace's inter-arrival times


@dataclass(frozen=True, slots=True)
class Settings:
    time_scale: float
    duration_s: float
    loads: tuple[float, ...]
    seed: int = 7
    schedules: tuple[str, ...] = SCHEDULES
    # an unmeasured run first, at the first load, so that each gateway has measured every
    # endpoint before the measured runs (slo_energy spreads load while its curves are cold,
    # as a gateway that has served for a while would not)
    warmup_s: float = 20.0
    slo_margin: float | None = None  # routing.slo_margin (None: the gateway's default)


DEFAULT = Settings(time_scale=0.1, duration_s=40.0, loads=(0.3, 0.6, 0.9))
QUICK = Settings(time_scale=0.1, duration_s=10.0, loads=(0.3,), warmup_s=12.0)


def fleet_capacity_rps(s: Settings) -> float:
    """Requests/s (wall) the fleet serves within the SLO by the cold-start curves: each
    engine's SLO capacity (requests resident) over a request's engine-time duration."""
    ctx = RoutingContext(0, b"", ttft_slo_s=TTFT_SLO_S, tpot_slo_s=TPOT_SLO_S, slo_margin=1.0,
                         prompt_tokens=PROMPT_TOKENS)
    total = 0.0
    for _, kind, precision in ENGINES:
        c = EndpointModel(prior_for(kind, precision)).curves()
        cap = slo_capacity(c, ctx)
        total += cap / (OUTPUT_TOKENS * c.tpot(cap))
    return total * s.time_scale


def gateway_doc(urls: dict[str, str], policy: str, s: Settings, port: int, ledger: Path
                ) -> dict[str, Any]:
    kinds = {n: (k, p) for n, k, p in ENGINES}
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "routing": {"policy": policy} | ({"slo_margin": s.slo_margin}
                                         if s.slo_margin is not None else {}),
        "slo_classes": {"interactive": {"ttft_s": TTFT_SLO_S / s.time_scale,
                                        "tpot_s": TPOT_SLO_S / s.time_scale}},
        "tenants": [{"name": "bench", "api_key_sha256": _digest(API_KEY)}],
        "admin": {"api_key_sha256": _digest(ADMIN_KEY)},
        "models": [{"name": MODEL, "endpoints": [
            {"name": n, "url": u, "kind": kinds[n][0], "precision": kinds[n][1]}
            for n, u in urls.items()]}],
        "health": {"interval_s": 1, "timeout_s": 2},
        "accounting": {"interval_s": 1, "settle_s": 2, "poll_s": 0.25, "flush_s": 0.5,
                       "ledger": {"kind": "sqlite", "path": str(ledger)},
                       "meters": {n: {"kind": "sim", "url": u} for n, u in urls.items()}},
    }


def surplus_idle_j(base: str) -> float:
    """The gateway's running total of idle joules that engines beyond what their pool's load
    needed burnt (gateway.routing.capacity.SurplusMeter, from /admin/v1/endpoints)."""
    req = urllib.request.Request(f"{base}/admin/v1/endpoints",
                                 headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        doc = json.loads(resp.read())
    return float(sum((e.get("model_curves") or {}).get("surplus_idle_j", 0.0)
                     for e in doc["endpoints"]))


def sim_energy_j(urls: dict[str, str]) -> dict[str, float]:
    out = {}
    for name, url in urls.items():
        with urllib.request.urlopen(f"{url}/sim/energy", timeout=5) as resp:
            doc = json.loads(resp.read())
        out[name] = sum(g["energy_j"] for g in doc["gpus"])
    return out


@contextlib.contextmanager
def fleet(work: Path, s: Settings) -> Iterator[dict[str, str]]:
    ports = {n: free_port() for n, _, _ in ENGINES}
    doc = {"defaults": {"gpu": "h100", "model": MODEL, "served_model_name": MODEL,
                        "host": "127.0.0.1", "time_scale": s.time_scale, "tokens_per_event": 8},
           "engines": [{"name": n, "precision": p, "dialect": k, "port": ports[n]}
                       for n, k, p in ENGINES]}
    (work / "fleet.yaml").write_text(yaml.safe_dump(doc))
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    with open(work / "fleet.log", "wb") as log, \
            process(wattgate("sim", "fleet", str(work / "fleet.yaml")), log) as sims:
        for url in urls.values():
            wait_http(f"{url}/health", sims, 60)
        yield urls


def trace_workload(work: Path, rate: float, s: Settings, seed: int, slo_scale: float) -> Path:
    """A workload replaying an Azure-format trace at `rate` req/s (wall) for `s.duration_s`.

    No public trace file ships with wattgate and none can be downloaded here, so the trace is
    written by loadgen.traces' generator in the Azure LLM-inference CSV format: gamma
    inter-arrivals of shape 0.2 (CV 2.2, bursty), lognormal prompt/output lengths whose means
    are the Poisson arm's 128/96 tokens (so both arms offer the same work per request). Its
    time is scaled so that exactly rate x duration requests arrive in the run."""
    n = max(2, round(rate * s.duration_s))
    # lognormal medians for the means 128/96 (sigma 0.8 and 0.9 in the generator)
    rows = traces.synthetic_rows(n + 1, seed, rate_rps=1.0, burstiness=TRACE_BURSTINESS,
                                 median_in=round(PROMPT_TOKENS / math.exp(0.8 ** 2 / 2)),
                                 median_out=round(OUTPUT_TOKENS / math.exp(0.9 ** 2 / 2)))
    path = work / f"trace-{seed}-{rate:.3f}.csv"
    path.write_text(traces.azure_text(rows))
    span_s = rows[-1].offset_s - rows[0].offset_s
    doc = {"model": MODEL, "api": "completions", "seed": seed, "duration_s": s.duration_s,
           "max_requests": n, "tokenizer": "words",
           "slo_classes": {"default": {"ttft_s": TTFT_SLO_S * slo_scale,
                                       "tpot_s": TPOT_SLO_S * slo_scale}},
           "tenants": [{"name": "default", "api_key": API_KEY}],
           "traces": [{"path": str(path), "format": "azure", "dequantize_s": 0,
                       "speedup": span_s / s.duration_s}]}
    out = path.with_suffix(".yaml")
    out.write_text(yaml.safe_dump(doc))
    return out


def loadgen_cmd(base: str, schedule: str, rate: float, duration_s: float, seed: int,
                s: Settings, work: Path, out: Path) -> list[str]:
    slo_scale = 1.0 / s.time_scale
    common = ["--target", base, "--seed", str(seed), "--admin-key", ADMIN_KEY,
              "--lag-threshold-ms", "1000", "--quiet", "--out", str(out), "--energy-wait", "15"]
    if schedule == "trace":
        wl = trace_workload(work, rate, replace(s, duration_s=duration_s), seed, slo_scale)
        return wattgate("loadgen", "run", "--workload", str(wl), *common)
    return wattgate("loadgen", "run", "--model", MODEL, "--api", "completions", "--rate",
                    f"{rate:.3f}", "--duration", str(duration_s), "--prompt-tokens",
                    str(PROMPT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS), "--tokenizer",
                    "words", "--api-key", API_KEY,
                    "--slo-ttft-ms", str(1000 * TTFT_SLO_S * slo_scale),
                    "--slo-tpot-ms", str(1000 * TPOT_SLO_S * slo_scale), *common)


def one_policy(work: Path, urls: dict[str, str], policy: str, s: Settings, rate_cap: float
               ) -> list[dict[str, Any]]:
    port = free_port()
    cfg = work / f"gateway-{policy}.yaml"
    cfg.write_text(yaml.safe_dump(gateway_doc(urls, policy, s, port, work / f"{policy}.db")))
    rows = []
    with open(work / f"gateway-{policy}.log", "wb") as log, \
            process(wattgate("serve", "--config", str(cfg), "--log-level", "warning"), log) as gw:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/health", gw, 60)
        time.sleep(2.5)  # first health checks and scrapes
        plan = [("poisson", f"warmup-{s.loads[0]}", s.loads[0], s.warmup_s, s.seed + 1)]
        plan += [(sched, f"{sched}-{share}", share, s.duration_s, s.seed)
                 for sched in s.schedules for share in s.loads]
        for schedule, label, share, duration_s, seed in plan:
            rate = share * rate_cap
            before, surplus0 = sim_energy_j(urls), surplus_idle_j(base)
            out = work / f"{policy}-{label}"
            cmd = loadgen_cmd(base, schedule, rate, duration_s, seed, s, work, out)
            with open(work / f"loadgen-{policy}-{label}.log", "wb") as lg_log:
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=lg_log)
            if label.startswith("warmup"):
                continue
            after, surplus1 = sim_energy_j(urls), surplus_idle_j(base)
            run = json.loads(next(out.glob("*.json")).read_text())["runs"][0]
            rows.append(row(policy, schedule, share, rate, run, before, after)
                        | {"surplus_idle_j": round(surplus1 - surplus0, 1)})
    return rows


def row(policy: str, schedule: str, share: float, rate: float, run: dict[str, Any],
        before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    summary, energy = run["summary"], run["energy"] or {}
    fleet_j = sum(after[n] - before[n] for n in after)
    tokens = energy.get("output_tokens") or sum(int(r.get("completion_tokens") or 0)
                                                for r in run["requests"])
    return {
        "policy": policy, "schedule": schedule, "load_share": share, "rate_rps": round(rate, 3),
        "attainment": summary.get("attainment"), "completed": summary.get("completed"),
        "ledger_j_per_output_token": energy.get("j_per_output_token"),
        "fleet_energy_j": round(fleet_j, 1),
        "fleet_j_per_output_token": round(fleet_j / tokens, 4) if tokens else None,
        "output_tokens": tokens,
        "engines": {n: {"energy_j": round(after[n] - before[n], 1)} for n in after},
    }


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per schedule and load: slo_energy against least_load, and whether the targets are met
    (>= 15 % fewer J per output token, attainment no more than 1 point lower)."""
    out = []
    for sched, share in sorted({(r["schedule"], r["load_share"]) for r in rows},
                               key=lambda k: (SCHEDULES.index(k[0]), k[1])):
        by = {r["policy"]: r for r in rows
              if r["load_share"] == share and r["schedule"] == sched}
        base, new = by.get("least_load"), by.get("slo_energy")
        if not base or not new:
            continue
        cmp: dict[str, Any] = {"schedule": sched, "load_share": share}
        for key in ("ledger_j_per_output_token", "fleet_j_per_output_token"):
            if base[key] and new[key]:
                cmp[key + "_saving_pct"] = round(100 * (1 - new[key] / base[key]), 1)
        a0, a1 = base["attainment"], new["attainment"]
        cmp["attainment_delta_points"] = (round(100 * (a1 - a0), 1)
                                          if a0 is not None and a1 is not None else None)
        saving = cmp.get("ledger_j_per_output_token_saving_pct")
        cmp["met"] = bool(saving is not None and saving >= 15.0
                          and cmp["attainment_delta_points"] is not None
                          and cmp["attainment_delta_points"] >= -1.0)
        out.append(cmp)
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def markdown(rows: list[dict[str, Any]], cmps: list[dict[str, Any]], s: Settings) -> str:
    lines = [f"Settings: time_scale {s.time_scale}, {s.duration_s:g} s per run, seed {s.seed}, "
             f"schedules {', '.join(s.schedules)} (poisson: {PROMPT_TOKENS} prompt / "
             f"{OUTPUT_TOKENS} output tokens; trace: Azure-format, gamma shape "
             f"{TRACE_BURSTINESS:g} arrivals, lognormal lengths of the same means), SLO TTFT "
             f"{TTFT_SLO_S * 1000:g} ms, TPOT {TPOT_SLO_S * 1000:g} ms (engine time).", "",
             "| schedule | policy | load | rate (req/s) | attainment | J/output token (ledger) "
             "| J/output token (fleet, idle incl.) | surplus engines' idle J |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        j = r["ledger_j_per_output_token"]
        lines.append(f"| {r['schedule']} | {r['policy']} | {100 * r['load_share']:.0f} % | "
                     f"{r['rate_rps']} | {_pct(r['attainment'])} | "
                     f"{'n/a' if j is None else f'{j:.4f}'} | {r['fleet_j_per_output_token']} | "
                     f"{r.get('surplus_idle_j')} of {r['fleet_energy_j']} |")
    lines += ["", "| schedule | load | J/token saving (ledger) | J/token saving (fleet) | "
              "attainment change | target met |", "| --- | --- | --- | --- | --- | --- |"]
    for c in cmps:
        lines.append(f"| {c['schedule']} | {100 * c['load_share']:.0f} % | "
                     f"{c.get('ledger_j_per_output_token_saving_pct')} % | "
                     f"{c.get('fleet_j_per_output_token_saving_pct')} % | "
                     f"{c['attainment_delta_points']} points | {'yes' if c['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def svg(rows: list[dict[str, Any]]) -> str:
    """Attainment (y) against ledger J per output token (x), one colour per policy."""
    pts = [(r["policy"], r["ledger_j_per_output_token"], r["attainment"],
            f"{r['schedule']} {100 * r['load_share']:.0f}%") for r in rows
           if r["ledger_j_per_output_token"] and r["attainment"] is not None]
    w, h, m = 640, 400, 60
    xmax = max((p[1] for p in pts), default=1.0) * 1.1
    colour = {"least_load": "#d62728", "slo_energy": "#2ca02c"}
    body = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">',
            f'<rect width="{w}" height="{h}" fill="white"/>',
            f'<line x1="{m}" y1="{h - m}" x2="{w - 20}" y2="{h - m}" stroke="black"/>',
            f'<line x1="{m}" y1="20" x2="{m}" y2="{h - m}" stroke="black"/>',
            f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">J per output token '
            '(gateway ledger)</text>',
            f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" '
            'text-anchor="middle">SLO attainment</text>']
    for name, j, att, label in pts:
        x = m + (w - m - 20) * j / xmax
        y = (h - m) - (h - m - 20) * att
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{colour.get(name, "grey")}"/>')
        body.append(f'<text x="{x + 7:.1f}" y="{y - 7:.1f}" font-size="11">{name} '
                    f'{label}</text>')
    body.append("</svg>")
    return "\n".join(body) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one short load level (a smoke test)")
    ap.add_argument("--loads", type=float, nargs="+", default=None,
                    help="load levels as shares of the fleet's SLO capacity (e.g. 0.9)")
    ap.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=None)
    ap.add_argument("--duration", type=float, default=None, help="seconds per measured run")
    ap.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    ap.add_argument("--slo-margin", type=float, default=None,
                    help="routing.slo_margin of the gateways (default: the gateway's)")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--name", default=None, help="file stem (default routing / routing-quick)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the work folder (logs, ledgers, loadgen output) here")
    args = ap.parse_args(argv)
    s = QUICK if args.quick else DEFAULT
    if args.loads:
        s = replace(s, loads=tuple(args.loads))
    if args.schedules:
        s = replace(s, schedules=tuple(args.schedules))
    if args.duration:
        s = replace(s, duration_s=args.duration)
    if args.slo_margin:
        s = replace(s, slo_margin=args.slo_margin)
    rate_cap = fleet_capacity_rps(s)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="wattgate-routing-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        with fleet(work, s) as urls:
            for policy in args.policies:
                rows += one_policy(work, urls, policy, s, rate_cap)
    cmps = compare(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.name or ("routing-quick" if args.quick else "routing")
    doc = {"settings": {"time_scale": s.time_scale, "duration_s": s.duration_s,
                        "loads": s.loads, "schedules": s.schedules, "seed": s.seed,
                        "trace_burstiness": TRACE_BURSTINESS, "slo_margin": s.slo_margin,
                        "capacity_rps": round(rate_cap, 3)},
           "rows": rows, "comparison": cmps}
    (args.out / f"{name}.json").write_text(json.dumps(doc, indent=2))
    (args.out / f"{name}.md").write_text(markdown(rows, cmps, s))
    (args.out / f"{name}.svg").write_text(svg(rows))
    sys.stdout.write(markdown(rows, cmps, s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
