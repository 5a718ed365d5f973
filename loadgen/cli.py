"""`wattgate loadgen ...` and `wattgate demo`: the command-line shell over the load generator."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import yaml

from core.tokenizer import TokenizerNotFound
from core.vocab import SloClass
from loadgen import (
    arrivals,
    lengths,
    prompts,
    report,
    report_html,
    search_cli,
    search_report,
    traces,
)
from loadgen.arm_runs import compare_arms, sweep_rates
from loadgen.cli_types import COUNT, NON_NEGATIVE, POSITIVE, SHARE, rate_list, scores
from loadgen.client import ClientOptions, Target
from loadgen.decide import below_floor
from loadgen.demo_cli import demo as demo  # `wattgate demo` (the root table names it here)
from loadgen.experiments import (
    paired_delta,
    point,
    sweep_result,
)
from loadgen.precision import precision_report, slo_text
from loadgen.runner import RunOptions, RunOutcome, run_workload
from loadgen.slo_source import fetch_tenant_slos, graded_by_gateway
from loadgen.targets import check_reachable, check_target, parse_pairs
from loadgen.workload import TenantSpec, Workload, build_plan, load_workload, requested_rate_rps


def _err(text: str) -> None:
    click.echo(text, err=True)


def _run(coro: Any) -> Any:
    import uvloop
    return uvloop.run(coro)


def common(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by run, compare, sweep and preset."""
    opts = [
        click.option("--target", required=True, help="Base URL of the gateway or engine."),
        click.option("--workload", "workload_file", type=click.Path(exists=True, dir_okay=False,
                     path_type=Path), help="Workload YAML (tenants, arrivals, traces)."),
        click.option("--model", default="llama-3.1-8b", show_default=True),
        click.option("--api", type=click.Choice(["chat", "completions"]), default="chat",
                     show_default=True),
        click.option("--rate", type=POSITIVE, default=5.0, show_default=True,
                     help="Requests/s (without --workload)."),
        click.option("--arrival", type=click.Choice(["poisson", "gamma", "constant"]),
                     default="poisson", show_default=True),
        click.option("--burstiness", type=POSITIVE, default=1.0, show_default=True,
                     help="Gamma shape k (CV = 1/sqrt(k)); 1 = Poisson."),
        click.option("--duration", "duration_s", type=POSITIVE, default=20.0, show_default=True),
        click.option("--requests", "max_requests", type=COUNT, default=100_000, show_default=True,
                     help="Most requests to send."),
        click.option("--concurrency", type=COUNT, default=None,
                     help="Closed loop: keep this many in flight instead of a schedule."),
        click.option("--max-concurrency", type=COUNT, default=None,
                     help="Open loop with at most this many in flight (late ones queue)."),
        click.option("--prompt-tokens", type=COUNT, default=128, show_default=True),
        click.option("--output-tokens", type=COUNT, default=64, show_default=True),
        click.option("--tokenizer", default=None, metavar="NAME_OR_PATH",
                     help="The target model's tokenizer (a tokenizer.json, a model folder, or "
                     "a hub name in the local hub cache; nothing is downloaded): prompts of "
                     "exactly --prompt-tokens tokens, and trace lengths in tokens. 'words': "
                     "one word per token, the simulated engine's count. Default: the "
                     "workload's, else words with a warning."),
        click.option("--api-key", default="", help="Bearer key (without --workload)."),
        click.option("--admin-key", default="", help="Gateway admin key, to fetch energy."),
        click.option("--no-energy", is_flag=True, help="Skip the energy fetch."),
        click.option("--slo-ttft-ms", type=POSITIVE, default=500.0, show_default=True),
        click.option("--slo-tpot-ms", type=POSITIVE, default=50.0, show_default=True),
        click.option("--slo-source", type=click.Choice(["gateway", "own"]), default="gateway",
                     show_default=True, help="gateway: grade each tenant with an API key by "
                     "the SLO class the gateway grades it by (GET /v1/usage), else by the "
                     "load generator's own (--slo-*-ms or the workload's); own: always the "
                     "load generator's."),
        click.option("--seed", type=int, default=None,
                     help="Seeds arrivals and prompts (default: the workload's, else 0)."),
        click.option("--workers", type=COUNT, default=1, show_default=True,
                     help="Client processes (when one cannot keep the schedule)."),
        click.option("--lag-threshold-ms", type=NON_NEGATIVE, default=10.0, show_default=True,
                     help="Refuse to grade SLOs when schedule lag p99 exceeds this."),
        click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
                     default=None, help="Write JSON, CSV and HTML here."),
        click.option("--quiet", is_flag=True, help="No live progress line."),
        click.option("--energy-wait", "energy_wait_s", type=NON_NEGATIVE, default=10.0,
                     show_default=True,
                     help="Seconds to wait, after the last response, for the gateway's records "
                     "to be final (their intervals settled and apportioned); polling stops as "
                     "soon as they all are."),
        click.option("--energy-source", type=click.Choice(["auto", "gateway", "sim"]),
                     default="auto", show_default=True,
                     help="auto: gateway accounting when the target is the gateway, else the "
                     "simulated engine's ground truth."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def build_workload(p: dict[str, Any]) -> Workload:
    """The workload the options describe, with its prompt synthesiser; warns (once) when
    prompt lengths are words rather than the target's tokens."""
    check_target(p["target"])
    try:
        w = _workload(p)
        if p.get("tokenizer"):
            w = replace(w, prompts=prompts.from_spec(p["tokenizer"]))
    except (TokenizerNotFound, prompts.PromptError) as exc:
        raise click.BadParameter(str(exc), param_hint="--tokenizer or the workload's "
                                 "tokenizer") from None
    if w.prompts.warning:
        _err(w.prompts.warning)
    if p["slo_source"] == "gateway":
        found = _run(fetch_tenant_slos(p["target"], w.tenants))
        w, notes = graded_by_gateway(w, found, p.get("time_scale") or 1.0)
        for note in notes:
            _err(note)
    return w


def _workload(p: dict[str, Any]) -> Workload:
    if p["workload_file"] is not None:
        try:
            w = load_workload(p["workload_file"])
        # The file is the user's: a wrong shape surfaces as whichever error its reader hits
        # first (a list where a mapping belongs is a TypeError); name the file, not a trace.
        except (OSError, yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise click.BadParameter(f"{p['workload_file']}: {one_line(exc)}",
                                     param_hint="--workload") from None
        return replace(w, seed=p["seed"]) if p["seed"] is not None else w
    if p["concurrency"]:
        arrival: arrivals.ArrivalProcess = arrivals.Closed(p["concurrency"], p["max_requests"])
    elif p["arrival"] == "gamma":
        arrival = arrivals.Gamma(p["rate"], p["burstiness"])
    elif p["arrival"] == "constant":
        arrival = arrivals.Constant(p["rate"])
    else:
        arrival = arrivals.Poisson(p["rate"])
    slo = SloClass("default", ttft_s=p["slo_ttft_ms"] / 1e3, tpot_s=p["slo_tpot_ms"] / 1e3)
    tenant = TenantSpec("default", api_key=p["api_key"],
                        prompt_tokens=lengths.fixed(p["prompt_tokens"]),
                        output_tokens=lengths.fixed(p["output_tokens"]), slo_class="default")
    return Workload(model=p["model"], tenants=(tenant,), arrival=arrival,
                    duration_s=p["duration_s"], max_requests=p["max_requests"],
                    seed=p["seed"] or 0,
                    api=p["api"], slo_classes=(slo,))


def one_line(exc: BaseException) -> str:
    mark = getattr(exc, "problem_mark", None)  # a YAML syntax error says where
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return " ".join(str(exc).split())


def run_options(p: dict[str, Any]) -> RunOptions:
    return RunOptions(workers=p["workers"], lag_threshold_s=p["lag_threshold_ms"] / 1e3,
                      admin_key=p["admin_key"], fetch_energy=not p["no_energy"],
                      energy_wait_s=p["energy_wait_s"],
                      energy_source=p["energy_source"], progress=not p["quiet"],
                      client=ClientOptions(max_concurrency=p["max_concurrency"]))


def write_outputs(out_dir: Path | None, name: str, outcomes: Sequence[RunOutcome], **html: Any
                  ) -> None:
    if out_dir is None:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    extra = {k: v for k, v in html.items() if k in ("deltas", "sweep", "precision")}
    report.write_json(out_dir / f"{name}.json", outcomes, extra)
    report.write_csv(out_dir / f"{name}.csv", outcomes)
    report_html.write_html(out_dir / f"{name}.html", html.pop("title", f"wattgate loadgen {name}"),
                      outcomes, **html)
    _err(f"wrote {out_dir}/{name}.json, .csv, .html")


def _print_outcome(o: RunOutcome) -> None:
    click.echo(report.run_table([o]))
    click.echo()
    click.echo(report.send_vs_intended(o))
    click.echo()
    click.echo(report.class_table(o))
    click.echo()
    click.echo(report.tenant_table(o))


@click.group()
def loadgen() -> None:
    """Load generator: realistic arrivals, coordinated-omission-free timing, goodput per SLO,
    paired precision comparisons with each request's energy (measured or estimated, as the
    gateway flags it)."""


@loadgen.command()
@common
def run(**p: Any) -> None:
    """One run against --target (the gateway or an engine). Exits 1 when no request succeeded
    (an unreachable or wrong target), naming the commonest failure."""
    w = build_workload(p)
    target = Target(p["target"], w.model, w.api)
    check_reachable([target.base_url])
    o = _run(run_workload(w, target, run_options(p), label="run"))
    _print_outcome(o)
    write_outputs(p["out_dir"], "run", [o])
    fail_if_nothing_succeeded([o])


def fail_if_nothing_succeeded(outcomes: Sequence[RunOutcome]) -> None:
    """Exit 1 with the commonest failure of any run in which no request succeeded."""
    for o in outcomes:
        results = [m.result for m in o.requests]
        if results and not any(r.ok for r in results):
            worst = Counter(f"{r.status}: {r.error}" if r.error else r.status
                            for r in results).most_common(1)[0]
            _err(f"error: no request of {o.label or 'the run'} succeeded against "
                 f"{o.target.base_url} ({worst[1]} of {len(results)}: {worst[0]})")
            sys.exit(1)


@loadgen.command()
@common
@click.option("--precisions", default="bf16,fp8,int8,int4", show_default=True,
              help="Arms, the first is the baseline.")
@click.option("--arm-target", multiple=True, help="PRECISION=URL: send this arm to an engine.")
@click.option("--by-header", is_flag=True, help="Select precision by header, not model@prec.")
@click.option("--quality", multiple=True,
              help="PRECISION=SCORE: a quality score you measured (else 'not measured').")
@click.option("--rates", callback=rate_list, default="",
              help="Comma-separated offered rates (req/s): sweep every "
              "arm over them (one seeded schedule per rate, replayed on each arm) and report "
              "each precision's SLO capacity and J/token along the load curve. Default: "
              "--rate only.")
@click.option("--attainment", "target_attainment", type=SHARE, default=0.9, show_default=True,
              help="Share of requests that must meet the SLO for a rate to count as met.")
@search_cli.search_options
def compare(**p: Any) -> None:
    """One seeded schedule and prompt set against each arm (one engine kind and precision):
    paired deltas, per arm the highest rate meeting the SLO and J/token there, and the
    recommendation (arms under --min-quality left out). With --search: capacities by search
    with 95 % intervals, and "no significant difference" when the arms cannot be told apart."""
    w = build_workload(p)
    precisions = [x.strip() for x in p["precisions"].split(",") if x.strip()]
    quality = scores(p["quality"], "--quality", precisions)
    arms = search_cli.build_arms(p, w, precisions, parse_pairs(p["arm_target"], "--arm-target"),
                                 _run, quality)
    check_reachable(a.target.base_url for a in arms)
    opts = run_options(p)
    if p["search"]:
        sr, outcomes = search_cli.run_search(p, w, arms, opts, _run, _err)
        click.echo(search_report.text(sr))
        search_cli.write_search(p["out_dir"], sr, outcomes, _err)
        fail_if_nothing_succeeded(outcomes)
        return
    targets = {a.label: a.target for a in arms}
    rates = list(p["rates"])
    arm_prec = {a.label: a.precision for a in arms}
    if rates:
        outcomes, points = _run(sweep_rates(w, targets, rates, opts))
        # paired deltas at the highest rate every arm ran
        top = [o for o in outcomes if o.label.endswith(f"@{max(rates):g}")]
        deltas = [paired_delta(top[0].label, top[0].requests, o.label, o.requests,
                               top[0].energy_overall, o.energy_overall) for o in top[1:]]
    else:
        outcomes, deltas = _run(compare_arms(w, targets, opts))
        rate = requested_rate_rps(w, build_plan(w))
        points = [point(o.label, rate, o.summary, o.energy_overall) for o in outcomes]
    excluded = below_floor([(a.label, a.quality) for a in arms], p["min_quality"])
    pr = precision_report(points, list(targets), p["target_attainment"], slo_text(w.slo_classes),
                          quality, "offered requests/s, wall time", arm_prec, excluded)
    click.echo(report.run_table(outcomes, arm_prec if not rates else None, quality))
    for a in arms:
        if a.note:
            click.echo(f"{a.label}: {a.note}")
    click.echo()
    click.echo(report.delta_table(deltas))
    click.echo()
    click.echo(report.precision_table(pr))
    write_outputs(p["out_dir"], "compare", outcomes, deltas=deltas, arm_precisions=arm_prec,
                  quality=quality, precision=pr, title="wattgate loadgen compare")
    fail_if_nothing_succeeded(outcomes)


@loadgen.command()
@common
@click.option("--rates", callback=rate_list, required=True, help="Comma-separated rates (req/s).")
@click.option("--attainment", "target_attainment", type=SHARE, default=0.9, show_default=True)
@click.option("--precisions", default="", help="Sweep each precision through the gateway.")
@click.option("--arm-target", multiple=True, help="PRECISION=URL: send this arm to an engine.")
@click.option("--by-header", is_flag=True, help="Select precision by header, not model@prec.")
def sweep(**p: Any) -> None:
    """Step the rate: max goodput at a target attainment, min J/token that meets the SLO."""
    w = build_workload(p)
    rates = list(p["rates"])
    precisions = [x.strip() for x in p["precisions"].split(",") if x.strip()]
    arms = (search_cli.build_arms(p, w, precisions, parse_pairs(p["arm_target"],
                                                                 "--arm-target"), _run)
            if precisions else [])
    targets = ({a.label: a.target for a in arms} if arms
               else {"run": Target(p["target"], w.model, w.api)})
    for a in arms:
        if a.note:
            _err(f"{a.label}: {a.note}")
    check_reachable(t.base_url for t in targets.values())
    outcomes, points = _run(sweep_rates(w, targets, rates, run_options(p)))
    sw = sweep_result(points, p["target_attainment"])
    click.echo(report.sweep_table(sw))
    write_outputs(p["out_dir"], "sweep", outcomes, sweep=sw, title="wattgate loadgen sweep")
    if not any(m.result.ok for o in outcomes for m in o.requests):
        fail_if_nothing_succeeded(outcomes)


@loadgen.command()
@click.argument("scenario", type=click.Choice(["server", "offline"]))
@common
@click.option("--rates", callback=rate_list, default="", help="server: rates (default 0.5x..2x --rate).")
@click.option("--attainment", "target_attainment", type=SHARE, default=0.99, show_default=True)
def preset(scenario: str, **p: Any) -> None:
    """MLPerf-like scenarios. server: Poisson at increasing rates with the TTFT/TPOT limits,
    reports the highest rate that meets them (at --attainment, default 99%). offline: every
    request at t=0, reports throughput."""
    if scenario == "offline":
        p["concurrency"] = None
        w = build_workload(p)
        n = min(p["max_requests"], 1000)
        w = replace(w, arrival=arrivals.Offline(n), max_requests=n)
        check_reachable([p["target"]])
        o = _run(run_workload(w, Target(p["target"], w.model, w.api), run_options(p),
                              label="offline"))
        s = o.summary
        click.echo(f"offline: {s.ok}/{s.requests} ok in {s.duration_s:.2f} s: "
                   f"{s.throughput_rps:.2f} req/s, {s.output_tokens_per_s:.1f} output tokens/s")
        _print_outcome(o)
        write_outputs(p["out_dir"], "offline", [o])
        fail_if_nothing_succeeded([o])
        return
    rates = (list(p["rates"]) or
             [p["rate"] * f for f in (0.5, 0.75, 1.0, 1.5, 2.0)])
    w = build_workload({**p, "arrival": "poisson", "concurrency": None})
    check_reachable([p["target"]])
    outcomes, points = _run(sweep_rates(w, {"server": Target(p["target"], w.model, w.api)},
                                        rates, run_options(p)))
    sw = sweep_result(points, p["target_attainment"])
    click.echo(report.sweep_table(sw))
    best = sw.best_goodput.get("server")
    click.echo(f"server: highest rate meeting TTFT<={p['slo_ttft_ms']:g} ms and TPOT<="
               f"{p['slo_tpot_ms']:g} ms for {p['target_attainment']:.0%} of requests: "
               + (f"{best.rate_rps:g} req/s" if best else "none of the rates tried"))
    write_outputs(p["out_dir"], "server", outcomes, sweep=sw, title="wattgate loadgen server")
    if not any(m.result.ok for o in outcomes for m in o.requests):
        fail_if_nothing_succeeded(outcomes)


@loadgen.command("trace-sample")
@click.argument("fmt", type=click.Choice(list(traces.FORMATS)))
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--requests", "n", type=int, default=200, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def trace_sample(fmt: str, path: Path, n: int, seed: int) -> None:
    """Write a small synthetic trace in a public format (for trying trace replay)."""
    path.write_text(traces.sample_text(fmt, n, seed))
    _err(f"wrote {n} rows of {fmt} to {path}")


@loadgen.command("selftest-engine")
@click.option("--port", type=int, required=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--ttft-ms", type=float, default=0.0, show_default=True)
@click.option("--itl-ms", type=float, default=0.0, show_default=True)
@click.option("--tokenizer", default=None, metavar="NAME_OR_PATH",
              help="Report prompt tokens as this tokenizer counts them (default: words, as the "
              "simulated engine counts).")
def selftest_engine(port: int, host: str, ttft_ms: float, itl_ms: float,
                    tokenizer: str | None) -> None:
    """A minimal streaming endpoint with fixed timing, for measuring the load generator."""
    from loadgen.selftest_engine import EngineTiming, count_words, serve, token_counter

    try:
        count = token_counter(tokenizer) if tokenizer else count_words
    except TokenizerNotFound as exc:
        raise click.BadParameter(str(exc), param_hint="--tokenizer") from None
    serve(host, port, EngineTiming(ttft_ms / 1e3, itl_ms / 1e3), count)
