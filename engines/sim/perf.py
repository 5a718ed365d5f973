"""Roofline step time of one continuous-batching forward pass.

A step runs the GEMMs of every scheduled token once (weights streamed from HBM once per
step, shared by the batch) and attention per sequence (its KV cache read once). Each part
takes the longer of its memory time and its compute time; a fixed per-step host overhead,
a per-sequence overhead (sampling, detokenisation) and the tensor-parallel all-reduces are
added. The kernel efficiency factors below are fitted so that the calibration targets in
docs/simulator.md hold; they are not measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engines.sim.catalog import Deployment

PREFILL = "prefill"
DECODE = "decode"

ALLREDUCE_LATENCY_S = 8e-6  # per all-reduce, NCCL ring on NVLink at small messages (~5-10 us)
ATTENTION_BW_EFF = 0.75  # paged-attention decode kernels reach ~70-80% of HBM bandwidth
ATTENTION_COMPUTE_EFF = 0.45  # flash-attention prefill, fraction of BF16 peak


@dataclass(frozen=True, slots=True)
class KernelProfile:
    """How well one engine's kernels run one precision (fitted, see module docstring)."""

    weight_bw_eff_small: float  # share of HBM bandwidth for weight streaming at 1 token/step
    weight_bw_eff_large: float  # ... at many tokens per step
    bw_half_tokens: float  # tokens per step where the weight-stream efficiency is halfway
    gemm_compute_eff: float  # share of the precision's tensor-core peak in big GEMMs
    step_overhead_s: float  # host-side scheduling, launch and sampling per step
    per_seq_overhead_s: float  # per sequence in the step (sampling, detokenise, output)
    power_factor: float  # multiplier on the GEMMs' dynamic power (dequant/quant work)

    def weight_bw_eff(self, tokens: int) -> float:
        frac = tokens / (tokens + self.bw_half_tokens)
        return self.weight_bw_eff_small + (self.weight_bw_eff_large - self.weight_bw_eff_small) * frac


_BASE = KernelProfile(0.85, 0.85, 16.0, 0.62, 1.6e-3, 50e-6, 1.0)

# vLLM: FP8 (CUTLASS scaled-mm with dynamic per-token activation quantisation) streams
# weights poorly at small batch and burns extra power quantising activations, which is why
# ML.ENERGY v3 measured FP8 +30% energy at batch 8-16 but -11% at batch 65-256.
# AWQ W4A16 dequantises in the GEMM: good at batch 1, compute-poor at large batch.
VLLM_PROFILES: dict[str, KernelProfile] = {
    "bf16": _BASE,
    "fp16": _BASE,
    "fp8": KernelProfile(0.36, 0.92, 96.0, 0.55, 1.9e-3, 50e-6, 1.45),
    "int8": KernelProfile(0.55, 0.85, 32.0, 0.55, 1.8e-3, 50e-6, 1.15),
    "int4": KernelProfile(0.70, 0.60, 16.0, 0.30, 1.7e-3, 50e-6, 1.10),
}

# TensorRT-LLM: lower host overhead, tuned FP8/INT8/INT4 kernels (Model Optimizer reports
# FP8 1.26-1.91x and INT4 AWQ 1.11-2.70x over FP16 on H100).
_TRT_BASE = KernelProfile(0.88, 0.88, 16.0, 0.68, 1.0e-3, 15e-6, 1.0)
TRTLLM_PROFILES: dict[str, KernelProfile] = {
    "bf16": _TRT_BASE,
    "fp16": _TRT_BASE,
    "fp8": KernelProfile(0.86, 0.90, 16.0, 0.75, 1.0e-3, 15e-6, 1.05),
    "int8": KernelProfile(0.80, 0.88, 16.0, 0.60, 1.1e-3, 15e-6, 1.05),
    "int4": KernelProfile(0.80, 0.70, 16.0, 0.40, 1.1e-3, 15e-6, 1.05),
}

PROFILES: dict[str, dict[str, KernelProfile]] = {"vllm": VLLM_PROFILES, "trtllm": TRTLLM_PROFILES}


def kernel_profile(dialect: str, precision: str) -> KernelProfile:
    return PROFILES[dialect][precision]


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One sequence's share of a step: `new_tokens` computed on top of `context` tokens."""

    new_tokens: int
    context: int
    phase: str  # PREFILL (prompt chunk) or DECODE (one generated token)


@dataclass(frozen=True, slots=True)
class StepCost:
    """Time of one step and its parts (seconds); work per sequence for energy sharing."""

    duration_s: float
    weights_s: float  # weight streaming (memory)
    gemm_s: float  # GEMM compute
    kv_s: float  # KV-cache reads (memory)
    attn_s: float  # attention compute
    overhead_s: float  # host-side, per step
    seq_overhead_s: float  # per-sequence sampling and output kernels
    comm_s: float
    tokens: int
    seq_flops: tuple[float, ...]  # GEMM FLOPs per sequence
    seq_attn_flops: tuple[float, ...]
    seq_kv_bytes: tuple[float, ...]


def attention_flops(d: Deployment, w: SeqWork) -> float:
    """QK^T and AV FLOPs of `new_tokens` queries over a causal context (all layers)."""
    m = d.model
    keys = w.context + (w.new_tokens + 1) / 2.0
    return 4.0 * m.layers * m.heads * m.head_dim * w.new_tokens * keys


def step_cost(d: Deployment, prof: KernelProfile, work: Sequence[SeqWork]) -> StepCost:
    """Roofline time of one forward pass over `work` on deployment `d` (all TP ranks)."""
    gpu, tp = d.gpu, d.tp
    tokens = sum(w.new_tokens for w in work)
    kv_per_token = d.model.kv_bytes_per_token()
    seq_flops = tuple(2.0 * d.model.matmul_params * w.new_tokens for w in work)
    seq_attn = tuple(attention_flops(d, w) for w in work)
    seq_kv = tuple(kv_per_token * (w.context + w.new_tokens) for w in work)
    weights_s = d.weight_bytes_read_per_step / (gpu.hbm_bytes_per_s * prof.weight_bw_eff(tokens) * tp)
    gemm_s = sum(seq_flops) / (d.peak_flops * prof.gemm_compute_eff * tp)
    kv_s = sum(seq_kv) / (gpu.hbm_bytes_per_s * ATTENTION_BW_EFF * tp)
    attn_s = sum(seq_attn) / (gpu.bf16_flops * ATTENTION_COMPUTE_EFF * tp)
    overhead_s = prof.step_overhead_s
    seq_overhead_s = prof.per_seq_overhead_s * len(work)
    comm_s = 0.0
    if tp > 1:
        # Two all-reduces per layer of tokens x hidden 16-bit activations (ring: 2(tp-1)/tp).
        msg_bytes = tokens * d.model.hidden * 2.0
        per_call = ALLREDUCE_LATENCY_S + msg_bytes * 2.0 * (tp - 1) / tp / gpu.link_bytes_per_s
        comm_s = 2 * d.model.layers * per_call
    duration_s = max(weights_s, gemm_s) + max(kv_s, attn_s) + overhead_s + seq_overhead_s + comm_s
    return StepCost(duration_s, weights_s, gemm_s, kv_s, attn_s, overhead_s, seq_overhead_s,
                    comm_s, tokens,
                    seq_flops, seq_attn, seq_kv)
