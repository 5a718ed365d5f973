"""The demo's precision sweep and routing comparison, on a second simulated fleet that runs
slower than real time.

Why slower: the question is each precision's highest rate within the SLO, and an H100 holds
tens of requests in its batch there. At real time that is hundreds of token events per second
per engine, four engines at once, more than two CPU cores can relay and time. With
`time_scale` 0.4 engine time runs at 0.4 x wall time: the same batch arrives at 0.4 x the rate,
the client's and gateway's own delays shrink to 0.4 x in engine time, and the SLO graded on
wall time is the engine SLO divided by 0.4 (the whole phase uses about half a core). A faster
scale would put more requests in each wall second, and trial length is what decides how far
capacities move from run to run: a trial must span many request lifetimes. Rates and
latencies are reported in engine time (every table and plot names its time base); joules are
engine joules.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import yaml

from core.quality import published
from core.vocab import SloClass
from loadgen import arrivals, energy, lengths
from loadgen.arms import Arm
from loadgen.capacity import SearchConfig
from loadgen.client import ClientOptions, Target
from loadgen.decide import below_floor, decide
from loadgen.precision import slo_text
from loadgen.procs import free_port, started, wait_http
from loadgen.prompts import WordPrompts
from loadgen.run_summary import DEFAULT_LAG_THRESHOLD_S
from loadgen.runner import RunOptions, RunOutcome, run_workload
from loadgen.search import search_arms
from loadgen.search_report import SearchReport
from loadgen.timebase import TimeBase
from loadgen.workload import TenantSpec, Workload, build_plan

TIME_SCALE = 0.4
PRECISIONS = ("bf16", "fp8", "int8", "int4")
# engine-time SLO for the sweep: a tight interactive TPOT, so capacities differ by precision
SLO_TTFT_S, SLO_TPOT_S = 0.5, 0.009
# the capacity search, engine time: from 25 req/s doubling to at most 400, then bisection
SEARCH_START_RPS, SEARCH_MAX_RPS = 25.0, 400.0
TRIALS = 3
MAX_TRIALS = 8  # seeds are added while a capacity's interval is wider than +/-10 %
TARGET_ATTAINMENT = 0.9
# the least quality (relative to BF16, published figures: core/quality.py) the demo's tenant
# accepts: the precision search's recommendation and both routing gateways respect it
MIN_QUALITY = 0.98
BASE = TimeBase(TIME_SCALE)
ROUTING_RATE_RPS = 60.0  # engine time, across the whole fleet
PROMPT_TOKENS, OUTPUT_TOKENS = 256, 32
POLICIES = ("least_load", "slo_energy")
MODEL = "llama-3.1-8b"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ScaledStack:
    engine_urls: dict[str, str]  # precision -> engine URL
    gateways: dict[str, str]  # routing policy -> gateway base URL


def fleet_doc(ports: dict[str, int]) -> dict[str, Any]:
    return {"defaults": {"gpu": "h100", "model": MODEL, "served_model_name": MODEL,
                         "host": "127.0.0.1", "time_scale": TIME_SCALE, "tokens_per_event": 4},
            "engines": [{"name": f"h100-{p}", "precision": p, "dialect": "vllm", "port": port}
                        for p, port in ports.items()]}


def gateway_doc(base: dict[str, Any], urls: dict[str, str], policy: str, port: int,
                ledger: Path) -> dict[str, Any]:
    """The example gateway's tenants' keys and accounting prices, this fleet's engines, the
    routing policy, and the SLO classes divided by the time scale (wall time)."""
    acc = dict(base.get("accounting") or {})
    acc["ledger"] = {"kind": "sqlite", "path": str(ledger.resolve())}
    acc["meters"] = {f"h100-{p}": {"kind": "sim", "url": u} for p, u in urls.items()}
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        # a short demo: slo_energy's curves count as learnt after a few requests per engine
        # the tenant's quality floor: a precision below it (by its endpoints' published
        # quality) is not routed to
        "routing": {"policy": policy, "min_samples": 5,
                    "min_quality": {"interactive": MIN_QUALITY}},
        "slo_classes": {"interactive": {"ttft_s": SLO_TTFT_S / TIME_SCALE,
                                        "tpot_s": SLO_TPOT_S / TIME_SCALE}},
        "default_slo_class": "interactive",
        "tenants": [{"name": "acme", "api_key_sha256": _digest("sk-demo-acme"),
                     "slo_class": "interactive"}],
        "admin": base["admin"],
        "models": [{"name": MODEL, "endpoints": [
            {"name": f"h100-{p}", "url": u, "kind": "vllm", "precision": p}
            for p, u in urls.items()]}],
        "health": {"interval_s": 1, "timeout_s": 2},
        "accounting": acc,
    }


@contextlib.contextmanager
def scaled_stack(tmp: Path, base_gateway: Path, log: TextIO) -> Iterator[ScaledStack]:
    """Start the scaled fleet and one gateway per routing policy; stop them on exit."""
    ports = {p: free_port() for p in PRECISIONS}
    urls = {p: f"http://127.0.0.1:{port}" for p, port in ports.items()}
    (tmp / "scaled-fleet.yaml").write_text(yaml.safe_dump(fleet_doc(ports)))
    base = yaml.safe_load(base_gateway.read_text())
    gw_ports = {policy: free_port() for policy in POLICIES}
    for policy, port in gw_ports.items():
        doc = gateway_doc(base, urls, policy, port, tmp / f"ledger-{policy}.db")
        (tmp / f"gateway-{policy}.yaml").write_text(yaml.safe_dump(doc))
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(started(["sim", "fleet", str(tmp / "scaled-fleet.yaml")],
                                            log))
        gws = {policy: stack.enter_context(started(
            ["serve", "--config", str(tmp / f"gateway-{policy}.yaml")], log))
            for policy in POLICIES}
        for url in urls.values():
            wait_http(f"{url}/health", fleet, 60)
        for policy, proc in gws.items():
            wait_http(f"http://127.0.0.1:{gw_ports[policy]}/readyz", proc, 60)
        yield ScaledStack(urls, {p: f"http://127.0.0.1:{port}" for p, port in gw_ports.items()})


def workload(rate_rps: float, duration_s: float, seed: int) -> Workload:
    """acme at `rate_rps` engine-time requests/s (sent at rate x time scale on the wall)."""
    tenant = TenantSpec("acme", api_key="sk-demo-acme",
                        prompt_tokens=lengths.fixed(PROMPT_TOKENS),
                        output_tokens=lengths.fixed(OUTPUT_TOKENS), slo_class="interactive")
    slo = SloClass("interactive", ttft_s=SLO_TTFT_S / TIME_SCALE, tpot_s=SLO_TPOT_S / TIME_SCALE)
    return Workload(model=MODEL, tenants=(tenant,),
                    arrival=arrivals.Poisson(rate_rps * TIME_SCALE), duration_s=duration_s,
                    seed=seed, slo_classes=(slo,), prompts=WordPrompts(chosen=True))


async def with_energy(o: RunOutcome, admin_key: str, wait_s: float) -> RunOutcome:
    """The run's per-request energy from its gateway's ledger (fetched after all runs, so the
    wait for final records is paid once)."""
    results = [m.result for m in o.requests]
    session = energy.admin_session()
    try:
        fetch = await energy.fetch_energy(session, o.target.base_url, admin_key, results,
                                          wait_final_s=wait_s)
    finally:
        await session.close()
    return replace(o, energy_fetch=fetch,
                   energy_overall=energy.overall_energy(fetch, results, o.label),
                   energy_by_tenant=energy.group_energy(fetch, results, "tenant"),
                   energy_by_precision=energy.group_energy(fetch, results, "precision"))


def _opts() -> RunOptions:
    # the schedule-lag limit in engine time, like every other figure of these phases
    return RunOptions(fetch_energy=False, progress=False, client=ClientOptions(),
                      lag_threshold_s=DEFAULT_LAG_THRESHOLD_S / TIME_SCALE)


def engine_workload(duration_s: float, seed: int) -> Workload:
    """acme's requests with the SLO in engine time, for the capacity search (which sets the
    rate and scales rates and limits to the wall itself)."""
    tenant = TenantSpec("acme", api_key="sk-demo-acme",
                        prompt_tokens=lengths.fixed(PROMPT_TOKENS),
                        output_tokens=lengths.fixed(OUTPUT_TOKENS), slo_class="interactive")
    return Workload(model=MODEL, tenants=(tenant,), arrival=arrivals.Poisson(SEARCH_START_RPS),
                    duration_s=duration_s, seed=seed,
                    slo_classes=(SloClass("interactive", ttft_s=SLO_TTFT_S, tpot_s=SLO_TPOT_S),),
                    prompts=WordPrompts(chosen=True))


async def precision_search(stack: ScaledStack, trial_s: float, seed: int, admin_key: str,
                           wait_s: float, say: Callable[[str], None],
                           max_trials: int = MAX_TRIALS
                           ) -> tuple[SearchReport, list[RunOutcome]]:
    """Each precision's SLO capacity by search (loadgen/capacity.py), the arms at once (one
    engine each, all vLLM: one engine kind per arm), through the least_load gateway;
    everything in engine time."""
    base_url = stack.gateways["least_load"]
    arms = [Arm(f"{p} (vllm)", p, "vllm", Target(base_url, f"{MODEL}@{p}"), quality=published(p))
            for p in PRECISIONS]
    cfg = SearchConfig(start_rps=SEARCH_START_RPS, max_rps=SEARCH_MAX_RPS,
                       target_attainment=TARGET_ATTAINMENT, trials=TRIALS, seed=seed,
                       max_trials=max_trials)
    opts = RunOptions(admin_key=admin_key, energy_wait_s=wait_s, progress=False,
                      client=ClientOptions())
    results, outcomes = await search_arms(arms, engine_workload(trial_s, seed), cfg, BASE, opts,
                                          say, at_once=True)
    slo = slo_text((SloClass("interactive", ttft_s=SLO_TTFT_S, tpot_s=SLO_TPOT_S),))
    decision = decide(results, None, f"{slo} (engine time)", TARGET_ATTAINMENT,
                      "req/s (engine time)", MIN_QUALITY)
    return SearchReport(tuple(results), decision, cfg, f"{slo} (engine time)", BASE), outcomes


def paired_at_common_rate(r: SearchReport, outcomes: Sequence[RunOutcome]) -> list[RunOutcome]:
    """One outcome per arm at the highest rate every arm ran, first seed: the same plan on
    every arm (same rate and seed), so request i pairs across them."""
    rates = set.intersection(*({s.rate_rps for s in a.search.steps} for a in r.arms))
    if not rates:
        return []
    top = max(rates)
    labels = [f"{a.label}@{top:.4g}#{r.config.seed}" for a in r.arms]
    by_label = {o.label: o for o in outcomes}
    return [by_label[x] for x in labels if x in by_label]


async def surplus_idle_j(base: str, admin_key: str) -> float:
    """The gateway's running total of the idle joules burnt by engines beyond what their
    pool's load needed (`surplus_idle_j` per endpoint in /admin/v1/endpoints)."""
    session = energy.admin_session()
    try:
        async with session.get(f"{base}/admin/v1/endpoints",
                               headers={"Authorization": f"Bearer {admin_key}"}) as resp:
            resp.raise_for_status()
            doc = await resp.json()
    finally:
        await session.close()
    return float(sum((e.get("model_curves") or {}).get("surplus_idle_j") or 0.0
                     for e in doc["endpoints"]))


@dataclass(frozen=True, slots=True)
class RoutingRuns:
    outcomes: list[RunOutcome]  # least_load, slo_energy
    # policy -> idle joules of the engines the load did not need, over that policy's run:
    # what scaling them down (on `wattgate_pool_engines_needed`) would have saved
    surplus_idle_j: dict[str, float]


async def routing_runs(stack: ScaledStack, duration_s: float, seed: int, admin_key: str,
                       wait_s: float) -> RoutingRuns:
    """The same seeded load through a least_load gateway, then a slo_energy one, after an
    unmeasured warm-up through each (slo_energy spreads load until it has measured every
    engine, as a gateway that has served for a while has)."""
    warm = workload(ROUTING_RATE_RPS, duration_s, seed + 1)
    for policy in POLICIES:
        await run_workload(warm, Target(stack.gateways[policy], MODEL), _opts(), label="warm-up",
                           plan=build_plan(warm))
    w = workload(ROUTING_RATE_RPS, duration_s, seed)
    plan = build_plan(w)
    outs, surplus = [], {}
    for policy in POLICIES:
        base = stack.gateways[policy]
        before = await surplus_idle_j(base, admin_key)
        outs.append(await run_workload(w, Target(base, MODEL), _opts(), label=policy, plan=plan))
        surplus[policy] = await surplus_idle_j(base, admin_key) - before
    return RoutingRuns([await with_energy(o, admin_key, wait_s) for o in outs], surplus)


def floor_excluded() -> tuple[str, ...]:
    """The precisions the quality floor keeps out of routing, with why."""
    return below_floor([(p, published(p)) for p in PRECISIONS], MIN_QUALITY)


ROUTING_HEADER = ("routing policy", "requests", "SLO attainment", "J/out-tok",
                  "precisions served (requests)", "idle J a scale-down could save")


def routing_rows(runs: RoutingRuns) -> list[list[str]]:
    rows = []
    for o in runs.outcomes:
        e, s = o.energy_overall, o.summary
        served = ", ".join(f"{x.name} ({x.requests})" for x in o.energy_by_precision)
        idle = runs.surplus_idle_j.get(o.label)
        rows.append([o.label, str(s.requests),
                     "n/a" if s.attainment is None else f"{s.attainment:.1%}",
                     "n/a" if e is None else f"{e.j_per_output_token:.3f}", served or "n/a",
                     "n/a" if idle is None else f"{idle:.1f}"])
    return rows


def surplus_note(runs: RoutingRuns) -> str:
    """One sentence on the idle energy the capacity signal says could have been saved."""
    parts = [f"{p} {j:.1f} J" for p, j in runs.surplus_idle_j.items()]
    return ("Last column: idle energy of engines beyond what each pool's load needed "
            "(wattgate_pool_engines_needed; engine joules over each routing run): "
            f"{', '.join(parts) or 'n/a'}. It is not energy a policy spent but energy a "
            "scale-down or power cap could still save: packing (slo_energy) leaves whole "
            "engines idle, so its figure is the larger.")


def notes() -> list[str]:
    return [f"Precision search and routing comparison: a second simulated H100 fleet (vLLM "
            f"BF16/FP8/INT8/INT4) with time_scale {TIME_SCALE:g}: engine time runs at "
            f"{TIME_SCALE:g} x wall time, so two CPU cores can carry the batch sizes an H100 "
            "holds at its SLO capacity. Rates, latencies, goodput and the SLO of these phases "
            "are in engine time in every table and plot (the "
            f"client sent at {TIME_SCALE:g} x these rates and graded wall latency against the "
            f"SLO / {TIME_SCALE:g}); joules are the engines' own. Requests: {PROMPT_TOKENS} "
            f"prompt words, {OUTPUT_TOKENS} output tokens, Poisson arrivals."]
