"""A step's energy as a function of which of its sequences run in it (the cooperative game
whose Shapley value is the simulator's ground truth).

The step of a coalition S of the batch's sequences is the step that would run them alone,
each with the same new tokens and context: its energy depends only on four sums over S,
its size n, its new tokens T, its attention time A and its KV-read time K (seconds at the
kernels' efficiencies), so the cost model of perf.py and power.py is rewritten here over
those sums (a test holds the two to the same joules for the whole batch):

    weights(T) = weight bytes / (HBM bandwidth x eff(T) x tp)       gemm(T) = g x T
    duration   = max(weights, gemm) + max(K, A) + overhead + p x n + comm(T)
    busy       = k_c pf gemm + k_m pf weights + k_c A + k_kv K + k_o overhead + k_s p n
                 + k_comm comm(T)
    energy     = static_w x duration + span_w x min(busy, duration)

and the empty coalition costs nothing (no step runs; the idle account keeps that time).
Every function here takes floats or numpy arrays alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.sim.catalog import Deployment
from engines.sim.perf import (
    ALLREDUCE_LATENCY_S,
    ATTENTION_BW_EFF,
    ATTENTION_COMPUTE_EFF,
    KernelProfile,
    SeqWork,
    attention_flops,
)
from engines.sim.power import (
    K_COMM,
    K_COMPUTE,
    K_KV,
    K_MEMORY,
    K_OVERHEAD,
    K_SEQ,
    idle_power_w,
)


@dataclass(frozen=True, slots=True)
class Players:
    """Each sequence's own terms: new tokens, attention seconds and KV-read seconds."""

    tokens: Any  # numpy float arrays, one entry per sequence
    attn_s: Any
    kv_s: Any

    @property
    def n(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, slots=True)
class Regime:
    """Which side of each max/min a coalition is on."""

    compute_bound: bool  # GEMM time over weight streaming
    attn_bound: bool  # attention compute over KV reads
    capped: bool  # dynamic power at the board's limit (busy >= duration)


@dataclass(frozen=True, slots=True)
class StepGame:
    """The constants of one deployment's step energy (see module docstring)."""

    static_w: float
    span_w: float
    weight_s: float  # weight bytes / (bandwidth x tp): divided by eff(T)
    eff_small: float
    eff_large: float
    eff_half_tokens: float
    gemm_s_per_token: float
    overhead_s: float
    seq_overhead_s: float
    comm0_s: float
    comm_s_per_token: float
    power_factor: float
    attn_s_per_flop: float
    kv_s_per_byte: float
    kv_bytes_per_token: float
    deployment: Deployment

    @classmethod
    def of(cls, d: Deployment, prof: KernelProfile) -> StepGame:
        gpu, tp = d.gpu, d.tp
        comm0 = comm1 = 0.0
        if tp > 1:
            layers2 = 2 * d.model.layers
            comm0 = layers2 * ALLREDUCE_LATENCY_S
            comm1 = layers2 * d.model.hidden * 2.0 * 2.0 * (tp - 1) / tp / gpu.link_bytes_per_s
        return cls(
            static_w=idle_power_w(d), span_w=(gpu.tdp_w - gpu.idle_w) * tp,
            weight_s=d.weight_bytes_read_per_step / (gpu.hbm_bytes_per_s * tp),
            eff_small=prof.weight_bw_eff_small, eff_large=prof.weight_bw_eff_large,
            eff_half_tokens=prof.bw_half_tokens,
            gemm_s_per_token=2.0 * d.model.matmul_params / (d.peak_flops * prof.gemm_compute_eff * tp),
            overhead_s=prof.step_overhead_s, seq_overhead_s=prof.per_seq_overhead_s,
            comm0_s=comm0, comm_s_per_token=comm1, power_factor=prof.power_factor,
            attn_s_per_flop=1.0 / (gpu.bf16_flops * ATTENTION_COMPUTE_EFF * tp),
            kv_s_per_byte=1.0 / (gpu.hbm_bytes_per_s * ATTENTION_BW_EFF * tp),
            kv_bytes_per_token=d.model.kv_bytes_per_token(), deployment=d)

    def players(self, work: Sequence[SeqWork]) -> Players:
        d = self.deployment
        tokens = np.array([w.new_tokens for w in work], dtype=np.float64)
        attn = np.array([attention_flops(d, w) for w in work], dtype=np.float64)
        kv = np.array([self.kv_bytes_per_token * (w.context + w.new_tokens) for w in work],
                      dtype=np.float64)
        return Players(tokens, attn * self.attn_s_per_flop, kv * self.kv_s_per_byte)

    def weights_s(self, tokens: Any) -> Any:
        frac = tokens / (tokens + self.eff_half_tokens)
        return self.weight_s / (self.eff_small + (self.eff_large - self.eff_small) * frac)

    def parts(self, n: Any, tokens: Any, attn_s: Any, kv_s: Any) -> tuple[Any, Any]:
        """(duration_s, busy_s) of the coalition with these sums (n >= 1)."""
        weights = self.weights_s(tokens)
        gemm = self.gemm_s_per_token * tokens
        comm = self.comm0_s + self.comm_s_per_token * tokens
        seq = self.seq_overhead_s * n
        duration = (np.maximum(weights, gemm) + np.maximum(kv_s, attn_s) + self.overhead_s
                    + seq + comm)
        pf = self.power_factor
        busy = (K_COMPUTE * pf * gemm + K_MEMORY * pf * weights + K_COMPUTE * attn_s
                + K_KV * kv_s + K_OVERHEAD * self.overhead_s + K_SEQ * seq + K_COMM * comm)
        return duration, busy

    def energy_j(self, n: Any, tokens: Any, attn_s: Any, kv_s: Any) -> Any:
        """Joules of the coalition's step; 0 for the empty coalition (n == 0)."""
        duration, busy = self.parts(n, tokens, attn_s, kv_s)
        joules = self.static_w * duration + self.span_w * np.minimum(busy, duration)
        return np.where(np.asarray(n) > 0, joules, 0.0)

    def regime(self, n: float, tokens: float, attn_s: float, kv_s: float) -> Regime:
        duration, busy = self.parts(n, tokens, attn_s, kv_s)
        return Regime(bool(self.gemm_s_per_token * tokens >= self.weights_s(tokens)),
                      bool(attn_s > kv_s), bool(busy >= duration))

    def slopes(self, r: Regime) -> tuple[float, float, float, float, float]:
        """Within regime `r`: joules per token, per attention second, per KV second and per
        sequence, and the coefficient of weights(T) (the one term not linear in the sums)."""
        full = self.static_w + (self.span_w if r.capped else 0.0)  # per second of duration
        busy_w = 0.0 if r.capped else self.span_w  # per second of busy time
        pf = self.power_factor
        cb, ab = float(r.compute_bound), float(r.attn_bound)
        g, c1, p = self.gemm_s_per_token, self.comm_s_per_token, self.seq_overhead_s
        per_token = full * (cb * g + c1) + busy_w * (K_COMPUTE * pf * g + K_COMM * c1)
        per_attn = full * ab + busy_w * K_COMPUTE
        per_kv = full * (1.0 - ab) + busy_w * K_KV
        per_seq = full * p + busy_w * K_SEQ * p
        per_weights = full * (1.0 - cb) + busy_w * K_MEMORY * pf
        return per_token, per_attn, per_kv, per_seq, per_weights
