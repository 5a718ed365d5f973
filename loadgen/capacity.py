"""Capacity by search, with confidence intervals (pure: the runs are an injected function).

The search, per arm: offer `start_rps`, multiply the rate by `growth` while the SLO is met
(up to `max_rps`), then bisect between the largest rate that met it and the smallest that did
not until they are within `tolerance` (5 %) of each other. A rate "meets the SLO" when the mean
attainment of its trials is at least the target (the `--attainment` threshold). A trial that
could not be graded (the client fell behind its schedule) is run again, up to
`UNGRADED_RETRIES` times (`retry_ungraded`: a passing stall of the machine is not the rate's
fault); one that still lags counts as attainment 0: the load generator could not offer that
rate, so it is not shown as met.

Every rate is run `trials` times with seeds `seed, seed + 1, ...` (the same seeds at every rate
and on every arm, so arms and rates are compared on the same schedules). A rate stops early
once its mean attainment cannot reach the target even if every trial left attains 1, or after
a trial that missed and is over-saturated (`over_saturated`: TTFT and in-flight count both
rising through the run, TTFT by more than the SLO's TTFT limit: the queue grows without bound).
After the bisection each seed is walked over the rates tried until its own crossing is
bracketed (a seed a rate's early stop left out is run there), and while the capacity's
interval is wider than `max_half_width_pct` (10 %) a new seed is added and walked the same way,
up to `max_trials` seeds: the interval narrows by trials, not by luck.

Intervals (95 %, named in `Interval.method`):
- attainment and J per output token at a rate: Student t over the trials' values,
  mean +/- t(0.975, n-1) x s / sqrt(n);
- capacity (the estimate is the mean of the per-trial capacities): Student t over them
  (trial i's capacity: its attainment interpolated linearly to the target between the
  largest rate it met, having met every lower one it ran at, and the next rate it ran at),
  widened to hold the search's bracket [largest rate met, smallest rate missed]. A search that
  met the SLO at `max_rps` has no upper end (capacity ">= max tested").
- a repeat's range: where another run of the same search with other seeds is expected to put
  its estimate, mean +/- t(0.975, n-1) x s x sqrt(2 / n) (the difference of two means of n
  trials), widened to the bracket. A confidence interval for the capacity does not promise to
  hold another run's estimate: that estimate has its own error, and two equally precise
  estimates fall outside each other's 95 % interval about one time in six to ten.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

# Student t, two-sided 95 % (the 0.975 quantile) by degrees of freedom; between rows the next
# lower row is used, which is wider (conservative).
_T975 = ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365),
         (8, 2.306), (9, 2.262), (10, 2.228), (12, 2.179), (15, 2.131), (20, 2.086),
         (30, 2.042), (60, 2.000), (120, 1.980))
T_METHOD = "95 % Student t over the trials"
CAPACITY_METHOD = ("95 % Student t over the per-trial capacities (each trial's attainment "
                   "interpolated to the target between its last rate met and first missed), "
                   "widened to the search bracket")
REPEAT_METHOD = ("95 % prediction interval for another run's estimate with as many trials "
                 "(mean +/- t(0.975, n-1) s sqrt(2/n)), widened to the search bracket")


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df > _T975[-1][0]:
        return 1.96
    return next(t for d, t in reversed(_T975) if df >= d)


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean with its 95 % confidence interval; low/high are -inf/inf when unknown (one
    value, or no upper end to a capacity that never saturated)."""

    mean: float
    low: float
    high: float
    n: int
    method: str

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    @property
    def half_width_pct(self) -> float:
        """Half the interval's width as a percentage of its mean (inf when unbounded)."""
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.mean == 0:
            return math.inf
        return 100 * (self.high - self.low) / 2 / abs(self.mean)


def t_interval(values: Sequence[float], method: str = T_METHOD) -> Interval:
    """mean +/- t(0.975, n-1) s / sqrt(n); one value gives an unbounded interval."""
    if not values:
        raise ValueError("t_interval needs at least one value")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Interval(mean, -math.inf, math.inf, 1, method)
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values), method)


@dataclass(frozen=True, slots=True)
class Trial:
    """One run at one rate."""

    seed: int
    attainment: float | None  # None: not graded (the client fell behind its schedule)
    j_per_output_token: float | None
    over_saturated: bool = False
    # how many request lifetimes (E2E p50) the trial's arrivals span: a trial of a few
    # lifetimes measures a transient, not the queue the rate settles to
    lifetimes: float | None = None


@dataclass(frozen=True, slots=True)
class RateStep:
    rate_rps: float
    trials: tuple[Trial, ...]
    attainment: Interval
    j_per_output_token: Interval | None  # None when no trial had energy
    meets: bool
    stopped_early: bool  # fewer trials than asked: a trial was over-saturated


@dataclass(frozen=True, slots=True)
class SearchConfig:
    start_rps: float
    max_rps: float
    target_attainment: float = 0.9
    trials: int = 3
    tolerance: float = 0.05
    growth: float = 2.0
    seed: int = 0
    # how far below start_rps to look when start_rps already misses: start / growth^k
    max_ramp_down: int = 4
    # seeds are added while the capacity's interval is wider than this (+/- % of it)
    max_half_width_pct: float = 10.0
    max_trials: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.start_rps <= self.max_rps:
            raise ValueError(f"need 0 < start rate <= max rate, got {self.start_rps:g} and "
                             f"{self.max_rps:g}")
        if self.trials < 1 or not 0 < self.tolerance < 1 or self.growth <= 1:
            raise ValueError("need trials >= 1, 0 < tolerance < 1 and growth > 1")
        if self.max_trials < self.trials or self.max_half_width_pct <= 0:
            raise ValueError("need max trials >= trials and a positive interval width")


@dataclass(frozen=True, slots=True)
class CapacityResult:
    steps: tuple[RateStep, ...]  # every rate tried, sorted by rate
    largest_met_rps: float | None  # the search bracket's low end (None: no rate met the SLO)
    first_miss_rps: float | None  # the smallest rate above it that missed (None: never missed)
    interval: Interval | None  # capacity's 95 % interval; high = inf when never saturated
    max_tested_rps: float
    repeat: Interval | None = None  # where a repeat run's estimate is expected (95 %)

    @property
    def capacity_rps(self) -> float | None:
        """The estimate: the mean of the per-trial capacities, the interval's centre (one bad
        trial moves the bracket, which the mean attainment decides, more than this)."""
        return None if self.interval is None else self.interval.mean

    @property
    def saturated(self) -> bool:
        return self.first_miss_rps is not None


RunAt = Callable[[float, int], Awaitable[Trial]]  # (rate req/s, seed) -> one trial
UNGRADED_RETRIES = 2


async def retry_ungraded(once: Callable[[], Awaitable[Trial]],
                         retries: int = UNGRADED_RETRIES) -> tuple[Trial, int]:
    """`once()`, run again while its trial is not graded, at most `retries` more times: the
    trial and how many runs it took."""
    runs = 1
    trial = await once()
    while trial.attainment is None and runs <= retries:
        runs += 1
        trial = await once()
    return trial, runs


def _attainment(t: Trial) -> float:
    return 0.0 if t.attainment is None else t.attainment


def rate_step(rate_rps: float, trials: Sequence[Trial], target: float, stopped_early: bool
              ) -> RateStep:
    attain = t_interval([_attainment(t) for t in trials])
    js = [t.j_per_output_token for t in trials if t.j_per_output_token is not None]
    return RateStep(rate_rps, tuple(trials), attain, t_interval(js) if js else None,
                    attain.mean >= target, stopped_early)


async def measure(run_at: RunAt, rate_rps: float, cfg: SearchConfig) -> RateStep:
    """`cfg.trials` trials at one rate, stopping early after an over-saturated trial that
    missed, or once the mean cannot reach the target even if every trial left attains 1."""
    trials: list[Trial] = []
    for i in range(cfg.trials):
        trial = await run_at(rate_rps, cfg.seed + i)
        trials.append(trial)
        best_mean = (sum(map(_attainment, trials)) + cfg.trials - len(trials)) / cfg.trials
        if best_mean < cfg.target_attainment or (
                trial.over_saturated and _attainment(trial) < cfg.target_attainment):
            break
    return rate_step(rate_rps, trials, cfg.target_attainment, len(trials) < cfg.trials)


async def search_capacity(run_at: RunAt, cfg: SearchConfig) -> CapacityResult:
    """Ramp geometrically until the SLO is missed, then bisect to within `cfg.tolerance`; then
    walk every trial's seed to its own crossing, and add seeds while the capacity's interval is
    wider than `cfg.max_half_width_pct` (up to `cfg.max_trials` seeds)."""
    steps: dict[float, RateStep] = {}

    async def step(rate: float) -> RateStep:
        steps[rate] = await measure(run_at, rate, cfg)
        return steps[rate]

    met, missed = None, None
    rate = cfg.start_rps
    while True:  # ramp up
        if (await step(rate)).meets:
            met = rate
            if rate >= cfg.max_rps:
                break
            rate = min(rate * cfg.growth, cfg.max_rps)
        else:
            missed = rate
            break
    for _ in range(cfg.max_ramp_down if met is None else 0):  # the start already missed
        rate /= cfg.growth
        if (await step(rate)).meets:
            met = rate
            break
        missed = rate
    while met is not None and missed is not None and missed - met > cfg.tolerance * met:
        mid = (met + missed) / 2
        if (await step(mid)).meets:
            met = mid
        else:
            missed = mid
    if met is None:
        return capacity_result(tuple(steps[r] for r in sorted(steps)), cfg.target_attainment)
    seeds = list(range(cfg.seed, cfg.seed + cfg.trials))
    for seed in seeds:  # the trials a rate's early stop left out, where their crossing is
        await walk_seed(run_at, steps, seed, met, cfg.target_attainment)
    while True:
        r = capacity_result(tuple(steps[x] for x in sorted(steps)), cfg.target_attainment)
        # the trials' own spread decides, not the bracket the interval is widened to (a
        # coarse --tolerance would otherwise always run every seed)
        if (r.interval is None or not r.saturated or len(seeds) >= cfg.max_trials
                or trials_interval(r.steps, cfg.target_attainment).half_width_pct
                <= cfg.max_half_width_pct):
            return r
        seeds.append(cfg.seed + len(seeds))
        await walk_seed(run_at, steps, seeds[-1], met, cfg.target_attainment)


async def walk_seed(run_at: RunAt, steps: dict[float, RateStep], seed: int, start_rps: float,
                    target: float) -> None:
    """Run `seed` over the rates already tried until its own crossing is bracketed: from
    `start_rps` up while it meets the target, or down until it does; a rate where it already
    ran is not run again."""
    rates = sorted(steps)
    i = rates.index(start_rps)

    async def attainment(rate: float) -> float:
        s = steps[rate]
        mine = [t for t in s.trials if t.seed == seed]
        if mine:
            return _attainment(mine[0])
        trial = await run_at(rate, seed)
        steps[rate] = rate_step(rate, [*s.trials, trial], target, s.stopped_early)
        return _attainment(trial)

    if await attainment(rates[i]) >= target:
        for r in rates[i + 1:]:
            if await attainment(r) < target:
                return
    else:
        for r in reversed(rates[:i]):
            if await attainment(r) >= target:
                return


def per_trial_capacity(steps: Sequence[RateStep], seed: int, target: float) -> float:
    """Where the trial with `seed` crosses the target attainment: linear interpolation of its
    attainment between the largest rate it met (having met every lower rate it ran at; rate 0
    counts as met with attainment 1) and the next rate it ran at, which it missed. Rates where
    it did not run are skipped; a trial that never missed gives its largest rate met."""
    last = (0.0, 1.0)  # (rate, attainment) of the last rate met
    for s in sorted(steps, key=lambda s: s.rate_rps):
        mine = [t for t in s.trials if t.seed == seed]
        if not mine:
            continue
        att = _attainment(mine[0])
        if att < target:
            (r0, a0), r1 = last, s.rate_rps
            return r0 + (r1 - r0) * (a0 - target) / (a0 - att)
        last = (s.rate_rps, att)
    return last[0]


def bracket(steps: Sequence[RateStep]) -> tuple[float | None, float | None]:
    """The search's bracket from its steps: the largest rate met with every lower rate met, and
    the next rate tried (None: never missed)."""
    met = None
    for s in sorted(steps, key=lambda s: s.rate_rps):
        if not s.meets:
            return met, s.rate_rps
        met = s.rate_rps
    return met, None


def trials_interval(steps: Sequence[RateStep], target: float) -> Interval:
    """Student t over the per-trial capacities, before any widening."""
    seeds = sorted({t.seed for s in steps for t in s.trials})
    return t_interval([per_trial_capacity(steps, seed, target) for seed in seeds],
                      CAPACITY_METHOD)


def capacity_result(steps: tuple[RateStep, ...], target: float) -> CapacityResult:
    top = max(s.rate_rps for s in steps)
    met, missed = bracket(steps)
    if met is None:
        return CapacityResult(steps, None, missed, None, top)
    t = trials_interval(steps, target)
    half = t.high - t.mean  # inf for one trial

    def widened(h: float, method: str) -> Interval:
        low = max(0.0, min(t.mean - h, met))  # no rate below 0
        high = max(t.mean + h, missed) if missed is not None else math.inf
        return Interval(t.mean, low, high, t.n, method)

    return CapacityResult(steps, met, missed, widened(half, CAPACITY_METHOD), top,
                          widened(half * math.sqrt(2), REPEAT_METHOD))


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys on xs (0 when xs do not vary)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def over_saturated(arrivals_s: Sequence[float], ends_s: Sequence[float],
                   ttfts_s: Sequence[float | None], ttft_limit_s: float) -> bool:
    """True when a run is clearly past its capacity: over the run, TTFT (from intended
    arrival) and the number of requests in flight at each arrival both rise (least-squares
    slopes > 0), and the fitted TTFT rise across the run exceeds the SLO's TTFT limit: the
    queue grows without bound. Inputs are per request, in one time base; a request that never
    got a first token has no TTFT and only counts towards the in-flight count."""
    if len(arrivals_s) < 8:
        return False
    order = sorted(range(len(arrivals_s)), key=lambda i: arrivals_s[i])
    xs = [arrivals_s[i] for i in order]
    inflight = [float(sum(1 for j in order if arrivals_s[j] <= x < ends_s[j])) for x in xs]
    timed = [(arrivals_s[i], v) for i in order if (v := ttfts_s[i]) is not None]
    if len(timed) < 8:
        return False
    ttft_slope = _slope([x for x, _ in timed], [v for _, v in timed])
    span_s = xs[-1] - xs[0]
    return (_slope(xs, inflight) > 0 and ttft_slope > 0
            and ttft_slope * span_s > ttft_limit_s)


def with_energy(r: CapacityResult, j_of: Callable[[float, int], float | None],
                target: float) -> CapacityResult:
    """`r` with each trial's J per output token from `j_of(rate, seed)` (energy fetched after
    the search, which decides on attainment alone)."""
    steps = tuple(rate_step(s.rate_rps, [Trial(t.seed, t.attainment, j_of(s.rate_rps, t.seed),
                                              t.over_saturated, t.lifetimes)
                                        for t in s.trials],
                            target, s.stopped_early)
                  for s in r.steps)
    return CapacityResult(steps, r.largest_met_rps, r.first_miss_rps, r.interval,
                          r.max_tested_rps, r.repeat)
