"""The simulator's exact steps billed by the gateway's apportioner, beside their Shapley truth.

A `BatchingCore` (engines/sim/scheduler.py) runs a workload on a virtual clock; every step's
time, work and Shapley split is kept. The steps become the work rows the gateway would build
with perfect timing (each step's prompt chunk or decoded token in the intervals it spans, a
prefill's attention as `work.prefill_attention` counts it, residency from a request's first
step to its last) and the intervals' energy is what the simulator's counter read. What is
left between a bill and the truth is then the coefficients and the rule, not timing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from accounting.apportion import apportion_by
from accounting.coefficients import Coefficients
from accounting.work import PREFILL_ATTENTION_PER_KV, Work
from engines.sim.catalog import deployment
from engines.sim.perf import DECODE, SeqWork, kernel_profile
from engines.sim.scheduler import BatchingCore, _Step
from engines.sim.shapley import shapley


@dataclass
class Steps:
    """(start, end, [(request id, its work)], Shapley shares, power) per step."""

    idle_w: float
    steps: list[tuple[float, float, list[tuple[str, SeqWork]], list[float], float]] = field(
        default_factory=list)


def run_core(kind: str, precision: str, submits: list[tuple[str, int, int, float]],
             until_s: float) -> Steps:
    """Run `submits` (request id, prompt tokens, max tokens, at s) to `until_s`."""
    core = BatchingCore(deployment("h100", "llama-3.1-8b", precision, 1),
                        kernel_profile(kind, precision))
    out = Steps(core.idle_w)
    finish = core._finish_step

    def keep(step: _Step) -> None:
        e = step.energy
        split = shapley(core.game, core.game.players(step.work),
                        e.static_w * e.duration_s + math.fsum(e.seq_dynamic_j), core.rng)
        out.steps.append((step.start_s, step.end_s,
                          [(r.request_id, w) for (r, _), w in zip(step.seqs, step.work,
                                                                  strict=True)],
                          split.shares_j, e.power_w))
        finish(step)

    core._finish_step = keep  # type: ignore[method-assign]
    for rid, prompt, max_tokens, at_s in sorted(submits, key=lambda s: s[3]):
        core.submit(rid, prompt, max_tokens, at_s)
    core.advance(until_s)
    return out


def _pieces(t0: float, t1: float, dt: float) -> list[tuple[int, float, float]]:
    """(interval, from, to) of [t0, t1] on the grid."""
    out = []
    a = t0
    while a < t1:
        k = math.floor(a / dt)
        b = min(t1, (k + 1) * dt)
        out.append((k, a, b))
        a = b
    return out


def bills(run: Steps, c: Coefficients, dt: float = 1.0
          ) -> tuple[dict[str, float], dict[str, float], float]:
    """(bill, Shapley truth) per request, and shares + idle - metered over all intervals."""
    energy: dict[int, float] = defaultdict(float)
    work: dict[int, dict[str, list[float]]] = defaultdict(dict)
    span: dict[str, tuple[float, float]] = {}
    truth: dict[str, float] = defaultdict(float)
    last = 0.0
    for s0, s1, seqs, shares, power_w in run.steps:
        for k, a, b in _pieces(last, s0, dt):  # nothing running: idle power
            energy[k] += run.idle_w * (b - a)
        for k, a, b in _pieces(s0, s1, dt):
            energy[k] += power_w * (b - a)
        for (rid, w), share in zip(seqs, shares, strict=True):
            truth[rid] += share
            lo, hi = span.get(rid, (s0, s1))
            span[rid] = (min(lo, s0), max(hi, s1))
            for k, a, b in _pieces(s0, s1, dt):
                f = (b - a) / (s1 - s0)
                row = work[k].setdefault(rid, [0.0, 0.0, 0.0])
                if w.phase == DECODE:
                    row[1] += f
                    row[2] += f * (w.context + 1)
                else:
                    row[0] += f * w.new_tokens
                    row[2] += f * PREFILL_ATTENTION_PER_KV * w.new_tokens * (
                        w.context + w.new_tokens / 2.0)
        last = max(last, s1)
    billed: dict[str, float] = defaultdict(float)
    residual = 0.0
    for k in sorted(energy):
        rows: list[Work] = []
        for rid, (lo, hi) in span.items():
            a, b = max(lo, k * dt), min(hi, (k + 1) * dt)
            if b > a:
                p, d, kv = work[k].get(rid, [0.0, 0.0, 0.0])
                rows.append((rid, k, p, d, b - a, a - k * dt, kv, 0.0, 0.0))
        ap = apportion_by(energy[k], dt, run.idle_w, rows, c)
        for sh in ap.shares:
            billed[sh.request_id] += sh.energy_j
        residual += math.fsum(ap.columns.energy_j) + ap.idle_j - energy[k]
    return dict(billed), dict(truth), residual
