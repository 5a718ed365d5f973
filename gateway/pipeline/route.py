"""The route step: which endpoint serves the request.

`eligible` and `context` are pure (live state in, a choice out); `Router` is the shell that
reads the live endpoint state and the learnt models, and writes back what the choice changed
(the round-robin counter, the learnt load trace, slo_energy's set of full endpoints).

Whatever the policy, it chooses among the candidates that pass the success weighting
(gateway.routing.success): an engine with recent failures stays in the running only with
probability equal to its recent success ratio, so one that fails fast loses its traffic.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence

from core.errors import RoutingError
from core.vocab import SloClass
from gateway.config import GatewayConfig, PrecisionPolicy, Routing
from gateway.requests import PreparedRequest
from gateway.routing import Candidate, RoutingContext, policy_for, select_precisions
from gateway.routing.learner import RoutingModels
from gateway.routing.models import Curves
from gateway.routing.slo_energy import next_full
from gateway.routing.success import admitted
from gateway.upstreams import EndpointState, Upstreams

EMBEDDINGS_PATH = "/v1/embeddings"
_ELIGIBLE_CACHE_MAX = 1024  # (healthy set, override, policy, SLO class) answers kept


def eligible(healthy: Sequence[EndpointState], req: PreparedRequest, precision: str | None,
             policy: PrecisionPolicy, slo_class: str, floor: float | None,
             quality: Mapping[str, float]) -> list[EndpointState]:
    """The healthy endpoints the request may go to: at a precision the tenant's policy and
    the override (`precision`) allow, and, without an override, no worse than the SLO
    class's quality `floor`. Raises RoutingError when none is left."""
    precisions = select_precisions(policy, precision, {s.endpoint.precision for s in healthy})
    states = [s for s in healthy if s.endpoint.precision in precisions]
    if not states:
        wanted = f" at precision {precision}" if precision else ""
        raise RoutingError(f"no healthy endpoint can serve model {req.model!r}{wanted}")
    if floor is not None and precision is None:
        states = [s for s in states if quality.get(s.endpoint.precision, 1.0) >= floor]
        if not states:
            raise RoutingError(f"no healthy endpoint of model {req.model!r} meets the "
                               f"quality floor {floor:g} of SLO class {slo_class!r}")
    return states


def endpoint_quality(config: GatewayConfig) -> dict[str, float]:
    """Per precision, the lowest quality score its endpoints state (an endpoint without one
    has its format's published figure, core/quality.py)."""
    out: dict[str, float] = {}
    for _, ep in config.endpoints():
        if ep.quality is not None:
            out[ep.precision] = min(out.get(ep.precision, 1.0), ep.quality.score)
    return out


def context(req: PreparedRequest, sequence: int, routing: Routing, slo: SloClass | None,
            curves: Mapping[str, Curves] | None) -> RoutingContext:
    """What the policy sees beside the candidates. `slo` and `curves` only for slo_energy
    (the request's size against the SLO class, on the learnt curves)."""
    if slo is None or curves is None:
        return RoutingContext(sequence, req.prefix_key, routing.load_bound)
    output = routing.default_output_tokens if req.max_tokens is None else req.max_tokens
    return RoutingContext(sequence, req.prefix_key, routing.load_bound, ttft_slo_s=slo.ttft_s,
                          tpot_slo_s=slo.tpot_s, slo_margin=routing.slo_margin,
                          prompt_tokens=req.prompt_estimate or 0.0, output_tokens=float(output),
                          curves=curves)


class Router:
    """Reads the live endpoint state, asks the pure functions above, commits the result."""

    __slots__ = ("_eligible_cache", "clock", "config", "draw", "floors", "models", "policy",
                 "quality", "routing", "slo_energy", "upstreams")

    def __init__(self, config: GatewayConfig, upstreams: Upstreams,
                 models: RoutingModels | None, clock: Callable[[], float],
                 draw: Callable[[], float] | None = None):
        """`draw`: uniform numbers in [0, 1) for the success weighting (seeded in tests)."""
        self.config = config
        self.draw = draw or random.Random().random
        self.routing = routing = config.routing
        self.upstreams = upstreams
        self.models = models
        self.clock = clock
        self.policy = policy_for(routing.policy)
        self.floors = dict(routing.min_quality)  # SLO class -> least quality it accepts
        # precision -> its score: routing.quality, else its endpoints' lowest `quality`
        self.quality = {**endpoint_quality(config), **dict(routing.quality)}
        self.slo_energy = routing.policy == "slo_energy" and models is not None
        self._eligible_cache: dict[tuple[object, ...],
                                   tuple[PrecisionPolicy, list[EndpointState]]] = {}

    @property
    def prefix_chars(self) -> int:
        """How much of the prompt the policy reads (0: none)."""
        return self.routing.prefix_chars if self.routing.policy == "prefix_affinity" else 0

    def choose(self, req: PreparedRequest, policy: PrecisionPolicy, slo_class: str,
               precision: str | None, tried: Sequence[str], path: str) -> EndpointState:
        """One endpoint not in `tried` for the request; raises RoutingError when none fits.
        `precision`: the request's override, or the one a budget downgrade forces."""
        healthy = self.upstreams.healthy(req.model, exclude=tried)
        if path == EMBEDDINGS_PATH:  # only engine kinds that serve embeddings
            healthy = [s for s in healthy if s.adapter.serves_embeddings]
        states = self._eligible(healthy, req, precision, policy, slo_class)
        candidates = [s.candidate() for s in states]
        models = self.models
        if models is not None:
            # the learnt models see the loads routing saw, to pair each record with the load
            # it was dispatched at
            models.observe_loads(self.clock(), candidates)
        if len(states) == 1:
            return states[0]
        sequence = self.upstreams.next_sequence(req.model)
        if not self.slo_energy or models is None:
            ctx = context(req, sequence, self.routing, None, None)
        else:  # the full set follows every candidate's load, chosen or not
            ctx = self._with_full(models, req.model, slo_class, candidates,
                                  context(req, sequence, self.routing,
                                          self.config.slo(slo_class), models.curves()))
        kept = self._weighed(states)
        if kept is not None:
            states = [states[i] for i in kept]
            if len(states) == 1:
                return states[0]
            candidates = [candidates[i] for i in kept]
        return states[self.policy(candidates, ctx)]

    def _weighed(self, states: Sequence[EndpointState]) -> list[int] | None:
        """The indices of `states` the success weighting keeps; None (all of them, no draw)
        when none has a recent failure, the usual case."""
        now = self.upstreams.clock()  # the clock the outcomes were recorded on
        tau_s = self.upstreams.tau_s
        ratios = [s.recent.ratio(now, tau_s) for s in states]
        if min(ratios) >= 1.0:
            return None
        return admitted(ratios, self.draw, self.routing.success_floor)

    def _eligible(self, healthy: Sequence[EndpointState], req: PreparedRequest,
                  precision: str | None, policy: PrecisionPolicy, slo_class: str
                  ) -> list[EndpointState]:
        """`eligible`, kept per (healthy endpoints, override, policy, SLO class): routing
        asks it on every request and the answer changes only with health. (The policy is
        keyed by identity and kept beside the answer, so a reloaded tenant is not confused
        with the one whose id it reuses.) A refusal is not kept: it raises each time."""
        key = (tuple(healthy), precision, slo_class, id(policy))
        hit = self._eligible_cache.get(key)
        if hit is not None and hit[0] is policy:
            return hit[1]
        states = eligible(healthy, req, precision, policy, slo_class, self.floors.get(slo_class),
                          self.quality)
        if len(self._eligible_cache) >= _ELIGIBLE_CACHE_MAX:
            self._eligible_cache.clear()
        self._eligible_cache[key] = (policy, states)
        return states

    def _with_full(self, models: RoutingModels, model: str, slo_class: str,
                   candidates: Sequence[Candidate], ctx: RoutingContext) -> RoutingContext:
        """slo_energy: the endpoints held as full for (model, SLO class), updated with the
        hysteresis and kept for the next request."""
        pool = (model, slo_class)
        full = next_full(models.full.get(pool, frozenset()), candidates, ctx,
                         self.routing.hysteresis)
        models.full[pool] = full
        return dataclasses.replace(ctx, full=full)
