"""What the gateway measures of serving, as Prometheus series on an explicit registry: requests
by outcome, latencies (TTFT, TPOT, ITL, end to end), tokens, retries, engine errors, endpoint
health and load. Bounded labels only.

Labels: model, precision, engine, tenant, slo_class, status, outcome — never request ids.
`wattgate_requests_total` carries the request's `status` and its `outcome` class (served, refused,
failed, cancelled: core/outcomes.py). Goodput per SLO class is
`rate(wattgate_slo_met_total[5m])`; attainment divides it by the served and failed requests
(`outcome=~"served|failed"`), so refusals and cancellations are neither hits nor misses.
The definitions are in docs/operations.md ("Outcomes").
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from core.outcomes import outcome_class
from core.records import RequestRecord
from gateway.lockfree_metrics import CounterChild, FastCollector, FastCounter, FastHistogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5,
                    2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TOKEN_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                       0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)

REQUEST_LABELS = ("model", "precision", "engine", "tenant", "slo_class")
CONTENT_TYPE = CONTENT_TYPE_LATEST


class GatewayMetrics:
    """The gateway's metric families; `observe(record)` is the one call on the request path.

    Per-request families are lock-free (gateway.lockfree_metrics); gauges and the rarer counters use
    prometheus_client directly. All live on one explicit registry.
    """

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = FastCounter("wattgate_requests",
                                    "Requests finished, by status and outcome class",
                                    [*REQUEST_LABELS, "status", "outcome"])
        self.slo_met = FastCounter("wattgate_slo_met",
                                   "Served requests that met every limit of their SLO class",
                                   REQUEST_LABELS)
        self.ttft = FastHistogram("wattgate_ttft_seconds", "Time to first token-bearing event",
                                  REQUEST_LABELS, _LATENCY_BUCKETS)
        self.tpot = FastHistogram("wattgate_tpot_seconds", "Time per output token after the first",
                                  REQUEST_LABELS, _TOKEN_TIME_BUCKETS)
        self.itl = FastHistogram("wattgate_itl_seconds",
                                 "Gap between consecutive token-bearing events",
                                 ("model", "precision", "engine"), _TOKEN_TIME_BUCKETS)
        self.itl_norm = FastHistogram("wattgate_itl_per_token_seconds",
                                      "ITL divided by the mean tokens per event of its request",
                                      ("model", "precision", "engine"), _TOKEN_TIME_BUCKETS)
        self.e2e = FastHistogram("wattgate_e2e_seconds", "Request start to last token",
                                 REQUEST_LABELS, _E2E_BUCKETS)
        self.queue = FastHistogram("wattgate_gateway_queue_seconds",
                                   "Arrival to upstream dispatch inside the gateway", ("model",),
                                   (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
                                    0.1, 0.5, 1.0))
        self.upstream = FastHistogram("wattgate_upstream_seconds",
                                      "Upstream dispatch to the end of the response",
                                      ("model", "engine"), _E2E_BUCKETS)
        self.prompt_tokens = FastCounter("wattgate_prompt_tokens", "Prompt tokens (engine usage)",
                                         REQUEST_LABELS)
        self.completion_tokens = FastCounter("wattgate_completion_tokens",
                                             "Completion tokens (engine usage)", REQUEST_LABELS)
        r.register(FastCollector([self.requests, self.slo_met, self.ttft, self.tpot, self.itl,
                                  self.itl_norm, self.e2e, self.queue, self.upstream,
                                  self.prompt_tokens, self.completion_tokens]))
        self.inflight = Gauge("wattgate_requests_in_flight", "Requests being served now",
                              ("model", "engine"), registry=r)
        self.upstream_errors = Counter("wattgate_upstream_errors",
                                       "Upstream failures by engine and reason",
                                       ("engine", "reason"), registry=r)
        self.retries = Counter("wattgate_retries", "Requests re-sent to another endpoint",
                               ("model",), registry=r)
        self.retries_refused = Counter("wattgate_retries_refused",
                                       "Retries not made: the retry budget was spent",
                                       ("model",), registry=r)
        self.local_errors = Counter("wattgate_local_errors",
                                    "The gateway's own resource errors (EMFILE, ENFILE, ENOMEM, "
                                    "...): never an engine's fault", ("reason",), registry=r)
        self.client_errors = Counter("wattgate_client_connection_errors",
                                     "Client connections the edge refused and closed: a limit "
                                     "(timeouts, size, connections) or malformed HTTP",
                                     ("reason",), registry=r)
        self.endpoint_healthy = Gauge("wattgate_endpoint_healthy",
                                      "1 when the endpoint passes health checks",
                                      ("model", "engine", "precision"), registry=r)
        self.pool_panic = Gauge("wattgate_pool_panic",
                                "1 while too few of the pool's endpoints are healthy and "
                                "routing uses all of them (outlier_detection."
                                "panic_threshold_percent)", ("model",), registry=r)
        # The capacity signal for an autoscaler (docs/routing.md): engines of a pool the
        # current load needs to meet its SLO when packed as slo_energy packs it
        self.pool_engines_needed = Gauge(
            "wattgate_pool_engines_needed",
            "Engines of a (model, precision) pool the current load needs to meet its SLO",
            ("model", "precision"), registry=r)
        self._children: dict[tuple[str, ...], tuple[Any, ...]] = {}
        # (labels, status, http status) -> the requests child: the outcome class is worked
        # out once per such key, not per request
        self._request_counters: dict[tuple[tuple[str, ...], str, int], CounterChild] = {}

    def _request_children(self, key: tuple[str, ...]) -> tuple[Any, ...]:
        children = self._children.get(key)
        if children is None:
            model, precision, engine = key[0], key[1], key[2]
            children = (self.slo_met.labels(*key), self.ttft.labels(*key), self.tpot.labels(*key),
                        self.e2e.labels(*key), self.prompt_tokens.labels(*key),
                        self.completion_tokens.labels(*key),
                        self.itl.labels(model, precision, engine),
                        self.itl_norm.labels(model, precision, engine),
                        self.queue.labels(model), self.upstream.labels(model, engine))
            self._children[key] = children
        return children

    def _requests_child(self, key: tuple[str, ...], status: str, http_status: int
                        ) -> CounterChild:
        child = self.requests.labels(*key, status, outcome_class(status, http_status))
        self._request_counters[key, status, http_status] = child
        return child

    def observe(self, rec: RequestRecord) -> None:
        key = (rec.model, rec.precision, rec.engine, rec.tenant, rec.slo_class)
        status, http_status = rec.status, rec.http_status
        counter = self._request_counters.get((key, status, http_status))
        if counter is None:
            counter = self._requests_child(key, status, http_status)
        counter.inc()
        (slo_met, ttft, tpot, e2e, prompt, completion, itl, itl_norm, queue,
         upstream) = self._request_children(key)
        if rec.slo_met:  # only a served request can meet its SLO (core.timing.slo_met)
            slo_met.inc()
        lat = rec.latency
        if rec.status == "ok":
            if lat.ttft_s is not None:
                ttft.observe(lat.ttft_s)
            if lat.tpot_s is not None:
                tpot.observe(lat.tpot_s)
            if lat.e2e_s is not None:
                e2e.observe(lat.e2e_s)
            if lat.itl_s:
                itl.observe_many(lat.itl_s)
                itl_norm.observe_many(lat.itl_norm_s)
        if rec.prompt_tokens:
            prompt.inc(rec.prompt_tokens)
        if rec.completion_tokens:
            completion.inc(rec.completion_tokens)
        if rec.dispatched_s is not None:
            queue.observe(rec.dispatched_s - rec.arrived_s)
            upstream.observe(rec.finished_s - rec.dispatched_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
