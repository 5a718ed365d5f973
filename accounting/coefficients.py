"""Work coefficients per engine/precision, and an online non-negative least-squares fit.

An interval's dynamic energy is shared by each request's work
    alpha * prefill_tokens + beta * decode_tokens + gamma * kv_tokens
    + its part of delta(tokens per step) * decode_steps
where kv_tokens counts, per decoded token, the context it attends over, and the last term is
the weight streaming of each decode step, shared equally by the sequences in the batch
(decode_steps ~ the most tokens any request decoded in the interval; see apportion.py). Only
ratios within an interval matter.
Defaults are derived from the public constants of the engine profile the simulator models
(vLLM serving Llama-3.1-8B on one H100; docs/simulator.md, "Calibration"): idle 75 W,
TDP 700 W, HBM 3.35 TB/s, tensor-core peaks, the fitted kernel efficiencies and the power
weights of each kind of work. Per precision:
- alpha, a prompt token: its GEMM FLOPs at the precision's tensor-core rate (FP8 and INT8
  halve the time; prefill-bound FP8/INT8 steps run at TDP, so the board's power cap, not the
  extra power of quantising activations, sets their energy per token). The GEMMs only: the
  prompt's attention, which grows with its context, is work of its own (work.py,
  `PREFILL_ATTENTION_PER_KV`); an alpha that also held attention at some context (a
  difference of two prompt lengths) counted it twice;
- beta, a decoded token: the same GEMM FLOPs plus the per-sequence sampling kernels;
- gamma, one context token read by one decoded token: the KV bytes (always 16-bit) over
  HBM, plus its attention FLOPs;
- step_s, the seconds of a step's fixed part: its weights streamed at many tokens per step
  plus the host overhead;
- delta, one decode step's weight streaming and host gaps at many tokens per step, and
  delta_1 at one token per step: vLLM's FP8 and INT8 kernels stream weights poorly at small
  batch (ML.ENERGY v3: FP8 +30 % energy at batch 8-16, -11 % at 65-256), AWQ INT4 the other
  way round; halfway at 1 + delta_half_tokens tokens per step.
They are exact for that profile up to the time a step spends on each kind of work; switch
the online fit on for other models and GPUs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Coefficients:
    alpha: float  # one prefill token
    beta: float  # one decode token (per-sequence work of a step)
    gamma: float = 0.0  # one context token read by one decoded token (KV reads)
    delta: float = 0.0  # one decode step (weights streamed once, shared by the batch)
    delta_1: float | None = None  # one step at one token per step (None: delta throughout)
    delta_half_tokens: float = 0.0  # tokens per step (beyond one) halfway from delta_1 to delta
    # Seconds of one step's fixed part (weights streamed once, host work) at many tokens per
    # step, scaled by delta(T) / delta like the step's joules: the static power over it is
    # shared by the sequences in the step, the rest of the static power by work (0: all of
    # it by residency, the rule before the Shapley split; see apportion.py).
    step_s: float = 0.0


DEFAULTS: dict[str, Coefficients] = {
    "bf16": Coefficients(0.0135, 0.0275, 3.0e-5, 1.444, step_s=6.87e-3),
    "fp16": Coefficients(0.0135, 0.0275, 3.0e-5, 1.444, step_s=6.87e-3),
    "fp8": Coefficients(0.0086, 0.0250, 3.0e-5, 1.07, 2.566, 38.0, 4.51e-3),
    "int8": Coefficients(0.0086, 0.0228, 3.0e-5, 0.92, 1.362, 21.4, 4.62e-3),
    "int4": Coefficients(0.0306, 0.0447, 3.0e-5, 0.735, 0.644, 18.8, 4.03e-3),
}
# TensorRT-LLM (trtllm-serve) on the same GPU and model: its kernels stream weights well at
# small batch (no FP8/INT8 penalty at one token per step) and its host gaps are shorter, so a
# decode step costs about a third of vLLM FP8's at batch 1. Derived the same way, from the
# simulator's TensorRT-LLM kernel profiles (engines/sim/perf.py): with vLLM's FP8 values a
# trtllm FP8 engine billed decoders 25 % too much beside long prefills, and prompts 24 % too
# little. Their alphas once held the attention of a 2k-4k-token prompt as well (+16 to +36 %):
# with the simulator's exact steps a 4,000-token prompt beside 24 decoders was billed +10 %
# (BF16) and +26 % (FP8) over its Shapley share.
TRTLLM_DEFAULTS: dict[str, Coefficients] = {
    "bf16": Coefficients(0.0123, 0.0165, 3.0e-5, 1.374, step_s=6.09e-3),
    "fp16": Coefficients(0.0123, 0.0165, 3.0e-5, 1.374, step_s=6.09e-3),
    "fp8": Coefficients(0.0058, 0.0100, 3.0e-5, 0.781, 0.804, 16.0, 3.66e-3),
    "int8": Coefficients(0.0073, 0.0115, 3.0e-5, 0.812, 0.862, 16.0, 3.82e-3),
    "int4": Coefficients(0.0219, 0.0263, 3.0e-5, 0.569, 0.526, 16.0, 3.09e-3),
}
FALLBACK = DEFAULTS["bf16"]


def default_for(precision: str, kind: str = "vllm") -> Coefficients:
    """The default coefficients of an engine kind (vllm, trtllm; others: vLLM's) and
    precision."""
    table = TRTLLM_DEFAULTS if kind == "trtllm" else DEFAULTS
    return table.get(precision, FALLBACK)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def nnls(x: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Exact non-negative least squares for a few columns: min |Xw - y|, w >= 0.

    Tries every subset of free columns (2^n least-squares solves); fine for n <= 6.
    """
    n = len(x[0]) if x else 0
    best = [0.0] * n
    best_err = math.fsum(v * v for v in y)
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            ata = [[math.fsum(row[i] * row[j] for row in x) for j in cols] for i in cols]
            aty = [math.fsum(row[i] * v for row, v in zip(x, y, strict=True)) for i in cols]
            sol = _solve(ata, aty)
            if sol is None or any(s < 0.0 for s in sol):
                continue
            w = [0.0] * n
            for c, s in zip(cols, sol, strict=True):
                w[c] = s
            err = math.fsum((math.fsum(wi * xi for wi, xi in zip(w, row, strict=True)) - v) ** 2
                            for row, v in zip(x, y, strict=True))
            if err < best_err - 1e-12 * max(1.0, best_err):
                best, best_err = w, err
    return best


@dataclass(frozen=True, slots=True)
class Fit:
    idle_power_w: float
    coefficients: Coefficients  # joules per unit of each kind of work
    samples: int


def fit_intervals(samples: Sequence[tuple[float, ...]], min_samples: int = 30) -> Fit | None:
    """Fit dE = idle_w * dt + a * prefill + b * decode + c * kv + d * steps (all >= 0).

    samples: (energy_j, interval_s, prefill, decode, kv, steps) of intervals with work.
    None when there are too few samples or no decode work was explained.
    """
    if len(samples) < min_samples:
        return None
    x = [list(s[1:6]) for s in samples]
    y = [s[0] for s in samples]
    w = nnls(x, y)
    if w[2] <= 0.0 and w[4] <= 0.0:
        return None
    return Fit(w[0], Coefficients(w[1], w[2], w[3], w[4]), len(samples))


def fitted(fit: Fit) -> Coefficients:
    return fit.coefficients
