"""Token-work coefficients per engine/precision, and an online non-negative least-squares fit.

Dynamic energy is shared by alpha * prefill_tokens + beta * decode_tokens; only the ratio
matters. Defaults follow the engine profile: a decode token costs far more than a prefill
token at serving batch sizes, because decode is memory-bound and prefill is batched compute
(REFERENCE.md: ~0.12 J per output token at batch 64 on H100 with near-TDP prefill). Lower
precisions shrink weight bytes, which makes decode relatively cheaper.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Coefficients:
    alpha: float  # weight of one prefill token
    beta: float  # weight of one decode token


DEFAULTS: dict[str, Coefficients] = {
    "bf16": Coefficients(0.08, 1.0),
    "fp16": Coefficients(0.08, 1.0),
    "fp8": Coefficients(0.06, 1.0),
    "int8": Coefficients(0.06, 1.0),
    "int4": Coefficients(0.10, 1.0),
}
FALLBACK = Coefficients(0.08, 1.0)


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

    Tries every subset of free columns (2^n least-squares solves); fine for n <= 4.
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
    prefill_j_per_token: float
    decode_j_per_token: float
    samples: int


def fit_intervals(samples: Sequence[tuple[float, float, float, float]],
                  min_samples: int = 30) -> Fit | None:
    """Fit dE = idle_w * dt + a * prefill + b * decode (all >= 0) over recent intervals.

    samples: (energy_j, interval_s, prefill_tokens, decode_tokens) of intervals with work.
    None when there are too few samples or the decode coefficient comes out zero.
    """
    if len(samples) < min_samples:
        return None
    x = [[s[1], s[2], s[3]] for s in samples]
    y = [s[0] for s in samples]
    w = nnls(x, y)
    if w[2] <= 0.0:
        return None
    return Fit(w[0], w[1], w[2], len(samples))


def fitted(fit: Fit) -> Coefficients:
    return Coefficients(alpha=fit.prefill_j_per_token / fit.decode_j_per_token, beta=1.0)
