"""Catalog validation and the roofline step-time model of the simulated engine."""

from __future__ import annotations

import pytest

from engines.sim.catalog import GPUS, MODELS, CatalogError, deployment
from engines.sim.perf import DECODE, PREFILL, SeqWork, kernel_profile, step_cost


def test_fp8_on_a100_is_rejected_with_a_clear_error() -> None:
    with pytest.raises(CatalogError, match="no FP8"):
        deployment("a100", "llama-3.1-8b", "fp8")


def test_70b_bf16_does_not_fit_on_one_h100_but_fits_at_tp4() -> None:
    with pytest.raises(CatalogError, match="does not fit"):
        deployment("h100", "llama-3.1-70b", "bf16", tp=1)
    d = deployment("h100", "llama-3.1-70b", "bf16", tp=4)
    assert d.kv_tokens > 100_000


def test_unknown_names_and_bad_tp_list_the_allowed_values() -> None:
    with pytest.raises(CatalogError, match="known: a100, b200, h100, h200, l40s"):
        deployment("v100", "llama-3.1-8b", "bf16")
    with pytest.raises(CatalogError, match="allowed"):
        deployment("h100", "llama-3.1-8b", "bf16", tp=3)


def test_weight_bytes_follow_precision() -> None:
    bf16 = deployment("h100", "llama-3.1-8b", "bf16").weight_bytes
    fp8 = deployment("h100", "llama-3.1-8b", "fp8").weight_bytes
    int4 = deployment("h100", "llama-3.1-8b", "int4").weight_bytes
    assert 15e9 < bf16 < 17e9  # 8.03 B params x 2 bytes
    assert 0.5 < fp8 / bf16 < 0.6  # embeddings and lm_head stay 16-bit
    assert int4 < 0.4 * bf16


def test_catalogued_models_have_consistent_shapes() -> None:
    for m in MODELS.values():
        assert m.hidden % m.heads == 0 and m.heads % m.kv_heads == 0
        assert m.head_dim == 128
    for g in GPUS.values():
        assert 60.0 <= g.idle_w <= 120.0 and g.tdp_w > g.idle_w


def test_batch1_decode_is_memory_bound_near_weight_bytes_over_bandwidth() -> None:
    d = deployment("h100", "llama-3.1-8b", "bf16")
    cost = step_cost(d, kernel_profile("vllm", "bf16"), [SeqWork(1, 100, DECODE)])
    ideal_s = d.weight_bytes_read_per_step / d.gpu.hbm_bytes_per_s
    assert cost.weights_s > cost.gemm_s
    assert ideal_s < cost.duration_s < 1.6 * ideal_s


def test_large_prefill_is_compute_bound_at_two_flops_per_param_per_token() -> None:
    d = deployment("h100", "llama-3.1-8b", "bf16")
    cost = step_cost(d, kernel_profile("vllm", "bf16"), [SeqWork(4096, 0, PREFILL)])
    ideal_s = 2 * d.model.matmul_params * 4096 / d.gpu.bf16_flops
    assert cost.gemm_s > cost.weights_s
    assert ideal_s < cost.duration_s < 3 * ideal_s


def test_int4_decode_step_is_faster_than_bf16_at_batch1() -> None:
    work = [SeqWork(1, 512, DECODE)]
    bf16 = step_cost(deployment("h100", "llama-3.1-8b", "bf16"), kernel_profile("vllm", "bf16"), work)
    int4 = step_cost(deployment("h100", "llama-3.1-8b", "int4"), kernel_profile("vllm", "int4"), work)
    assert int4.duration_s < 0.75 * bf16.duration_s


def test_decode_step_time_grows_with_context_through_kv_reads() -> None:
    d = deployment("h100", "llama-3.1-8b", "bf16")
    prof = kernel_profile("vllm", "bf16")
    short = step_cost(d, prof, [SeqWork(1, 100, DECODE)] * 32)
    long = step_cost(d, prof, [SeqWork(1, 8000, DECODE)] * 32)
    assert long.kv_s > 50 * short.kv_s
    assert long.duration_s > short.duration_s


def test_tensor_parallelism_splits_work_but_adds_communication() -> None:
    prof = kernel_profile("vllm", "bf16")
    work = [SeqWork(1, 1000, DECODE)] * 16
    tp4 = step_cost(deployment("h100", "llama-3.1-70b", "bf16", tp=4), prof, work)
    tp8 = step_cost(deployment("h100", "llama-3.1-70b", "bf16", tp=8), prof, work)
    assert tp4.comm_s > 0
    assert tp8.weights_s < tp4.weights_s
    assert tp8.duration_s < tp4.duration_s
