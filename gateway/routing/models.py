"""Online models of one endpoint (pure): TTFT, TPOT, power and J per prompt/output token as
functions of the engine's load, learnt from the gateway's own records and from the energy the
accounting service apportioned, never from a hand-fed table.

Load is the routing snapshot's `Candidate.load`: requests resident on the engine (running +
waiting, or the gateway's in-flight count when the scrape lags) per unit weight, as seen when
a request is dispatched, the new request excluded. Samples fall into load bins on a doubling
grid (0, 1, 2, 3-4, 5-8, ... 257+). Each bin keeps exponentially decayed sums (a recent
window of about `1 / (1 - decay)` samples), so the models follow an engine whose behaviour
changes. A bin with few samples blends in the cold-start prior (gateway.routing.priors),
rescaled by the ratio measured/prior over the bins that have samples: the level comes from
measurements, the shape across unseen loads from the prior. The endpoint is flagged `cold`
until `min_samples` latency samples and `min_windows` energy windows are in.

Predictions (`Curves`) are frozen snapshots a policy reads: interpolated between bin centres,
latency made non-decreasing in load (a busier engine is never predicted faster).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

from gateway.routing.priors import Prior

# Upper edges of the load bins; bin i holds loads in (EDGES[i-1], EDGES[i]].
EDGES: tuple[float, ...] = (0.5, 1.5, 2.5, 4.5, 8.5, 16.5, 32.5, 64.5, 128.5, 256.5)
CENTRES: tuple[float, ...] = (0.0, 1.0, 2.0, 3.5, 6.5, 12.5, 24.5, 48.5, 96.5, 192.5, 384.0)
N_BINS = len(CENTRES)


def bin_of(load: float) -> int:
    return bisect_right(EDGES, max(load, 0.0) - 1e-9)


@dataclass(slots=True)
class _Moments:
    """Decayed weight, mean and variance of one quantity (West's weighted update)."""

    w: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float, decay: float) -> None:
        self.w *= decay
        self.m2 *= decay
        self.w += 1.0
        delta = x - self.mean
        self.mean += delta / self.w
        self.m2 += delta * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.w) if self.w > 1.0 else 0.0


@dataclass(slots=True)
class _LatencyBin:
    ttft: _Moments = field(default_factory=_Moments)  # TTFT minus the prior's prefill time
    tpot: _Moments = field(default_factory=_Moments)
    n: int = 0


@dataclass(slots=True)
class _EnergyBin:
    """Decayed least-squares sums for E = a * prompt_tokens + b * output_tokens, and E / dt."""

    w: float = 0.0
    pp: float = 0.0
    po: float = 0.0
    oo: float = 0.0
    pe: float = 0.0
    oe: float = 0.0
    energy_j: float = 0.0
    dt_s: float = 0.0
    n: int = 0

    def add(self, w: EnergyWindow, decay: float) -> None:
        for name in ("w", "pp", "po", "oo", "pe", "oe", "energy_j", "dt_s"):
            setattr(self, name, getattr(self, name) * decay)
        p, o, e = w.prompt_tokens, w.output_tokens, w.energy_j
        self.w += 1.0
        self.pp += p * p
        self.po += p * o
        self.oo += o * o
        self.pe += p * e
        self.oe += o * e
        self.energy_j += e
        self.dt_s += w.dt_s
        self.n += 1

    def solve(self, prior_a: float, prior_b: float, strength: float) -> tuple[float, float]:
        """Ridge toward the prior: (X'X + S) theta = X'E + S theta0, S scaled per column by the
        bin's own mean square (so `strength` counts pseudo-windows). Non-negative."""
        if self.w <= 0.0:
            return prior_a, prior_b
        sp = strength * max(self.pp / self.w, 1.0)
        so = strength * max(self.oo / self.w, 1.0)
        a11, a12, a22 = self.pp + sp, self.po, self.oo + so
        r1, r2 = self.pe + sp * prior_a, self.oe + so * prior_b
        det = a11 * a22 - a12 * a12
        if det <= 0.0:
            return prior_a, prior_b
        a = (r1 * a22 - r2 * a12) / det
        b = (a11 * r2 - a12 * r1) / det
        if a < 0.0:  # the prompt share is not identifiable: all of it by output tokens
            a, b = 0.0, r2 / a22
        return a, max(b, 0.0)


@dataclass(frozen=True, slots=True)
class EnergyWindow:
    """One stretch of an engine's apportioned energy and the work the gateway sent it then."""

    energy_j: float
    dt_s: float
    prompt_tokens: float
    output_tokens: float
    load: float  # mean requests resident over the window


@dataclass(frozen=True, slots=True)
class Curves:
    """An endpoint's predictions by load bin (index i at load CENTRES[i]); read by policies."""

    ttft_base_s: tuple[float, ...]  # TTFT of a zero-token prompt
    prefill_s_per_token: float
    tpot_s: tuple[float, ...]
    j_prompt: tuple[float, ...]  # J per prompt token (static share included)
    j_out: tuple[float, ...]  # J per output token (static share included)
    power_w: tuple[float, ...]
    idle_w: float
    latency_samples: int
    energy_windows: int
    cold: bool
    # Step time one prompt token adds at this endpoint's measured speed (the prior's prefill
    # rate x measured/prior TPOT), and the prompt tokens dispatched to it whose prefill is not
    # done yet, as the gateway saw at snapshot time (gateway.routing.pending; 0 in a model's
    # own curves).
    step_prefill_s_per_token: float = 0.0
    pending_prefill_tokens: float = 0.0
    short_output_tokens: float = math.inf  # a short stream's output here (gateway.routing.pending)

    def ttft(self, load: float, prompt_tokens: float) -> float:
        return _interp(self.ttft_base_s, load) + self.prefill_s_per_token * prompt_tokens

    def tpot(self, load: float) -> float:
        return _interp(self.tpot_s, load)

    def ttft_burst(self, load: float, prompt_tokens: float, pending_tokens: float) -> float:
        """TTFT with `pending_tokens` of prefill queued ahead of the prompt (a burst): the
        curves know the queue of a steady load, not a burst's prompts all arriving at once."""
        return self.ttft(load, prompt_tokens) + self.step_prefill_s_per_token * max(
            pending_tokens, 0.0)

    def tpot_burst(self, load: float, pending_tokens: float, output_tokens: float) -> float:
        """TPOT of a stream of `output_tokens` while `pending_tokens` of prefill share its
        steps: chunked prefill puts a burst's prompts into the steps the stream decodes in,
        and a stream of few tokens cannot average that lump out (it is spread over its
        output_tokens - 1 gaps). Non-decreasing in load and in pending prefill."""
        gaps = max(output_tokens - 1.0, 1.0)
        return self.tpot(load) + self.step_prefill_s_per_token * max(pending_tokens, 0.0) / gaps

    def j_per_output_token(self, load: float) -> float:
        return max(_interp(self.j_out, max(load, 1.0)), 0.0)

    def j_per_prompt_token(self, load: float) -> float:
        return max(_interp(self.j_prompt, max(load, 1.0)), 0.0)

    def marginal_j(self, load: float, prompt_tokens: float, output_tokens: float) -> float:
        """Joules one more request adds at this load (the request excluded from `load`).

        At load L the engine spends g(L) = L x J/output-token(L) per step-time of a stream,
        so one more stream generating N tokens costs N x (g(L+1) - g(L)): its own tokens plus
        the slowdown it imposes on the others, minus the static power the engine was burning
        anyway (g(0) = idle power x TPOT(1)). Plus its prompt at J/prompt-token(L+1)."""
        g0 = self.idle_w * self.tpot(1.0)

        def g(x: float) -> float:
            if x >= 1.0:
                return x * self.j_per_output_token(x)
            return g0 + x * (self.j_per_output_token(1.0) - g0)

        decode = max(g(load + 1.0) - g(load), 0.0) * output_tokens
        return decode + self.j_per_prompt_token(load + 1.0) * prompt_tokens


def _interp(values: tuple[float, ...], load: float) -> float:
    x = max(load, 0.0)
    i = bisect_right(CENTRES, x)
    if i >= N_BINS:  # beyond the last centre: the last two bins' slope
        slope = (values[-1] - values[-2]) / (CENTRES[-1] - CENTRES[-2])
        return values[-1] + slope * (x - CENTRES[-1])
    lo, hi = CENTRES[i - 1], CENTRES[i]
    t = (x - lo) / (hi - lo)
    return values[i - 1] + t * (values[i] - values[i - 1])


@dataclass(frozen=True, slots=True)
class ModelSettings:
    decay: float = 0.98  # per sample: about the last 50 samples of a bin count
    prior_strength: float = 3.0  # pseudo-samples the prior weighs in a bin
    min_samples: int = 20  # latency samples before the endpoint is no longer cold
    min_windows: int = 5  # energy windows before the endpoint is no longer cold
    # A sample above this many times the bin's mean is kept out of the mean: one stall must
    # not move a bin (it still counts in the variance through later samples, capped).
    outlier_factor: float = 20.0


class EndpointModel:
    """The learner of one endpoint: samples in, `curves()` out."""

    def __init__(self, prior: Prior, settings: ModelSettings = ModelSettings()):
        self.prior = prior
        self.settings = settings
        self.latency = [_LatencyBin() for _ in range(N_BINS)]
        self.energy = [_EnergyBin() for _ in range(N_BINS)]
        self.latency_samples = 0
        self.energy_windows = 0
        self._curves: Curves | None = None
        self._last: Curves | None = None  # the last curves built, kept when a sample arrives

    def observe_latency(self, load: float, prompt_tokens: int, ttft_s: float | None,
                        tpot_s: float | None, decode_load: float | None = None) -> None:
        """One finished request: its TTFT at `load` (when it was dispatched) and its TPOT at
        `decode_load` (the mean load while it decoded; `load` when not known). None: not
        measured."""
        b = self.latency[bin_of(load)]
        d = self.settings.decay
        if ttft_s is not None and math.isfinite(ttft_s) and ttft_s >= 0.0:
            b.ttft.add(max(ttft_s - self.prior.prefill_s_per_token * prompt_tokens, 0.0), d)
        if tpot_s is not None and math.isfinite(tpot_s) and tpot_s >= 0.0:
            # A stream's TPOT is set by the batch it decoded in, not the one it joined: while
            # an engine fills, a request dispatched at load 20 may decode at 200; binning its
            # TPOT at 20 made light loads look slow and kept a drained engine closed.
            self.latency[bin_of(load if decode_load is None else decode_load)].tpot.add(tpot_s, d)
        b.n += 1
        self.latency_samples += 1
        self._curves = None

    def observe_energy(self, window: EnergyWindow) -> None:
        if window.dt_s <= 0.0 or window.energy_j < 0.0 or not math.isfinite(window.energy_j):
            return
        self.energy[bin_of(window.load)].add(window, self.settings.decay)
        self.energy_windows += 1
        self._curves = None

    def curves(self) -> Curves:
        """The current predictions (cached until the next sample)."""
        if self._curves is None:
            self._curves = self._last = self._build()
        return self._curves

    def latest_curves(self) -> Curves:
        """The curves as last built, without rebuilding for samples that came since: for
        bookkeeping on every routing decision (a rebuild costs hundreds of µs; `curves()`
        rebuilds when a policy asks for predictions)."""
        return self._last if self._last is not None else self.curves()

    def _build(self) -> Curves:
        p, s = self.prior, self.settings
        k = s.prior_strength
        ttft_prior = [p.ttft_s(c, 0.0) for c in CENTRES]
        tpot_prior = [p.tpot_s(c) for c in CENTRES]
        # TTFT/TPOT summarised as mean + one standard deviation: a policy checks an SLO that
        # every request must meet, not the average.
        ttft_obs = [(b.ttft.w, b.ttft.mean + b.ttft.std) for b in self.latency]
        tpot_obs = [(b.tpot.w, b.tpot.mean + b.tpot.std) for b in self.latency]
        ttft = _monotone(_blend(ttft_obs, ttft_prior, k))
        tpot = _monotone(_blend(tpot_obs, tpot_prior, k))
        # How much slower than the prior this engine steps (e.g. a simulator at time_scale
        # 0.1: ten times), measured on TPOT: the prior's prefill rate at that speed.
        speed = _ratio([(w, v / pr) for (w, v), pr in zip(tpot_obs, tpot_prior, strict=True)
                        if w > 0 and pr > 0], 1.0)
        power_prior = [p.power_w(c) for c in CENTRES]
        power = _blend([(e.w, e.energy_j / e.dt_s if e.dt_s > 0 else 0.0) for e in self.energy],
                       power_prior, k)
        j_prompt, j_out = [], []
        # The energy prior is rescaled by what the bins with windows measured against it
        # (another GPU or model): unseen loads keep the prior's shape at the measured level.
        prior_b = [p.j_out(c) for c in CENTRES]
        scale = _ratio([(e.w, e.solve(p.j_prompt(c), b0, k)[1] / b0)
                        for c, e, b0 in zip(CENTRES, self.energy, prior_b, strict=True)
                        if e.w > 0 and e.oo > 0], 1.0)
        for c, e, b0 in zip(CENTRES, self.energy, prior_b, strict=True):
            a, b = e.solve(p.j_prompt(c) * scale, b0 * scale, k)
            j_prompt.append(a)
            j_out.append(b)
        return Curves(
            ttft_base_s=tuple(ttft), prefill_s_per_token=p.prefill_s_per_token,
            tpot_s=tuple(tpot), j_prompt=tuple(j_prompt), j_out=tuple(_falling(j_out)),
            power_w=tuple(power), idle_w=power[0], latency_samples=self.latency_samples,
            energy_windows=self.energy_windows,
            cold=self.latency_samples < s.min_samples or self.energy_windows < s.min_windows,
            step_prefill_s_per_token=p.prefill_s_per_token * speed)


def _ratio(weighted: list[tuple[float, float]], default: float) -> float:
    total = sum(w for w, _ in weighted)
    if total <= 0.0:
        return default
    return sum(w * r for w, r in weighted) / total


def _blend(observed: list[tuple[float, float]], prior: list[float], strength: float
           ) -> list[float]:
    """Per bin: (w x measured + k x prior x scale) / (w + k), scale = measured/prior over the
    bins that have samples (weighted), so unseen bins keep the prior's shape at the measured
    level."""
    scale = _ratio([(w, v / pr) for (w, v), pr in zip(observed, prior, strict=True)
                    if w > 0 and pr > 0], 1.0)
    return [(w * v + strength * pr * scale) / (w + strength)
            for (w, v), pr in zip(observed, prior, strict=True)]


def _monotone(values: list[float]) -> list[float]:
    """Non-decreasing in load (running maximum)."""
    out, top = [], 0.0
    for v in values:
        top = max(top, v)
        out.append(top)
    return out


def _falling(values: list[float]) -> list[float]:
    """J per output token non-increasing in load past batch 1 (running minimum): noise in a
    thin bin must not make the marginal cost of packing look negative or jump."""
    out, low = [], math.inf
    for v in values:
        low = min(low, v)
        out.append(low)
    return out
