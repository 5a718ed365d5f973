"""One run: plan -> client (one process or several) -> summary -> energy. The shell around the
pure plan and summary functions."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from core.tasks import cancel_and_wait
from loadgen import energy, run_summary
from loadgen.client import ClientOptions, Target, run_plan
from loadgen.results import Progress, RequestResult
from loadgen.schedule import progress_reporter
from loadgen.workers import run_workers
from loadgen.workload import PlannedRequest, Workload, build_plan, requested_rate_rps


@dataclass(frozen=True, slots=True)
class RunOptions:
    workers: int = 1
    lag_threshold_s: float = run_summary.DEFAULT_LAG_THRESHOLD_S
    admin_key: str = ""
    fetch_energy: bool = True
    # "auto": the gateway's accounting when responses carry its request id, else a simulated
    # engine's ground truth; "gateway"; "sim".
    energy_source: str = "auto"
    # Simulated engines behind the gateway: their ground truth stands in when the gateway has
    # no accounting records (the demo's fleet).
    sim_engines: tuple[str, ...] = ()
    energy_wait_s: float = 5.0
    progress: bool = True
    client: ClientOptions = field(default_factory=ClientOptions)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    label: str
    target: Target
    summary: run_summary.Summary
    requests: list[run_summary.RequestMetrics]
    energy_fetch: energy.EnergyFetch | None
    energy_overall: energy.EnergyStats | None
    energy_by_tenant: tuple[energy.EnergyStats, ...]
    energy_by_precision: tuple[energy.EnergyStats, ...]
    prompt_note: str = ""  # what the prompt lengths count (tokens of a tokenizer, or words)

    @property
    def energy_note(self) -> str:
        f = self.energy_fetch
        if f is None:
            return "n/a: energy fetch disabled"
        if self.energy_overall is None:
            return f"n/a: {f.reason}"
        source = (f"gateway accounting, apportioned: {measured_vs_estimated(self.energy_overall)}"
                  if f.source == "gateway" else "simulator ground truth (no carbon or cost)")
        return source + (f"; {f.reason}" if f.reason else "")


def measured_vs_estimated(e: energy.EnergyStats) -> str:
    """How many of a group's records were read from an energy counter and how many the
    gateway estimated from a power model (its `estimated` flag, per record)."""
    n, est = e.requests, e.estimated
    if est == 0:
        return f"all {n} records measured (energy counters)"
    if est == n:
        return f"all {n} records ESTIMATED from a power model (no energy counter), none measured"
    return (f"{n - est} of {n} records measured (energy counters), {est} ESTIMATED from a "
            "power model")


def _stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


async def execute(plan: Sequence[PlannedRequest], target: Target, concurrency: int | None,
                  opts: RunOptions, write: Callable[[str], None] = _stderr
                  ) -> list[RequestResult]:
    """Send the plan from this process (with a live progress line) or from worker processes."""
    if opts.workers > 1:
        results, _ = await asyncio.to_thread(run_workers, plan, target, opts.workers,
                                             opts=opts.client, concurrency=concurrency)
        return results
    progress = Progress()
    # On a terminal the line redraws twice a second; in a log, one line every 5 s.
    tty = sys.stderr.isatty()
    reporter = (asyncio.get_running_loop().create_task(
        progress_reporter(progress, write if tty else lambda s: write(s.lstrip("\r") + "\n"),
                          0.5 if tty else 5.0)) if opts.progress else None)
    try:
        t0 = time.monotonic() + 0.05
        return await run_plan(plan, target, t0=t0, concurrency=concurrency, opts=opts.client,
                              progress=progress)
    finally:
        if reporter is not None:
            await cancel_and_wait(reporter)
            if tty:
                write("\n")


async def _energy(target: Target, results: Sequence[RequestResult], opts: RunOptions
                  ) -> energy.EnergyFetch:
    session = energy.admin_session()
    try:
        via_gateway = any(r.request_id for r in results)
        if opts.energy_source == "gateway" or (opts.energy_source == "auto" and via_gateway):
            fetch = await energy.fetch_energy(session, target.base_url, opts.admin_key, results,
                                              wait_final_s=opts.energy_wait_s)
            if fetch.rows or not opts.sim_engines:
                return fetch
            sim = await energy.fetch_sim_energy(session, opts.sim_engines, results,
                                                by_gateway_id=True)
            if not sim.rows:
                return fetch
            return replace(sim, reason="; ".join(x for x in (
                f"gateway accounting n/a ({fetch.reason})", sim.reason) if x))
        return await energy.fetch_sim_energy(session, [target.base_url], results)
    finally:
        await session.close()


async def run_workload(w: Workload, target: Target, opts: RunOptions, label: str = "",
                       plan: Sequence[PlannedRequest] | None = None,
                       write: Callable[[str], None] = _stderr) -> RunOutcome:
    plan = build_plan(w) if plan is None else plan
    if not target.request_id_prefix:
        target = replace(target, request_id_prefix=f"lg-{uuid.uuid4().hex[:12]}-")
    results = await execute(plan, target, w.concurrency, opts, write)
    summary, per_request = run_summary.summarize(
        results, w.slo, requested_rate_rps=requested_rate_rps(w, plan), label=label,
        lag_threshold_s=opts.lag_threshold_s, closed_loop=w.concurrency is not None)
    fetch = await _energy(target, results, opts) if opts.fetch_energy else None
    return RunOutcome(
        label=label, target=target, summary=summary, requests=per_request, energy_fetch=fetch,
        energy_overall=energy.overall_energy(fetch, results, label or "all") if fetch else None,
        energy_by_tenant=energy.group_energy(fetch, results, "tenant") if fetch else (),
        energy_by_precision=energy.group_energy(fetch, results, "precision") if fetch else (),
        prompt_note=w.prompts.note)


async def add_energy(o: RunOutcome, opts: RunOptions) -> RunOutcome:
    """`o` with its energy fetched now (runs made with fetch_energy off, so that a series of
    runs waits once for final records instead of once per run)."""
    results = [m.result for m in o.requests]
    fetch = await _energy(o.target, results, opts)
    return replace(o, energy_fetch=fetch,
                   energy_overall=energy.overall_energy(fetch, results, o.label or "all"),
                   energy_by_tenant=energy.group_energy(fetch, results, "tenant"),
                   energy_by_precision=energy.group_energy(fetch, results, "precision"))
