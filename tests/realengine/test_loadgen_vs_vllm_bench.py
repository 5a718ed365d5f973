"""`wattgate loadgen run` and `vllm bench serve`, side by side on one engine, agree within 5%.

A small version of bench/loadgen_vs_vllm.py: one fixed-timing simulated engine, the same
seeded Poisson workload and prompts for both clients, one run each. vLLM's bench needs no hub:
its tokenizer is the local tiny model's.

The engine's fixed TTFT is 200 ms. Each client adds its own transport time to every TTFT, and
the two stacks differ by 2-7 ms on a small, shared machine (vLLM's aiohttp + asyncio client is
the slower one; see docs/loadgen.md). Against a 50 ms TTFT that gap alone is 4-14%, so it would
grade the clients' HTTP stacks, not whether they measure the same thing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.loadgen_vs_vllm import (
    METRICS,
    TOLERANCE,
    Spec,
    plan_prompts,
    ratios,
    run_loadgen,
    run_vllm,
    sim_engine,
    within,
    write_sharegpt,
)

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(180)]

FIXED_TTFT_MS = 200.0
FIXED_ITL_MS = 20.0
SPEC = Spec(requests=40, rate_rps=8.0, seed=3, prompt_tokens=64, output_tokens=16)


def test_loadgen_and_vllm_bench_medians_agree_within_5_percent(
        tiny_model: Path, tmp_path: Path) -> None:
    """TTFT, TPOT and E2E medians of loadgen (from send) are within 5% of vLLM's."""
    dataset = tmp_path / "prompts.json"
    write_sharegpt(plan_prompts(SPEC), dataset)
    with sim_engine((FIXED_TTFT_MS, FIXED_ITL_MS), tmp_path / "sim.log") as url:
        theirs = run_vllm(url, SPEC, dataset, tmp_path, "t", tiny_model, timeout_s=150)
        ours = run_loadgen(url, SPEC, tmp_path, "t", timeout_s=60)
    assert (ours.ok, theirs.ok) == (SPEC.requests, SPEC.requests)
    # Both see the engine's timing, so neither number is a stray constant.
    assert FIXED_TTFT_MS <= ours.ttft_ms < FIXED_TTFT_MS * 1.2
    assert FIXED_ITL_MS * 0.9 < ours.tpot_ms < FIXED_ITL_MS * 1.1
    ratio = ratios(ours, theirs)
    report = ", ".join(f"{m}: loadgen {getattr(ours, f'{m}_ms'):.2f} ms / vLLM "
                       f"{getattr(theirs, f'{m}_ms'):.2f} ms = {ratio[m]:.4f}" for m in METRICS)
    assert all(within(ratio[m], TOLERANCE) for m in METRICS), report
