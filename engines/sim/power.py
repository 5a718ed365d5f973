"""Board power of a step: idle with a CUDA context plus dynamic power by what the step does.

Dynamic power per GPU = (TDP - idle) x activity, activity being a weighted share of the step
spent streaming HBM (memory-bound decode draws less) or computing on tensor cores
(compute-bound prefill runs near TDP), capped at 1 so that board power never exceeds TDP.
The weights are chosen so that H100/H200 decode lands in the 137-300 W measured range at
small batch and prefill near TDP (docs/simulator.md, "Calibration").
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.sim.catalog import Deployment
from engines.sim.perf import KernelProfile, StepCost

K_COMPUTE = 0.88  # tensor-core bound work
K_MEMORY = 0.42  # HBM-bound work
K_KV = 0.9  # paged-attention decode: HBM-bound but with softmax/dot work on the SMs
K_OVERHEAD = 0.06  # host gaps: clocks stay up, SMs mostly idle
K_SEQ = 0.45  # per-sequence sampling / logits kernels
K_COMM = 0.25  # NVLink all-reduce


@dataclass(frozen=True, slots=True)
class StepEnergy:
    """Power of one step split into static (idle) and dynamic parts, all GPUs together."""

    duration_s: float
    static_w: float
    dynamic_w: float
    seq_dynamic_j: tuple[float, ...]  # each sequence's dynamic joules; sums to dynamic_w * duration

    @property
    def power_w(self) -> float:
        return self.static_w + self.dynamic_w


def idle_power_w(d: Deployment) -> float:
    """Idle power of all the deployment's GPUs (CUDA context held, nothing running)."""
    return d.gpu.idle_w * d.tp


def _shares(values: tuple[float, ...], n: int) -> list[float]:
    total = sum(values)
    if total <= 0.0:
        return [1.0 / n] * n
    return [v / total for v in values]


def step_energy(d: Deployment, prof: KernelProfile, cost: StepCost) -> StepEnergy:
    """Static and dynamic power of a step and the causal split of its dynamic energy.

    Weight streaming is shared equally by the sequences in the batch, GEMM compute by each
    sequence's tokens, KV reads by its context length, attention by its attention FLOPs,
    host overhead equally, communication by tokens.
    """
    n = len(cost.seq_flops)
    span_w = (d.gpu.tdp_w - d.gpu.idle_w) * d.tp
    parts = (
        (K_COMPUTE * prof.power_factor * cost.gemm_s, _shares(cost.seq_flops, n)),
        (K_MEMORY * prof.power_factor * cost.weights_s, [1.0 / n] * n),
        (K_COMPUTE * cost.attn_s, _shares(cost.seq_attn_flops, n)),
        (K_KV * cost.kv_s, _shares(cost.seq_kv_bytes, n)),
        (K_OVERHEAD * cost.overhead_s, [1.0 / n] * n),
        (K_SEQ * cost.seq_overhead_s, [1.0 / n] * n),
        (K_COMM * cost.comm_s, _shares(cost.seq_flops, n)),
    )
    busy_s = sum(weight for weight, _ in parts)
    activity = busy_s / cost.duration_s if cost.duration_s > 0 else 0.0
    scale = 1.0 / activity if activity > 1.0 else 1.0
    seq_j = [0.0] * n
    for weight_s, shares in parts:
        part_j = span_w * weight_s * scale
        for i, share in enumerate(shares):
            seq_j[i] += part_j * share
    dynamic_j = sum(seq_j)
    dynamic_w = dynamic_j / cost.duration_s if cost.duration_s > 0 else 0.0
    return StepEnergy(cost.duration_s, idle_power_w(d), dynamic_w, tuple(seq_j))
