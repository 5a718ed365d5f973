"""The models of every endpoint, fed by the gateway (a record sink plus the loads routing saw)
and by the accounting service's apportioned energy; read by `slo_energy` and the admin API.

The shell's only I/O is the `energy_reader` callable it is given (the accounting service's
per-engine boundary, read in memory); everything else is plain data in, plain data out.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from core.records import RequestRecord
from gateway.config import GatewayConfig
from gateway.routing.base import Candidate, RoutingContext
from gateway.routing.capacity import SurplusMeter, engines_needed, slo_capacity, surplus_engines
from gateway.routing.models import CENTRES, Curves, EndpointModel, ModelSettings
from gateway.routing.pending import PendingPrefill
from gateway.routing.priors import prior_for
from gateway.routing.windows import EnergyWindows

# (wall-clock end of the last apportioned interval, cumulative joules there), or None
EnergyReader = Callable[[str], "tuple[float, float] | None"]
MAX_LOAD_SAMPLES = 4096  # per engine; halved when full (only recent dispatches are looked up)
STALE_S = 10.0  # a load routing saw longer ago than this counts as idle (capacity signal)


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    name: str
    model: str
    kind: str
    precision: str


class _LoadTrace:
    """Load of one engine as routing saw it, at the times it looked (a step function), with
    its running integral (load x s since the first sample) for mean loads over a span."""

    __slots__ = ("integral", "loads", "times")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.loads: list[float] = []
        self.integral: list[float] = []

    def add(self, t_s: float, load: float) -> None:
        if len(self.times) >= MAX_LOAD_SAMPLES:
            del self.times[: MAX_LOAD_SAMPLES // 2]
            del self.loads[: MAX_LOAD_SAMPLES // 2]
            del self.integral[: MAX_LOAD_SAMPLES // 2]
        area = (self.integral[-1] + self.loads[-1] * max(t_s - self.times[-1], 0.0)
                if self.times else 0.0)
        self.times.append(t_s)
        self.loads.append(load)
        self.integral.append(area)

    def at(self, t_s: float) -> float | None:
        i = bisect_right(self.times, t_s + 1e-9)
        return self.loads[i - 1] if i else None

    def _area(self, t_s: float) -> float:
        i = bisect_right(self.times, t_s)
        return self.integral[i - 1] + self.loads[i - 1] * (t_s - self.times[i - 1])

    def mean(self, t0_s: float, t1_s: float) -> float | None:
        """Time-weighted mean load over [t0_s, t1_s] (the part the trace still holds); the
        load at `t1_s` for an empty span, None before the first sample."""
        if not self.times or t1_s < self.times[0]:
            return None
        t0_s = max(t0_s, self.times[0])
        if t1_s - t0_s <= 1e-9:
            return self.at(t1_s)
        return (self._area(t1_s) - self._area(t0_s)) / (t1_s - t0_s)


class RoutingModels:
    """Per-endpoint `EndpointModel`s; call the instance with each finished record."""

    def __init__(self, endpoints: Iterable[EndpointInfo], *, grid_s: float = 1.0,
                 energy_reader: EnergyReader | None = None, poll_s: float = 0.5,
                 settings: ModelSettings | None = None,
                 capacity_ctx: RoutingContext | None = None,
                 clock: Callable[[], float] = time.monotonic):
        settings = settings or ModelSettings()
        self.info = {e.name: e for e in endpoints}
        self.models = {n: EndpointModel(prior_for(e.kind, e.precision), settings)
                       for n, e in self.info.items()}
        self.windows = {n: EnergyWindows(grid_s) for n in self.info}
        self.loads = {n: _LoadTrace() for n in self.info}
        self.pending = {n: PendingPrefill() for n in self.info}
        # what a routing decision updates per endpoint, in one lookup
        self._per_endpoint = {n: (self.loads[n], self.pending[n], self.models[n],
                                  self.windows[n]) for n in self.info}
        self.energy_reader = energy_reader
        self.poll_s = poll_s
        self._polled_s = float("-inf")
        # Hysteresis state of `slo_energy`: per (model, SLO class), the endpoints now full.
        self.full: dict[tuple[str, str], frozenset[str]] = {}
        # The SLO pools are sized for (None: no capacity signal, no surplus meter), and the
        # idle joules of engines beyond what their pool's load needed, stepped as routing runs.
        self.capacity_ctx = capacity_ctx
        self.clock = clock
        self.surplus = SurplusMeter(hold_s=STALE_S)
        self._ticked_s = float("-inf")

    @classmethod
    def for_config(cls, config: GatewayConfig, energy_reader: EnergyReader | None = None
                   ) -> RoutingModels:
        grid = config.accounting.interval_s if config.accounting is not None else 1.0
        r = config.routing
        settings = ModelSettings(min_samples=r.min_samples)
        return cls([EndpointInfo(ep.name, model, ep.kind, ep.precision)
                    for model, ep in config.endpoints()], grid_s=grid,
                   energy_reader=energy_reader, settings=settings,
                   capacity_ctx=capacity_context(config))

    def observe_loads(self, t_s: float, candidates: Iterable[Candidate]) -> None:
        """The loads routing saw at `t_s` (monotonic), one per candidate."""
        per_endpoint = self._per_endpoint
        for c in candidates:
            found = per_endpoint.get(c.name)
            if found is not None:
                trace, pending, model, _ = found
                load = c.load
                trace.add(t_s, load)
                # a dispatched prompt stays pending about as long as the TTFT predicted here,
                # behind the prefill already pending
                drain_s = model.latest_curves().ttft_burst(load, pending.prompt_mean,
                                                           pending.tokens)
                pending.observe(t_s, c.inflight, drain_s)
        if t_s - self._ticked_s >= self.poll_s:
            self.tick(t_s)

    def tick(self, now_s: float) -> None:
        """Step the surplus meter to `now_s` (the loads' clock): per pool, the engines beyond
        what its current load needs, at their learnt idle power."""
        if self.capacity_ctx is None:
            return
        self._ticked_s = now_s
        curves = self.curves()
        surplus: dict[str, float] = {}
        for need in self.pool_needs(self.capacity_ctx, now_s, STALE_S).values():
            for name in surplus_engines(need.names, need.capacities, need.needed):
                surplus[name] = curves[name].idle_w
        self.surplus.advance(now_s, surplus, {n: c.idle_w for n, c in curves.items()})

    def __call__(self, rec: RequestRecord) -> None:
        found = self._per_endpoint.get(rec.engine)
        if found is None or rec.dispatched_s is None:
            return
        trace, pending, model, windows = found
        pending.observe_request(float(rec.prompt_tokens), float(rec.completion_tokens))
        if rec.status == "ok":
            load = trace.at(rec.dispatched_s)
            if load is not None:
                model.observe_latency(load, rec.prompt_tokens, rec.latency.ttft_s,
                                      rec.latency.tpot_s, decode_load(trace, rec))
        windows.add_record(rec)
        if self.energy_reader is not None and rec.finished_s - self._polled_s >= self.poll_s:
            self._polled_s = rec.finished_s
            self.poll_energy()

    def poll_energy(self) -> None:
        """Read every engine's apportioned boundary; a new one closes an energy window."""
        if self.energy_reader is None:
            return
        for name, windows in self.windows.items():
            boundary = self.energy_reader(name)
            if boundary is None:
                continue
            window = windows.add_boundary(*boundary)
            if window is not None:
                self.models[name].observe_energy(window)

    def curves(self) -> Mapping[str, Curves]:
        """Each endpoint's curves, with the prefill pending on it now (when any)."""
        out = {}
        for n, m in self.models.items():
            c = m.curves()
            p = self.pending[n]
            out[n] = c if p.tokens < 0.5 else replace(
                c, pending_prefill_tokens=p.tokens, short_output_tokens=p.short_output_tokens)
        return out

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per endpoint, plain data for `/admin/v1/endpoints`: the curves by load bin, and the
        seconds it was surplus to its pool's load and the idle joules it burnt then."""
        self.tick(self.clock())
        out: dict[str, dict[str, Any]] = {}
        for name, m in self.models.items():
            c = m.curves()
            out[name] = {
                "surplus_s": round(self.surplus.seconds.get(name, 0.0), 3),
                "surplus_idle_j": round(self.surplus.joules.get(name, 0.0), 3),
                "cold": c.cold, "latency_samples": c.latency_samples,
                "energy_windows": c.energy_windows, "idle_w": round(c.idle_w, 3),
                "prefill_s_per_token": c.prefill_s_per_token,
                "step_prefill_s_per_token": c.step_prefill_s_per_token,
                "pending_prefill_tokens": round(self.pending[name].tokens, 1),
                "by_load": [{"load": load, "ttft_base_s": round(c.ttft_base_s[i], 6),
                             "tpot_s": round(c.tpot_s[i], 6), "power_w": round(c.power_w[i], 3),
                             "j_per_prompt_token": round(c.j_prompt[i], 6),
                             "j_per_output_token": round(c.j_out[i], 6)}
                            for i, load in enumerate(CENTRES)],
            }
        return out

    def pool_needs(self, ctx: RoutingContext, now_s: float, stale_s: float = 10.0
                   ) -> dict[tuple[str, str], PoolNeed]:
        """Per pool (model, precision): its load as routing last saw it (samples older than
        `stale_s` count as idle), each engine's SLO capacity under `ctx`'s SLO and margin,
        and the engines needed (gateway.routing.capacity)."""
        pools: dict[tuple[str, str], list[str]] = {}
        for name, e in self.info.items():
            pools.setdefault((e.model, e.precision), []).append(name)
        out = {}
        for pool, names in pools.items():
            load = 0.0
            for n in names:
                trace = self.loads[n]
                if trace.times and now_s - trace.times[-1] <= stale_s:
                    load += trace.loads[-1]
            caps = [slo_capacity(self.models[n].curves(), ctx) for n in names]
            out[pool] = PoolNeed(load, tuple(caps), engines_needed(load, caps), len(names),
                                 tuple(names))
        return out


def decode_load(trace: _LoadTrace, rec: RequestRecord) -> float | None:
    """The load a request decoded at: the trace's mean between its first token and its end,
    less the request itself (loads routing sees include the requests already resident, and a
    model's load excludes the request it predicts for)."""
    if rec.first_token_s is None:
        return None
    mean = trace.mean(rec.first_token_s, rec.finished_s)
    return None if mean is None else max(mean - 1.0, 0.0)


@dataclass(frozen=True, slots=True)
class PoolNeed:
    load: float  # requests resident on the pool's engines
    capacities: tuple[float, ...]  # each engine's SLO capacity (requests resident)
    needed: int
    engines: int
    names: tuple[str, ...] = ()  # the pool's engines, in `capacities`' order


def capacity_context(config: GatewayConfig) -> RoutingContext:
    """The SLO the capacity signal sizes pools for: the strictest limits among the SLO classes
    the tenants use (the default class without tenants), at the routing margin."""
    used = {t.slo_class for t in config.tenants} or {config.default_slo_class}
    classes = [config.slo(n) for n in sorted(used)]
    ttft = [c.ttft_s for c in classes if c.ttft_s is not None]
    tpot = [c.tpot_s for c in classes if c.tpot_s is not None]
    return RoutingContext(0, b"", ttft_slo_s=min(ttft) if ttft else None,
                          tpot_slo_s=min(tpot) if tpot else None,
                          slo_margin=config.routing.slo_margin, prompt_tokens=256.0)
