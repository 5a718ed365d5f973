"""Live state of every engine endpoint: health (active checks + outlier ejection) and load.

Two signals take an endpoint out of routing, as in Envoy: active health checks (its health
path), and outlier detection (its answers to real requests: `consecutive_failures` gateway-side
failures in a row, or failures making up `failure_percentage_threshold` of its recent requests,
eject it for base_ejection_s x its ejections, at most max_ejection_s, whatever its health path
says; at most max_ejection_percent of a pool at once, one always allowed).
Every failure of a real request counts, before the response head or after it (timeouts,
stalls, truncated or wrong-length bodies, unparsable answers, 5xx, an engine's 429). The last
endpoint that can serve a pool is never ejected.

Panic (Envoy's healthy-panic threshold): when fewer than panic_threshold_percent of a pool's
endpoints are available (passing health checks and not ejected), routing uses every endpoint
of the pool: one host stall that fails every health check at once must not turn a pool into
503s. An engine's 429 backs it off for its Retry-After: routing passes it over meanwhile
unless nothing else is left.

Each endpoint also keeps its recent success ratio (gateway.routing.success), which routing
weighs candidates by. The health/scrape loop is the only I/O here; routing reads
`candidate()` snapshots built from this state and stays pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import aiohttp

from core.tasks import cancel_and_wait
from engines.adapters import EngineAdapter, EngineLoad, MetricsParseError, adapter_for
from gateway.config import Endpoint, GatewayConfig
from gateway.config_upstream import HealthCheck
from gateway.routing import Candidate
from gateway.routing.success import WINDOW_TO_TAU, SuccessWindow

log = logging.getLogger("wattgate.upstreams")


class EndpointState:
    """Mutable per-process state of one endpoint."""

    __slots__ = ("_candidates", "_candidates_of", "adapter", "backoff_until", "checked",
                 "consecutive_failures", "ejected_until", "ejections", "endpoint", "failures",
                 "healthy", "inflight", "judged", "last_token_s", "load", "model", "recent",
                 "scrapes", "step_end_s", "successes")

    def __init__(self, model: str, endpoint: Endpoint):
        self.model = model
        self.endpoint = endpoint
        self.adapter: EngineAdapter = adapter_for(endpoint.kind)
        self.healthy = True  # optimistic until the first check says otherwise
        self.checked = False
        self.failures = 0
        self.successes = 0
        self.inflight = 0
        self.load = EngineLoad()
        self.scrapes = 0  # successful load scrapes
        self.consecutive_failures = 0  # gateway-side failures of real requests, in a row
        self.ejections = 0
        self.ejected_until = 0.0  # monotonic seconds
        self.backoff_until = 0.0  # monotonic seconds: its 429's Retry-After
        self.recent = SuccessWindow()  # real requests' outcomes, decayed (routing weighs by it)
        # the same since its last ejection: failure-percentage ejection judges it by these
        # alone, as Envoy does, or an engine back from an ejection at a busy engine's 50 %
        # would be ejected again, for twice as long, by its first failure
        self.judged = SuccessWindow()
        # its token events as this process relays them (monotonic): the last one, and the
        # last of the step before the one it belongs to (gateway/pipeline/flight.py)
        self.last_token_s = 0.0
        self.step_end_s = 0.0
        # routing's snapshots by in-flight count, for the scraped load and endpoint they show
        self._candidates: dict[int, Candidate] = {}
        self._candidates_of: tuple[EngineLoad, Endpoint] | None = None

    def inflight_now(self) -> float:
        return float(self.inflight)

    def ejected(self, now: float | None = None) -> bool:
        return self.ejected_until > (time.monotonic() if now is None else now)

    def healthy_now(self) -> float:
        return 1.0 if self.healthy and not self.ejected() else 0.0

    def candidate(self) -> Candidate:
        """Routing's snapshot of it. Routing asks on every request, and the snapshot changes
        only with the in-flight count or a scrape, so each one is built once per scrape."""
        load, ep = self.load, self.endpoint
        of = self._candidates_of
        if of is None or of[0] is not load or of[1] is not ep:
            self._candidates.clear()
            self._candidates_of = (load, ep)
        candidate = self._candidates.get(self.inflight)
        if candidate is None:
            candidate = self._candidates[self.inflight] = Candidate(
                name=ep.name, precision=ep.precision, inflight=self.inflight,
                running=load.running, waiting=load.waiting, kv_usage=load.kv_usage,
                weight=ep.weight)
        return candidate

    def observe(self, ok: bool, policy: HealthCheck) -> bool:
        """Fold one check result into the state; returns True when health flipped."""
        self.checked = True
        before = self.healthy
        if ok:
            self.successes += 1
            self.failures = 0
            if not self.healthy and self.successes >= policy.healthy_after:
                self.healthy = True
        else:
            self.failures += 1
            self.successes = 0
            if self.healthy and self.failures >= policy.unhealthy_after:
                self.healthy = False
        return before != self.healthy



class Upstreams:
    """All endpoints of all model pools, with their per-pool round-robin counters."""

    def __init__(self, config: GatewayConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self.pools: dict[str, list[EndpointState]] = {
            pool.name: [EndpointState(pool.name, ep) for ep in pool.endpoints]
            for pool in config.models
        }
        self.by_name: dict[str, EndpointState] = {
            s.endpoint.name: s for states in self.pools.values() for s in states
        }
        self.sequence: dict[str, int] = dict.fromkeys(self.pools, 0)
        self.on_health_change: Callable[[EndpointState], None] | None = None
        self.panicking: dict[str, bool] = dict.fromkeys(self.pools, False)  # last seen, to log
        self.tau_s = config.routing.success_window_s / WINDOW_TO_TAU

    def next_sequence(self, model: str) -> int:
        n = self.sequence[model]
        self.sequence[model] = n + 1
        return n

    def healthy(self, model: str, exclude: Sequence[str] = ()) -> list[EndpointState]:
        """The endpoints routing may use, less `exclude`: those passing health checks and not
        ejected; every endpoint of the pool when too few are (panic); in either case those
        not backed off by a 429, unless that leaves none."""
        pool = self.pools[model]
        now = self.clock()
        available = [s for s in pool if s.healthy and s.ejected_until <= now]
        panic = self.in_panic(model, len(available))
        if panic != self.panicking[model]:
            self.panicking[model] = panic
            if panic:
                log.warning("pool %s in panic: %d of %d endpoints available, under %g %%; "
                            "routing to all of them", model, len(available), len(pool),
                            self.config.outlier_detection.panic_threshold_percent)
            else:
                log.warning("pool %s out of panic", model)
        if panic:
            available = pool
        elif not available:  # panic disabled (threshold 0): ejected but healthy ones, if any
            available = [s for s in pool if s.healthy]
        # a first attempt excludes none: one list less per request
        usable = [s for s in available if s.endpoint.name not in exclude] if exclude \
            else available
        ready = [s for s in usable if s.backoff_until <= now]
        return ready or list(usable)  # a list of its own, never the pool's

    def in_panic(self, model: str, available: int | None = None) -> bool:
        """Fewer than panic_threshold_percent of the pool's endpoints pass health checks and
        are not ejected (`available`: that count, when the caller has it)."""
        pool = self.pools[model]
        if available is None:
            now = self.clock()
            available = sum(1 for s in pool if s.healthy and s.ejected_until <= now)
        threshold = self.config.outlier_detection.panic_threshold_percent
        return available * 100.0 < threshold * len(pool)

    def panic_now(self, model: str) -> float:
        """The pool's panic as a gauge value (1: in panic)."""
        return 1.0 if self.in_panic(model) else 0.0

    def ready(self) -> bool:
        """At least one checked-healthy endpoint per model."""
        return all(any(s.healthy and s.checked for s in states) for states in self.pools.values())

    def succeeded(self, state: EndpointState) -> None:
        """The engine answered a request (its answer, or its 4xx but 429, reached the client
        whole): its failure run ends."""
        state.consecutive_failures = 0
        now = self.clock()
        state.recent.record(True, now, self.tau_s)
        if not state.ejected(now):
            state.judged.record(True, now, self.tau_s)

    def backed_off(self, state: EndpointState, duration_s: float) -> None:
        """The engine said it is out of capacity for `duration_s` (its 429's Retry-After)."""
        state.backoff_until = max(state.backoff_until, self.clock() + duration_s)

    def failed(self, state: EndpointState) -> None:
        """A gateway-side failure of a real request on this engine, before or after the
        response head (connect error, timeout, stall, invalid HTTP, 5xx, 429, a broken,
        truncated or unparsable answer); ejects it after a run of them, or when failures
        make up failure_percentage_threshold of its recent requests."""
        now = self.clock()
        state.recent.record(False, now, self.tau_s)
        state.consecutive_failures += 1
        policy = self.config.outlier_detection
        if state.ejected(now):
            return
        state.judged.record(False, now, self.tau_s)
        if state.consecutive_failures >= policy.consecutive_failures:
            reason = f"{state.consecutive_failures} failures in a row"
        else:
            percent = state.judged.failure_percent(now, self.tau_s,
                                                   policy.failure_percentage_request_volume)
            if not policy.failure_percentage_threshold \
                    or percent < policy.failure_percentage_threshold:
                return
            reason = f"{percent:.0f} % of its recent requests failed"
        if self._may_eject(state, now):
            self._eject(state, now, reason)

    def _may_eject(self, state: EndpointState, now: float) -> bool:
        """At most max_ejection_percent of the pool out at once (one always may be), and
        never the last endpoint that can serve it."""
        pool = self.pools[state.model]
        ejected = sum(1 for s in pool if s.ejected(now))
        if ejected and (ejected + 1) * 100.0 > \
                self.config.outlier_detection.max_ejection_percent * len(pool):
            return False
        return any(s.healthy and not s.ejected(now) for s in pool if s is not state)

    def _eject(self, state: EndpointState, now: float, reason: str) -> None:
        policy = self.config.outlier_detection
        state.ejections += 1
        duration_s = min(policy.base_ejection_s * state.ejections, policy.max_ejection_s)
        state.ejected_until = now + duration_s
        state.consecutive_failures = 0
        state.judged = SuccessWindow()
        log.warning("endpoint %s ejected for %.0f s: %s", state.endpoint.name, duration_s, reason)
        if self.on_health_change:
            self.on_health_change(state)

    # --- active checks ------------------------------------------------------------------

    async def check_once(self, session: aiohttp.ClientSession) -> None:
        await asyncio.gather(*(self._check(session, s) for s in self.by_name.values()))

    async def _check(self, session: aiohttp.ClientSession, state: EndpointState) -> None:
        policy = self.config.health
        timeout = aiohttp.ClientTimeout(total=policy.timeout_s)
        ok = False
        try:
            async with session.get(state.endpoint.url + state.adapter.health_path,
                                   timeout=timeout) as resp:
                await resp.read()
                ok = resp.status == 200
            if ok and policy.scrape_metrics and state.adapter.metrics_path:
                await self._scrape(session, state, timeout)
        except (aiohttp.ClientError, TimeoutError, OSError):
            ok = False
        if state.observe(ok, policy):
            log.warning("endpoint %s is now %s", state.endpoint.name,
                        "healthy" if state.healthy else "unhealthy")
            if self.on_health_change:
                self.on_health_change(state)

    async def _scrape(self, session: aiohttp.ClientSession, state: EndpointState,
                      client_timeout: aiohttp.ClientTimeout) -> None:
        assert state.adapter.metrics_path is not None
        async with session.get(state.endpoint.url + state.adapter.metrics_path,
                               timeout=client_timeout) as resp:
            body = await resp.read()
        if resp.status != 200:
            return
        try:
            state.load = state.adapter.parse_load(body)
            state.scrapes += 1
        except MetricsParseError as exc:
            log.warning("endpoint %s: unreadable metrics: %s", state.endpoint.name, exc)

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Check every endpoint each interval until cancelled."""
        while True:
            await self.check_once(session)
            await asyncio.sleep(self.config.health.interval_s)

    @contextlib.asynccontextmanager
    async def running(self, session: aiohttp.ClientSession):  # type: ignore[no-untyped-def]
        task = asyncio.create_task(self.run(session), name="wattgate-health")
        try:
            yield self
        finally:
            await cancel_and_wait(task)
