"""`wattgate demo`: a simulated fleet behind the gateway, multi-tenant bursty load, a paired
precision comparison, tables on stdout and an HTML report, then everything stopped.

It starts `wattgate sim fleet` and `wattgate serve` as processes (never imports their
internals), on free ports written into temporary copies of deploy/examples/fleet.yaml and
local.yaml. Every process it starts runs in its own process group and is stopped on exit,
Ctrl-C included, unless --keep-running leaves them up until Ctrl-C.
"""

from __future__ import annotations

import html
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import click
import yaml

from core.vocab import SloClass
from loadgen import arrivals, demo_saving, energy, lengths, report, search_report
from loadgen.client import ClientOptions, Target
from loadgen.demo_precision import RoutingRuns, ScaledStack
from loadgen.experiments import PairedDelta, paired_delta
from loadgen.procs import free_port, started, wait_http
from loadgen.prompts import WordPrompts
from loadgen.runner import RunOptions, RunOutcome, run_workload
from loadgen.search_report import SearchReport
from loadgen.workload import TenantSpec, Workload
from wire.ports import taken_message

EXAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "examples"
MODEL = "llama-3.1-8b"
ADMIN_KEY = "sk-demo-admin"
PRECISIONS = ("bf16", "fp8", "int8", "int4")
DEFAULT_DURATION_S = 60.0  # `wattgate demo --duration`'s default
# The fleet is simulated, and the simulator counts one prompt token per word: words are its
# exact unit, chosen on purpose (the report says so), so there is nothing to warn about.
SIM_PROMPTS = WordPrompts(chosen=True)


def _say(text: str) -> None:
    click.echo(text, err=True)


def write_configs(tmp: Path, ledger: Path | None = None, port: int = 0, base_port: int = 0
                  ) -> tuple[Path, Path, int, list[str]]:
    """Copies of the example fleet and gateway configs (meters follow their engines; the
    ledger goes to `ledger`, default beside the copies); returns (fleet file, gateway file,
    gateway port, engine URLs). The gateway listens on `port` and engine i on `base_port + i`;
    0 picks free ports. Raises click.ClickException naming a fixed port already in use."""
    fleet = yaml.safe_load((EXAMPLES / "fleet.yaml").read_text())
    fixed = [port] if port else []
    fixed += [base_port + i for i in range(len(fleet["engines"]))] if base_port else []
    taken = taken_message(("127.0.0.1", p) for p in fixed)
    if taken is not None:
        raise click.ClickException(taken)
    gw = yaml.safe_load((EXAMPLES / "local.yaml").read_text())
    remap: dict[str, str] = {}
    urls = []
    for i, eng in enumerate(fleet["engines"]):
        old = f"http://127.0.0.1:{eng['port']}"
        eng["port"] = base_port + i if base_port else free_port()
        remap[old] = f"http://127.0.0.1:{eng['port']}"
        urls.append(remap[old])
    for pool in gw["models"]:
        for ep in pool["endpoints"]:
            ep["url"] = remap.get(ep["url"].rstrip("/"), ep["url"])
    accounting = gw.get("accounting")
    if accounting:
        for meter in (accounting.get("meters") or {}).values():
            if "url" in meter:
                meter["url"] = remap.get(meter["url"].rstrip("/"), meter["url"])
        accounting["ledger"] = {"kind": "sqlite",
                                "path": str((ledger or tmp / "ledger.db").resolve())}
    port = port or free_port()
    gw["listen"]["port"] = port
    fleet_path, gw_path = tmp / "fleet.yaml", tmp / "gateway.yaml"
    fleet_path.write_text(yaml.safe_dump(fleet))
    gw_path.write_text(yaml.safe_dump(gw))
    return fleet_path, gw_path, port, urls


def tenant_workload(duration_s: float, seed: int) -> Workload:
    """Three demo tenants: steady interactive, bursty batch (on/off), diurnal-ish interactive."""
    slos = (SloClass("interactive", ttft_s=0.5, tpot_s=0.05), SloClass("batch", ttft_s=10.0,
                                                                        tpot_s=0.2))
    acme = TenantSpec("acme", api_key="sk-demo-acme",
                      arrival=arrivals.Gamma(3.0, burstiness=0.5),
                      prompt_tokens=lengths.LengthDist("lognormal", median=200, sigma=0.6,
                                                       min=16, max=2000),
                      output_tokens=lengths.LengthDist("uniform", low=32, high=96),
                      slo_class="interactive")
    globex = TenantSpec("globex", api_key="sk-demo-globex",
                        arrival=arrivals.OnOff(on_rate_rps=8.0, mean_on_s=3.0, mean_off_s=5.0),
                        prompt_tokens=lengths.LengthDist("lognormal", median=800, sigma=0.5,
                                                         min=64, max=4000),
                        output_tokens=lengths.LengthDist("uniform", low=64, high=160),
                        slo_class="batch")
    initech = TenantSpec("initech", api_key="sk-demo-initech",
                         arrival=arrivals.Diurnal(arrivals.Poisson(2.0), period_s=duration_s,
                                                  amplitude=0.8),
                         prompt_tokens=lengths.LengthDist("zipf", s=1.1, min=16, max=1500),
                         output_tokens=lengths.fixed(48), slo_class="interactive")
    return Workload(model=MODEL, tenants=(acme, globex, initech), arrival=None,
                    duration_s=duration_s, seed=seed, slo_classes=slos, prompts=SIM_PROMPTS)


def compare_workload(duration_s: float, seed: int) -> Workload:
    tenant = TenantSpec("acme", api_key="sk-demo-acme", prompt_tokens=lengths.fixed(256),
                        output_tokens=lengths.fixed(64), slo_class="interactive")
    return Workload(model=MODEL, tenants=(tenant,), arrival=arrivals.Poisson(4.0),
                    duration_s=duration_s, seed=seed,
                    slo_classes=(SloClass("interactive", ttft_s=0.5, tpot_s=0.05),),
                    prompts=SIM_PROMPTS)


def finality_wait_s(gateway_config: Path) -> float:
    """How long after a run's last response its requests take to be final: the interval after
    the finish must end, settle and be apportioned (one poll later), plus a margin."""
    acc = yaml.safe_load(gateway_config.read_text()).get("accounting") or {}
    return (float(acc.get("settle_s", 2.0)) + 2 * float(acc.get("interval_s", 1.0))
            + 2 * float(acc.get("poll_s", 0.25)) + 1.0)


@dataclass(frozen=True, slots=True)
class DemoResults:
    tenants: RunOutcome
    sweep: list[RunOutcome]  # every trial of every precision's search, on the scaled fleet
    search: SearchReport
    deltas: list[PairedDelta]  # paired, at the highest rate every precision ran (first seed)
    routing: RoutingRuns  # least_load, slo_energy, and the surplus engines' idle joules
    idle_j: float | None = None  # the engines' idle account over the tenants' run (not billed)


async def _phases(base_url: str, engine_urls: list[str], duration_s: float, seed: int,
                  stack: ScaledStack, energy_wait_s: float = 30.0) -> DemoResults:
    # energy_wait_s: the most to wait for bills to be final; polling stops as soon as all
    # are, so a busy machine waits longer and an idle one no longer than before
    from loadgen import demo_precision as dp

    opts = RunOptions(admin_key=ADMIN_KEY, energy_wait_s=energy_wait_s, client=ClientOptions(),
                      sim_engines=tuple(engine_urls))
    _say(f"phase 1: three tenants, bursty arrivals, {duration_s / 2:.0f} s")
    tw = tenant_workload(duration_s / 2, seed)
    since = time.time()
    tenants = await run_workload(tw, Target(base_url, MODEL), opts, label="tenants")
    session = energy.admin_session()
    try:  # after the run's energy is final, so its idle intervals are apportioned too
        idle = await demo_saving.idle_j(session, base_url, ADMIN_KEY, since, time.time())
    finally:
        await session.close()
    # 60 s -> 8 s trials: 3 s ones measure a transient and overstate capacity, and their
    # capacities move between runs beyond their intervals (bench/results/precision_search*.md)
    trial_s, routing_s = max(2.0, duration_s / 7.5), max(3.0, duration_s / 10)
    # a short demo (a smoke run) adds no seeds: its trials are too short to narrow anything
    max_trials = dp.MAX_TRIALS if duration_s >= DEFAULT_DURATION_S else dp.TRIALS
    _say(f"phase 2: capacity search per precision ({', '.join(dp.PRECISIONS)}): from "
         f"{dp.SEARCH_START_RPS:g} req/s (engine time) doubling until the SLO is missed, then "
         f"bisection to 5 %, {dp.TRIALS} trials of {trial_s:.0f} s per rate, seeds added up to "
         f"{max_trials} while a capacity's interval is wider than +/-10 %")
    search, sweep = await dp.precision_search(stack, trial_s, seed, ADMIN_KEY, energy_wait_s,
                                              _say, max_trials)
    top = dp.paired_at_common_rate(search, sweep)
    deltas = [paired_delta(top[0].label, top[0].requests, o.label, o.requests,
                           top[0].energy_overall, o.energy_overall) for o in top[1:]]
    _say(f"phase 3: routing least_load vs slo_energy, {dp.ROUTING_RATE_RPS:g} req/s "
         f"(engine time), {routing_s:.0f} s each")
    routing = await dp.routing_runs(stack, routing_s, seed, ADMIN_KEY, energy_wait_s)
    return DemoResults(tenants, sweep, search, deltas, routing, idle)


def budget_line(tenants: RunOutcome, tenant: str = "initech") -> str:
    """How the demo tenant's joule budget (deploy/examples/local.yaml) held: its 429s."""
    config = yaml.safe_load((EXAMPLES / "local.yaml").read_text())
    budgets = next((t.get("budgets") or [] for t in config["tenants"] if t["name"] == tenant), [])
    units = {"j": "J", "kwh": "kWh", "usd": "USD", "gco2e": "gCO2e"}
    what = ", ".join(f"{v:g} {units.get(k, k)} per {b['period']}" for b in budgets
                     for k, v in b.items() if k != "period") or "no budget"
    mine = [m.result for m in tenants.requests if m.result.tenant == tenant]
    refused = sum(1 for r in mine if r.code == "budget_exceeded")
    return (f"budget: {tenant} has {what} (tenant controls); {refused} of its {len(mine)} "
            "requests were refused with 429 budget_exceeded once it was spent (counted as "
            "refused, not as SLO misses: attainment is over the requests it was served)")


def tenant_view(r: DemoResults) -> tuple[list[list[str]], str]:
    """The tenants' rows with the idle energy as a row of its own, and the bills' sentence."""
    rows = report.tenant_rows(r.tenants)
    rows.append(demo_saving.idle_row(r.idle_j, len(report.TENANT_HEADER)))
    bills = "; ".join(f"{e.name} {e.energy_j:.0f} J, {e.carbon_g:.3f} gCO2e, "
                      f"{e.cost_usd:.4f} USD" for e in r.tenants.energy_by_tenant)
    idle = "n/a" if r.idle_j is None else f"{r.idle_j:.0f} J"
    return rows, (f"Tenants' bills: {bills or 'n/a'}; idle {idle}, kept apart (billed to the "
                  "engines' idle account, not to tenants).")


def show(r: DemoResults, out_dir: Path) -> None:
    """The tables on stdout; demo.html, .json and .csv under `out_dir`."""
    from loadgen import demo_precision as dp
    from loadgen import report_html as rh

    ll, se = r.routing.outcomes
    saving = demo_saving.routing_saving(ll, se, dp.MIN_QUALITY, dp.floor_excluded())
    tenant_rows, bills = tenant_view(r)
    click.echo("\n== tenants (gateway picks the precision by tenant policy) ==")
    click.echo(report.run_table([r.tenants]))
    click.echo()
    click.echo("per tenant, latency in ms and goodput in req/s, wall time\n"
               + report.text_table(report.TENANT_HEADER, tenant_rows))
    click.echo(f"{bills} Policy: {demo_saving.IDLE_POLICY}.")
    click.echo("\n== precisions: SLO capacity by search, J/token along the load curve ==")
    click.echo(search_report.text(r.search))
    click.echo("\npaired at the highest rate every precision ran:")
    click.echo(report.delta_table(r.deltas, dp.BASE))
    click.echo("\n== routing: the same load, least_load vs slo_energy ==")
    click.echo(report.text_table(dp.ROUTING_HEADER, dp.routing_rows(r.routing)))
    click.echo(demo_saving.saving_line(saving))
    click.echo(dp.surplus_note(r.routing))
    budget_note = budget_line(r.tenants)
    click.echo(f"\n{budget_note}")
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes = [r.tenants, *r.sweep, *r.routing.outcomes]
    report.write_json(out_dir / "demo.json", outcomes,
                      {"deltas": r.deltas, "search": search_report.to_json(r.search),
                       "routing_saving": saving, "idle_j": r.idle_j})
    report.write_csv(out_dir / "demo.csv", outcomes)
    sections = [
        "<h2>Tenants' bills</h2>" + rh.table(report.TENANT_HEADER, tenant_rows,
                                             "latency in ms from intended arrival, wall time")
        + f"<p>{html.escape(bills)} Policy: {html.escape(demo_saving.IDLE_POLICY)}.</p>",
        "<h2>Routing: least_load vs slo_energy (same seeded load)</h2>"
        + rh.table(dp.ROUTING_HEADER, dp.routing_rows(r.routing),
                   f"{dp.ROUTING_RATE_RPS:g} req/s, {dp.BASE.name}")
        + f"<p>{html.escape(demo_saving.saving_line(saving))}</p>"
        + f"<p>{html.escape(dp.surplus_note(r.routing))}</p>",
        "".join(rh.runs_section(r.routing.outcomes, None, {}, [], dp.BASE, "Routing runs"))]
    rh.write_html(out_dir / "demo.html", "wattgate demo", [r.tenants], deltas=r.deltas,
                  search=r.search, quality={},
                  answer=[demo_saving.saving_line(saving), bills],
                  sections=sections, notes=["Simulated H100 fleet (roofline timing and power "
                                            "model); latencies measured from intended "
                                            "arrival.", *dp.notes(), budget_note],
                  raw=[(f"precision search trials ({dp.BASE.name})",
                        report.run_table(r.sweep, None, {}, dp.BASE))],
                  runs_title="Tenants' runs", delta_base=dp.BASE)
    _say(f"report: {out_dir / 'demo.html'} (also demo.json, demo.csv)")


def run_demo(*, duration_s: float, out_dir: Path, keep_running: bool, seed: int,
             port: int = 0, base_port: int = 0) -> int:
    import uvloop

    from loadgen import demo_precision as dp

    out_dir.mkdir(parents=True, exist_ok=True)
    _interrupt_on_sigterm()
    # the configs live under out_dir, so this run's processes can be told from any other's
    with tempfile.TemporaryDirectory(prefix="wattgate-demo-", dir=out_dir) as tmp_name:
        tmp = Path(tmp_name)
        ledger = out_dir / "ledger.db"
        ledger.unlink(missing_ok=True)  # each demo run bills from an empty ledger
        fleet_file, gw_file, port, engine_urls = write_configs(tmp, ledger, port, base_port)
        base_url = f"http://127.0.0.1:{port}"
        with open(out_dir / "fleet.log", "w") as flog, open(out_dir / "gateway.log", "w") as glog:
            try:
                with started(["sim", "fleet", str(fleet_file)], flog) as fleet:
                    _say(f"starting simulated fleet ({len(engine_urls)} engines)")
                    for url in engine_urls:
                        wait_http(f"{url}/health", fleet, 60)
                    with started(["serve", "--config", str(gw_file), "--port", str(port)],
                                 glog) as gateway:
                        _say(f"starting gateway on {base_url}")
                        wait_http(f"{base_url}/readyz", gateway, 60)
                        with dp.scaled_stack(tmp, gw_file, flog) as stack:
                            show(uvloop.run(_phases(base_url, engine_urls, duration_s, seed,
                                                     stack, finality_wait_s(gw_file))), out_dir)
                        if keep_running:
                            _keep(base_url, engine_urls, out_dir)
            except KeyboardInterrupt:
                _say("interrupted; stopping the gateway and the fleet")
                return 130
            except (RuntimeError, TimeoutError) as exc:
                _say(f"demo failed: {exc} (logs in {out_dir})")
                return 1
    return 0


def _keep(base_url: str, engine_urls: list[str], out_dir: Path) -> None:
    click.echo(f"\ngateway API: {base_url}/v1  (keys sk-demo-acme, sk-demo-globex, "
               f"sk-demo-initech)")
    click.echo(f"metrics:     {base_url}/metrics")
    click.echo(f"usage:       {base_url}/admin/v1/usage?group_by=tenant,precision  "
               f"(admin key sk-demo-admin)")
    click.echo(f"report:      {(out_dir / 'demo.html').resolve()}")
    for url in engine_urls:
        click.echo(f"engine:      {url}")
    click.echo("running; Ctrl-C stops everything", nl=True)
    sys.stdout.flush()
    while True:
        time.sleep(3600)


def _interrupt_on_sigterm() -> None:
    """SIGTERM stops the demo like Ctrl-C, so what it started is stopped too."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)



