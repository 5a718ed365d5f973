"""The routing benchmark's trace arm: an Azure-format trace written by loadgen.traces reads
back as written, and the benchmark's replay offers exactly rate x duration requests with the
Poisson arm's mean lengths."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

from bench.routing import DEFAULT, OUTPUT_TOKENS, PROMPT_TOKENS, trace_workload
from loadgen import traces
from loadgen.workload import build_plan, load_workload


def test_azure_text_reads_back_as_the_rows_it_wrote() -> None:
    rows = traces.synthetic_rows(300, 3, rate_rps=4.0, burstiness=0.2, median_in=90,
                                 median_out=60)
    back = traces.parse_azure(traces.azure_text(rows))
    t0 = rows[0].offset_s
    assert [(r.prompt_tokens, r.output_tokens) for r in back] == \
        [(r.prompt_tokens, r.output_tokens) for r in rows]
    assert all(abs(b.offset_s - (r.offset_s - t0)) < 2e-6 for b, r in zip(back, rows, strict=True))
    gaps = [b.offset_s - a.offset_s for a, b in itertools.pairwise(back)]
    # gamma shape 0.2: far burstier than Poisson (CV 1)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) > 1.5


def test_trace_replay_offers_rate_times_duration_with_the_poisson_arms_mean_lengths(
        tmp_path: Path) -> None:
    wl = load_workload(trace_workload(tmp_path, 20.0, DEFAULT, seed=7, slo_scale=10.0))
    plan = build_plan(wl)
    n = round(20.0 * DEFAULT.duration_s)
    assert len(plan) == n
    assert max(p.intended_s for p in plan) <= DEFAULT.duration_s + 1e-6
    assert abs(statistics.mean(p.prompt_tokens for p in plan) - PROMPT_TOKENS) < 0.2 * PROMPT_TOKENS
    assert abs(statistics.mean(p.max_tokens for p in plan) - OUTPUT_TOKENS) < 0.2 * OUTPUT_TOKENS
    # the same seed writes the same schedule (one per policy)
    again = build_plan(load_workload(trace_workload(tmp_path, 20.0, DEFAULT, 7, 10.0)))
    assert [(p.intended_s, p.max_tokens) for p in again] == \
        [(p.intended_s, p.max_tokens) for p in plan]
