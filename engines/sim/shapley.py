"""Each sequence's Shapley share of one step's energy (the simulator's ground truth).

The game is game.StepGame: v(S) is the energy of the step that would run the sequences S
alone. The Shapley value phi_i = sum over S not holding i of |S|! (n-|S|-1)! / n! x
(v(S + i) - v(S)) is the only split that sums to the step's energy (efficiency), gives equal
shares to sequences that add the same to every coalition (symmetry) and nothing to one that
adds nothing (null player). Three ways to compute it, the first that applies:

- affine (exact, O(n)): when every non-empty coalition is on the same side of each max/min
  of the cost as the whole batch, v(S) = a + b . x(S) up to a function of |S| alone (the
  weight-streaming efficiency when every sequence has the same new tokens), so
  phi_i = a / n + b . x_i: the fixed part (host overhead, weight reads, the static power
  over them) equally, the rest by each sequence's tokens, attention and KV reads. The
  certificate is checked with bounds over all coalitions, not by trying them.
- enumeration (exact): batches of at most EXACT_MAX sequences, all 2^n coalitions.
- stratified sampling: larger batches where a max flips inside the batch (a prompt chunk
  that makes the step compute-bound beside decodes that alone would be memory-bound). The
  affine split of the whole batch's regime is the control variate; the residual game
  v(S) - (a + b . x(S)) is estimated per sequence from `m` random coalitions of every size
  k (the prefixes of random orders of the others; sizes 0 and n-1 have one coalition each,
  so they are exact), and its estimates are shifted equally so that they sum to the
  residual's total, 0. Each share's variance is returned: the standard error of a request's
  truth is the square root of the sum of its steps' variances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from engines.sim.game import Players, Regime, StepGame
from engines.sim.power import K_COMM, K_COMPUTE, K_KV, K_MEMORY, K_OVERHEAD, K_SEQ

EXACT_MAX = 8  # enumerate all coalitions up to this many sequences (256)
# Random coalitions per size and sequence: m = SAMPLE_BUDGET / n^2 within [2, 8], so a step
# costs about 2 m n^2 evaluations of the game (vectorised: ~2 ms at 33 sequences, ~35 ms at
# 256 on one core); m >= 2 gives each share's variance.
SAMPLE_BUDGET = 20_000
SAMPLES_MIN, SAMPLES_MAX = 2, 8

AFFINE = "affine"
EXACT = "exact"
SAMPLED = "sampled"


@dataclass(frozen=True, slots=True)
class Split:
    shares_j: list[float]
    variance_j2: list[float]  # 0 where exact
    method: str


def shapley(game: StepGame, pl: Players, total_j: float, rng: np.random.Generator) -> Split:
    """The Shapley split of a step whose metered energy is `total_j` (the game's v(N) up to
    rounding: the shares are moved by (total_j - sum) / n so that they sum to it)."""
    n = pl.n
    if n == 1:
        return Split([total_j], [0.0], EXACT)
    sums = (float(n), float(pl.tokens.sum()), float(pl.attn_s.sum()), float(pl.kv_s.sum()))
    regime = game.regime(*sums)
    base = _affine(game, pl, regime, sums)
    variance = np.zeros(n)
    if _certified(game, pl, regime):
        shares, method = base, AFFINE
    elif n <= EXACT_MAX:
        shares, method = _enumerate(game, pl), EXACT
    else:
        residual, variance = _sampled(game, pl, regime, sums, rng)
        shares, method = base + residual, SAMPLED
    values = [float(x) for x in shares + (total_j - math.fsum(shares.tolist())) / n]
    values[-1] = total_j - math.fsum(values[:-1])  # the shares sum to the step, exactly
    return Split(values, [float(v) for v in variance], method)


def _coefficients(game: StepGame, regime: Regime, sums: tuple[float, float, float, float]
                  ) -> tuple[float, tuple[float, float, float, float]]:
    """(a, b) of the affine game a + b . (n, T, A, K) that equals v on the whole batch and
    has the batch's slopes."""
    per_token, per_attn, per_kv, per_seq, _ = game.slopes(regime)
    b = (per_seq, per_token, per_attn, per_kv)
    v_n = float(game.energy_j(*sums))
    return v_n - sum(bi * si for bi, si in zip(b, sums, strict=True)), b


def _affine(game: StepGame, pl: Players, regime: Regime,
            sums: tuple[float, float, float, float]) -> Any:
    a, (per_seq, per_token, per_attn, per_kv) = _coefficients(game, regime, sums)
    return (a / pl.n + per_seq + per_token * pl.tokens + per_attn * pl.attn_s
            + per_kv * pl.kv_s)


def _span(c: Any) -> tuple[float, float]:
    """(min, max) over non-empty subsets of the sum of the per-sequence terms `c`."""
    neg, pos = float(np.minimum(c, 0.0).sum()), float(np.maximum(c, 0.0).sum())
    low = neg if neg < 0.0 else float(c.min())
    high = pos if pos > 0.0 else float(c.max())
    return low, high


def _certified(game: StepGame, pl: Players, r: Regime) -> bool:
    """True when every non-empty coalition is in regime `r` and v is affine there up to a
    function of |S| (sufficient conditions, from bounds over all coalitions)."""
    t = pl.tokens
    t_min, t_all = float(t.min()), float(t.sum())
    w_ends = (float(game.weights_s(t_min)), float(game.weights_s(t_all)))
    w_lo, w_hi = min(w_ends), max(w_ends)  # eff(T) is monotone, so weights(T) is too
    g = game.gemm_s_per_token
    same_bound = g * t_min >= w_hi if r.compute_bound else g * t_all <= w_lo
    high, low = (pl.attn_s, pl.kv_s) if r.attn_bound else (pl.kv_s, pl.attn_s)
    if not same_bound or bool(np.any(high < low)):
        return False
    # busy - duration over every coalition, within the regime: constant + per-sequence
    # terms + u_w x weights(T).
    pf, cb, ab = game.power_factor, float(r.compute_bound), float(r.attn_bound)
    c = ((K_COMPUTE * pf - cb) * g * t + (K_COMPUTE - ab) * pl.attn_s
         + (K_KV - 1.0 + ab) * pl.kv_s + (K_SEQ - 1.0) * game.seq_overhead_s
         + (K_COMM - 1.0) * game.comm_s_per_token * t)
    c0 = (K_OVERHEAD - 1.0) * game.overhead_s + (K_COMM - 1.0) * game.comm0_s
    u_w = K_MEMORY * pf - (1.0 - cb)
    low_s, high_s = _span(c)
    w_terms = (u_w * w_lo, u_w * w_hi)
    if r.capped and c0 + low_s + min(w_terms) < 0.0:
        return False
    if not r.capped and c0 + high_s + max(w_terms) > 0.0:
        return False
    per_weights = game.slopes(r)[4]
    varies = game.eff_small != game.eff_large and t_min != float(t.max())
    return not (varies and per_weights != 0.0)


@lru_cache(maxsize=EXACT_MAX + 1)
def _masks(n: int) -> tuple[Any, Any, Any]:
    """Membership matrix of all 2^n coalitions, their sizes, and the Shapley weight of a
    coalition of each size k not holding the player: k! (n-k-1)! / n!."""
    masks = np.arange(1 << n)
    member = ((masks[:, None] >> np.arange(n)) & 1).astype(np.float64)
    sizes = member.sum(axis=1).astype(np.int64)
    weight = np.array([math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
                       for k in range(n)])
    return member, sizes, weight


def _enumerate(game: StepGame, pl: Players) -> Any:
    n = pl.n
    member, sizes, weight = _masks(n)
    v = game.energy_j(sizes.astype(np.float64), member @ pl.tokens, member @ pl.attn_s,
                      member @ pl.kv_s)
    masks = np.arange(1 << n)
    out = np.empty(n)
    for i in range(n):
        without = masks[(masks >> i) & 1 == 0]
        out[i] = float(np.dot(weight[sizes[without]], v[without | (1 << i)] - v[without]))
    return out


def _sampled(game: StepGame, pl: Players, regime: Regime,
             sums: tuple[float, float, float, float], rng: np.random.Generator
             ) -> tuple[Any, Any]:
    """The residual game's Shapley estimate per sequence and its variance."""
    n = pl.n
    m = max(SAMPLES_MIN, min(SAMPLES_MAX, SAMPLE_BUDGET // (n * n)))
    a, (per_seq, per_token, per_attn, per_kv) = _coefficients(game, regime, sums)
    x = np.stack([np.ones(n), pl.tokens, pl.attn_s, pl.kv_s])  # (4, n)
    keys = rng.random((n, m, n))
    keys[np.arange(n), :, np.arange(n)] = 2.0  # the player itself comes last
    order = np.argsort(keys, axis=2)[:, :, : n - 1]  # random orders of the others
    prefix = np.zeros((4, n, m, n))  # sums of the first k others, k = 0 .. n-1
    prefix[:, :, :, 1:] = np.cumsum(x[:, order], axis=3)
    with_i = prefix + x[:, :, None, None]

    def residual(s: Any) -> Any:
        v = game.energy_j(s[0], s[1], s[2], s[3])
        affine = np.where(s[0] > 0, a + per_seq * s[0] + per_token * s[1] + per_attn * s[2]
                          + per_kv * s[3], 0.0)
        return v - affine

    delta = residual(with_i) - residual(prefix)  # (n, m, n): player, sample, size
    estimate = delta.mean(axis=1).sum(axis=1) / n
    variance = delta.var(axis=1, ddof=1).sum(axis=1) / (m * n * n)
    estimate -= estimate.sum() / n  # the residual's total is v(N) - (a + b . x(N)) = 0
    return estimate, variance
