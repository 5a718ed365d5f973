"""Continuous batching on the pure core, driven by explicit (fake) engine-clock times."""

from __future__ import annotations

import dataclasses

import pytest

from engines.sim.catalog import (
    ACTIVATION_RESERVE_BYTES,
    GPU_MEMORY_UTILIZATION,
    GPUS,
    MODELS,
    PRECISIONS,
    Deployment,
    deployment,
)
from engines.sim.fixed import FixedTimingCore
from engines.sim.perf import kernel_profile
from engines.sim.scheduler import BatchingCore
from engines.sim.state import Emission, RequestTruth

PROF = kernel_profile("vllm", "bf16")


def small_kv_deployment(blocks: int) -> Deployment:
    """Llama-3.1-8B BF16 on an H100 shrunk so that the KV cache holds `blocks` blocks."""
    model, prec = MODELS["llama-3.1-8b"], PRECISIONS["bf16"]
    probe = Deployment(GPUS["h100"], model, prec, 1)
    block_bytes = model.kv_bytes_per_token() * 16
    mem = (probe.weight_bytes + ACTIVATION_RESERVE_BYTES + (blocks + 0.5) * block_bytes)
    gpu = dataclasses.replace(GPUS["h100"], memory_bytes=mem / GPU_MEMORY_UTILIZATION)
    d = Deployment(gpu, model, prec, 1)
    assert d.kv_blocks == blocks
    return d


def run_to_end(core: BatchingCore | FixedTimingCore) -> list[Emission]:
    out: list[Emission] = []
    while (wake := core.next_wakeup_s()) is not None:
        out += core.advance(wake)
    return out


def by_id(truths: list[RequestTruth]) -> dict[str, RequestTruth]:
    return {t.request_id: t for t in truths}


def test_each_request_gets_exactly_max_tokens_and_one_done() -> None:
    core = BatchingCore(deployment("h100", "llama-3.1-8b", "bf16"), PROF)
    for i, n in enumerate([1, 5, 17]):
        core.submit(f"r{i}", 10 + i, n, 0.0)
    emitted = run_to_end(core)
    for i, n in enumerate([1, 5, 17]):
        mine = [e for e in emitted if e.request_id == f"r{i}"]
        assert sum(e.tokens for e in mine) == n
        assert [e.done for e in mine].count(True) == 1 and mine[-1].done
        assert mine[0].first and not any(e.first for e in mine[1:])


def test_batch_limit_queues_the_rest_and_reports_waiting() -> None:
    core = BatchingCore(deployment("h100", "llama-3.1-8b", "bf16"), PROF, max_batch=4)
    for i in range(10):
        core.submit(f"r{i}", 8, 50, 0.0)
    core.advance(core.next_wakeup_s() or 0.0)
    running, waiting, kv = core.load()
    assert (running, waiting) == (4, 6)
    assert 0.0 < kv < 1.0
    run_to_end(core)
    truths = by_id(core.take_finished())
    assert len(truths) == 10
    # the queued requests start after the first four finish: later first tokens
    assert truths["r9"].first_token_s > truths["r0"].finished_s  # type: ignore[operator]


def test_long_prompt_is_chunked_by_the_token_budget() -> None:
    core = BatchingCore(deployment("h100", "llama-3.1-8b", "bf16"), PROF, token_budget=1000)
    core.submit("long", 3500, 2, 0.0)
    steps = 0
    first: list[Emission] = []
    while not first:
        wake = core.next_wakeup_s()
        assert wake is not None
        first = core.advance(wake)
        steps += 1
    assert steps == 4  # ceil(3500 / 1000) prefill chunks before the first token


def test_decode_keeps_running_beside_a_chunked_prefill() -> None:
    core = BatchingCore(deployment("h100", "llama-3.1-8b", "bf16"), PROF, token_budget=512)
    core.submit("short", 4, 100, 0.0)
    first_short = core.advance(core.next_wakeup_s() or 0.0)
    assert first_short and first_short[0].request_id == "short"
    now = core.now_s
    core.submit("long", 4000, 2, now)
    emitted = []
    for _ in range(4):
        emitted += core.advance(core.next_wakeup_s() or 0.0)
    assert sum(e.tokens for e in emitted if e.request_id == "short") == 4
    assert not [e for e in emitted if e.request_id == "long"]


def test_kv_exhaustion_preempts_the_newest_request_and_recomputes_it() -> None:
    d = small_kv_deployment(blocks=20)  # 320 tokens of KV
    core = BatchingCore(d, PROF)
    core.submit("old", 100, 100, 0.0)  # needs 13 blocks at the end
    core.submit("new", 100, 100, 0.0)
    emitted = run_to_end(core)
    truths = by_id(core.take_finished())
    assert truths["new"].preemptions >= 1
    assert truths["old"].preemptions == 0
    assert sum(e.tokens for e in emitted if e.request_id == "new") == 100
    assert truths["new"].prefill_energy_j > truths["old"].prefill_energy_j  # recompute cost
    assert core.free_blocks == core.total_blocks


def test_request_larger_than_the_kv_cache_is_refused() -> None:
    core = BatchingCore(small_kv_deployment(blocks=4), PROF)
    with pytest.raises(ValueError, match="KV cache"):
        core.submit("big", 60, 10, 0.0)


def test_cancel_stops_tokens_and_keeps_the_energy_already_used() -> None:
    core = BatchingCore(deployment("h100", "llama-3.1-8b", "bf16"), PROF)
    core.submit("a", 10, 1000, 0.0)
    core.submit("b", 10, 5, 0.0)
    for _ in range(3):
        core.advance(core.next_wakeup_s() or 0.0)
    core.cancel("a", core.now_s + 1e-4)
    emitted = run_to_end(core)
    truths = by_id(core.take_finished())
    assert truths["a"].status == "aborted" and truths["a"].energy_j > 0
    assert truths["a"].completion_tokens < 1000
    assert not [e for e in emitted if e.request_id == "a" and e.time_s > core.now_s]
    assert core.free_blocks == core.total_blocks


def test_engine_timing_matches_step_times_without_sleeping() -> None:
    core = BatchingCore(deployment("h100", "llama-3.1-8b", "bf16"), PROF)
    core.submit("a", 100, 11, 5.0)
    run_to_end(core)
    t = core.take_finished()[0]
    assert t.arrived_s == 5.0
    assert t.ttft_s is not None and 0.003 < t.ttft_s < 0.05
    assert t.tpot_s is not None and 0.005 < t.tpot_s < 0.01  # H100 8B BF16 batch-1 decode


def test_fixed_timing_gives_exact_ttft_and_inter_token_gaps() -> None:
    core = FixedTimingCore(deployment("h100", "llama-3.1-8b", "bf16"), PROF, ttft_s=0.2, itl_s=0.05)
    core.submit("a", 10, 4, 1.0)
    core.submit("b", 10, 2, 1.1)
    emitted = run_to_end(core)
    a_times = [e.time_s for e in emitted if e.request_id == "a"]
    assert a_times == pytest.approx([1.2, 1.25, 1.3, 1.35], abs=1e-12)
    b_times = [e.time_s for e in emitted if e.request_id == "b"]
    assert b_times == pytest.approx([1.3, 1.35], abs=1e-12)
    truth = by_id(core.take_finished())["a"]
    assert truth.ttft_s == pytest.approx(0.2) and truth.tpot_s == pytest.approx(0.05)
