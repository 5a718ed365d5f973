"""Arrival processes (pure, seeded): when each request of an open-loop run is due.

Every process turns a `random.Random` into a sorted tuple of offsets in seconds from the start
of the run. The same seed gives the same offsets on every machine (`random.Random` with an int or
str seed is deterministic across processes and Python builds of one version).

Processes: constant, poisson, gamma (vLLM `--burstiness k`: gaps ~ Gamma(k, 1/(rate*k)),
CV = 1/sqrt(k)), onoff (a two-state Markov-modulated Poisson process), diurnal (a sinusoidal
rate envelope over any other process), ramp (linear or stepped rate), offline (everything at
t=0) and closed (closed-loop concurrency: no schedule, the client keeps N requests in flight).

Time-varying rates are applied by a time change: the base process runs in "operational time" u
and each event maps to t = Lambda^-1(u), where Lambda is the cumulative rate multiplier. This keeps
the base process's burst structure (its gap CV) while the rate follows the envelope.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class ArrivalProcess(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def mean_rate_rps(self) -> float: ...

    def offsets_s(self, rng: random.Random, duration_s: float, max_requests: int
                  ) -> tuple[float, ...]: ...


def _renewal(gap: Callable[[], float], duration_s: float, max_requests: int) -> tuple[float, ...]:
    out: list[float] = []
    t = 0.0
    while len(out) < max_requests:
        t += gap()
        if t >= duration_s:
            break
        out.append(t)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Constant:
    """Evenly spaced arrivals, the first at t=0."""

    rate_rps: float
    kind: str = "constant"

    @property
    def mean_rate_rps(self) -> float:
        return self.rate_rps

    def expected_gap_cv(self) -> float:
        return 0.0

    def offsets_s(self, rng: random.Random, duration_s: float, max_requests: int
                  ) -> tuple[float, ...]:
        gap = 1.0 / self.rate_rps
        n = max_requests if math.isinf(duration_s) else min(
            max_requests, math.ceil(duration_s * self.rate_rps))
        return tuple(i * gap for i in range(n) if i * gap < duration_s)


@dataclass(frozen=True, slots=True)
class Poisson:
    rate_rps: float
    kind: str = "poisson"

    @property
    def mean_rate_rps(self) -> float:
        return self.rate_rps

    def expected_gap_cv(self) -> float:
        return 1.0

    def offsets_s(self, rng: random.Random, duration_s: float, max_requests: int
                  ) -> tuple[float, ...]:
        rate = self.rate_rps
        return _renewal(lambda: rng.expovariate(rate), duration_s, max_requests)


@dataclass(frozen=True, slots=True)
class Gamma:
    """vLLM's burstiness: k < 1 burstier than Poisson, k = 1 Poisson, k > 1 more regular."""

    rate_rps: float
    burstiness: float = 1.0
    kind: str = "gamma"

    @property
    def mean_rate_rps(self) -> float:
        return self.rate_rps

    def expected_gap_cv(self) -> float:
        return 1.0 / math.sqrt(self.burstiness)

    def offsets_s(self, rng: random.Random, duration_s: float, max_requests: int
                  ) -> tuple[float, ...]:
        k = self.burstiness
        scale = 1.0 / (self.rate_rps * k)
        return _renewal(lambda: rng.gammavariate(k, scale), duration_s, max_requests)


@dataclass(frozen=True, slots=True)
class OnOff:
    """Two-state MMPP: Poisson at `on_rate_rps` during ON periods, `off_rate_rps` during OFF.

    Period lengths are exponential with means `mean_on_s` / `mean_off_s`; the run starts ON.
    """

    on_rate_rps: float
    mean_on_s: float
    mean_off_s: float
    off_rate_rps: float = 0.0
    kind: str = "onoff"

    @property
    def mean_rate_rps(self) -> float:
        total = self.mean_on_s + self.mean_off_s
        return (self.on_rate_rps * self.mean_on_s + self.off_rate_rps * self.mean_off_s) / total

    def expected_gap_cv(self) -> float:
        """Stationary inter-arrival CV, from first-step analysis of the two-state chain."""
        lam = (self.on_rate_rps, self.off_rate_rps)
        switch = (1.0 / self.mean_on_s, 1.0 / self.mean_off_s)
        # m[i], s[i]: first and second moment of the time to the next arrival from state i.
        # From i: sojourn S ~ Exp(lam_i + a_i); then arrive (prob lam_i/q) or move to j.
        q = (lam[0] + switch[0], lam[1] + switch[1])
        p = (switch[0] / q[0], switch[1] / q[1])
        # m0 = 1/q0 + p0 m1 ; m1 = 1/q1 + p1 m0
        m0 = (1 / q[0] + p[0] / q[1]) / (1 - p[0] * p[1])
        m1 = 1 / q[1] + p[1] * m0
        # s_i = 2/q_i^2 + 2 p_i m_j / q_i + p_i s_j
        c0 = 2 / q[0] ** 2 + 2 * p[0] * m1 / q[0]
        c1 = 2 / q[1] ** 2 + 2 * p[1] * m0 / q[1]
        s0 = (c0 + p[0] * c1) / (1 - p[0] * p[1])
        s1 = c1 + p[1] * s0
        # An arrival leaves the chain in state i with probability ~ pi_i * lam_i.
        pi = (self.mean_on_s, self.mean_off_s)
        w0, w1 = pi[0] * lam[0], pi[1] * lam[1]
        mean = (w0 * m0 + w1 * m1) / (w0 + w1)
        second = (w0 * s0 + w1 * s1) / (w0 + w1)
        return math.sqrt(max(0.0, second - mean * mean)) / mean

    def offsets_s(self, rng: random.Random, duration_s: float, max_requests: int
                  ) -> tuple[float, ...]:
        out: list[float] = []
        t, on = 0.0, True
        while t < duration_s and len(out) < max_requests:
            period_end = t + rng.expovariate(1.0 / (self.mean_on_s if on else self.mean_off_s))
            rate = self.on_rate_rps if on else self.off_rate_rps
            if rate > 0:
                # Memoryless: restarting the Poisson clock at each switch is exact.
                while True:
                    t += rng.expovariate(rate)
                    if t >= period_end or t >= duration_s or len(out) >= max_requests:
                        break
                    out.append(t)
            t, on = period_end, not on
        return tuple(out)


def _invert(cumulative: Callable[[float], float], u: float, hi_s: float) -> float:
    """Smallest t in [0, hi_s] with cumulative(t) >= u (cumulative is increasing)."""
    lo, hi = 0.0, hi_s
    for _ in range(60):  # 2^-60 of the span: far below a microsecond for any sane run
        mid = (lo + hi) / 2
        if cumulative(mid) < u:
            lo = mid
        else:
            hi = mid
    return hi


def _warp(base: ArrivalProcess, rng: random.Random, duration_s: float, max_requests: int,
          cumulative: Callable[[float], float]) -> tuple[float, ...]:
    """Run `base` in operational time and map each event through cumulative^-1."""
    horizon_u = cumulative(duration_s)
    events_u = base.offsets_s(rng, horizon_u, max_requests)
    return tuple(_invert(cumulative, u, duration_s) for u in events_u)


@dataclass(frozen=True, slots=True)
class Diurnal:
    """A sinusoidal envelope over `base`: rate(t) = base rate * (1 + amplitude sin(2 pi t/period))."""

    base: ArrivalProcess
    period_s: float
    amplitude: float = 0.5  # 0 <= amplitude < 1
    phase_rad: float = 0.0
    kind: str = "diurnal"

    @property
    def mean_rate_rps(self) -> float:
        return self.base.mean_rate_rps

    def multiplier(self, t_s: float) -> float:
        return 1 + self.amplitude * math.sin(2 * math.pi * t_s / self.period_s + self.phase_rad)

    def cumulative(self, t_s: float) -> float:
        w = 2 * math.pi / self.period_s
        return t_s + self.amplitude / w * (math.cos(self.phase_rad) - math.cos(w * t_s
                                                                               + self.phase_rad))

    def offsets_s(self, rng: random.Random, duration_s: float, max_requests: int
                  ) -> tuple[float, ...]:
        return _warp(self.base, rng, duration_s, max_requests, self.cumulative)


@dataclass(frozen=True, slots=True)
class Ramp:
    """Poisson arrivals whose rate goes from `start_rps` to `end_rps` over `duration_s`.

    `steps` = 0: linear; `steps` = n >= 1: n equal-length constant-rate steps.
    """

    start_rps: float
    end_rps: float
    duration_s: float
    steps: int = 0
    kind: str = "ramp"

    @property
    def mean_rate_rps(self) -> float:
        return self.cumulative(self.duration_s) / self.duration_s

    def rate_at(self, t_s: float) -> float:
        t = min(max(t_s, 0.0), self.duration_s)
        frac = t / self.duration_s
        if self.steps >= 1:
            idx = min(int(frac * self.steps), self.steps - 1)
            frac = idx / (self.steps - 1) if self.steps > 1 else 0.0
        return self.start_rps + (self.end_rps - self.start_rps) * frac

    def cumulative(self, t_s: float) -> float:
        """Expected arrivals in [0, t_s]."""
        if self.steps < 1:
            t = min(t_s, self.duration_s)
            slope = (self.end_rps - self.start_rps) / self.duration_s
            extra = max(0.0, t_s - self.duration_s) * self.end_rps
            return self.start_rps * t + slope * t * t / 2 + extra
        step_s = self.duration_s / self.steps
        t = min(t_s, self.duration_s)
        full = min(int(t // step_s), self.steps)
        total = sum(self._step_rate(i) for i in range(full)) * step_s
        if full < self.steps:
            total += self._step_rate(full) * (t - full * step_s)
        return total + max(0.0, t_s - self.duration_s) * self.end_rps

    def _step_rate(self, i: int) -> float:
        frac = i / (self.steps - 1) if self.steps > 1 else 0.0
        return self.start_rps + (self.end_rps - self.start_rps) * frac

    def offsets_s(self, rng: random.Random, duration_s: float, max_requests: int
                  ) -> tuple[float, ...]:
        return _warp(Poisson(1.0), rng, duration_s, max_requests, self.cumulative)


@dataclass(frozen=True, slots=True)
class Offline:
    """Every request due at t=0 (MLPerf offline scenario)."""

    count: int
    kind: str = "offline"

    @property
    def mean_rate_rps(self) -> float:
        return math.inf

    def offsets_s(self, rng: random.Random, duration_s: float, max_requests: int
                  ) -> tuple[float, ...]:
        return (0.0,) * min(self.count, max_requests)


@dataclass(frozen=True, slots=True)
class Closed:
    """Closed loop: `concurrency` requests in flight; each is due when a slot frees up.

    `offsets_s` gives `count` zeros; the client turns them into slots (intended = sent).
    """

    concurrency: int
    count: int
    kind: str = "closed"

    @property
    def mean_rate_rps(self) -> float:
        return math.inf

    def offsets_s(self, rng: random.Random, duration_s: float, max_requests: int
                  ) -> tuple[float, ...]:
        return (0.0,) * min(self.count, max_requests)


def gap_stats(offsets_s: Sequence[float]) -> tuple[float, float]:
    """(mean gap s, coefficient of variation) of a schedule's inter-arrival gaps."""
    gaps = [b - a for a, b in itertools.pairwise(offsets_s)]
    if not gaps:
        return 0.0, 0.0
    mean = sum(gaps) / len(gaps)
    var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    return mean, (math.sqrt(var) / mean if mean > 0 else 0.0)


def _num(spec: Mapping[str, Any], key: str, default: float | None = None) -> float:
    if key not in spec:
        if default is None:
            raise ValueError(f"arrival {spec.get('kind')!r}: missing {key!r}")
        return default
    return float(spec[key])


def from_spec(spec: Mapping[str, Any]) -> ArrivalProcess:
    """Build a process from a mapping like {"kind": "gamma", "rate_rps": 10, "burstiness": 0.5}."""
    kind = str(spec.get("kind", "poisson"))
    if kind == "constant":
        return Constant(_num(spec, "rate_rps"))
    if kind == "poisson":
        return Poisson(_num(spec, "rate_rps"))
    if kind == "gamma":
        return Gamma(_num(spec, "rate_rps"), _num(spec, "burstiness", 1.0))
    if kind == "onoff":
        return OnOff(on_rate_rps=_num(spec, "on_rate_rps"), mean_on_s=_num(spec, "mean_on_s"),
                     mean_off_s=_num(spec, "mean_off_s"), off_rate_rps=_num(spec, "off_rate_rps", 0))
    if kind == "diurnal":
        return Diurnal(base=from_spec(spec["base"]), period_s=_num(spec, "period_s"),
                       amplitude=_num(spec, "amplitude", 0.5), phase_rad=_num(spec, "phase_rad", 0))
    if kind == "ramp":
        return Ramp(start_rps=_num(spec, "start_rps"), end_rps=_num(spec, "end_rps"),
                    duration_s=_num(spec, "duration_s"), steps=int(_num(spec, "steps", 0)))
    if kind == "offline":
        return Offline(int(_num(spec, "count")))
    if kind == "closed":
        return Closed(int(_num(spec, "concurrency")), int(_num(spec, "count")))
    raise ValueError(f"unknown arrival kind {kind!r}; allowed: {', '.join(KINDS)}")


KINDS: tuple[str, ...] = ("constant", "poisson", "gamma", "onoff", "diurnal", "ramp", "offline",
                          "closed")
