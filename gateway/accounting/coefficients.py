"""Work coefficients per engine/precision, and an online non-negative least-squares fit.

An interval's dynamic energy is shared by each request's work
    alpha * prefill_tokens + beta * decode_tokens + gamma * kv_tokens
    + delta * decode_steps * decode_tokens / all decode_tokens of the interval
where kv_tokens counts, per decoded token, the context it attends over, and the last term is
the weight streaming of each decode step, shared equally by the sequences in the batch
(decode_steps ~ the most tokens any request decoded in the interval). Only ratios matter.
Defaults come from the engine profile the simulator models for H100 serving Llama-3.1-8B
(REFERENCE.md figures): a decode step streams all weights (~1.25 J at BF16), a prefill token
costs ~0.015 J, a KV context token read ~2e-5 J; FP8/INT8 halve weight bytes and prefill
compute, INT4 (W4A16) quarters weight bytes but keeps 16-bit prefill compute. Switch the
online fit on for other models and GPUs.
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


DEFAULTS: dict[str, Coefficients] = {
    "bf16": Coefficients(0.012, 0.01, 2e-5, 1.0),
    "fp16": Coefficients(0.012, 0.01, 2e-5, 1.0),
    "fp8": Coefficients(0.012, 0.02, 4e-5, 1.0),
    "int8": Coefficients(0.012, 0.02, 4e-5, 1.0),
    "int4": Coefficients(0.048, 0.04, 8e-5, 1.0),
}
FALLBACK = DEFAULTS["bf16"]


def default_for(precision: str) -> Coefficients:
    return DEFAULTS.get(precision, FALLBACK)


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
