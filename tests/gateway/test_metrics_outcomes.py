"""`wattgate_requests_total` carries each request's outcome class beside its status, and
`wattgate_slo_met_total` counts only served requests that met their SLO: a refusal or a
cancellation is neither a hit nor a miss, a failure is a miss."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.records import RequestRecord
from core.timing import latency, slo_met
from core.vocab import SloClass
from gateway.serving_metrics import GatewayMetrics

pytestmark = pytest.mark.timeout(10)

SLO = SloClass("interactive", ttft_s=0.5, tpot_s=0.05)


def record(status: str, http_status: int, ttft_s: float = 0.1, tenant: str = "acme"
           ) -> RequestRecord:
    """A finished request as the record step builds it: its SLO judged by core.timing."""
    reads = (ttft_s, ttft_s + 0.02, ttft_s + 0.04) if status == "ok" else ()
    lat = latency(0.0, tuple((t, 1) for t in reads), len(reads),
                  reads[-1] if reads else None)
    return RequestRecord(
        request_id="r", tenant=tenant, model="m", engine="e1" if http_status != 401 else "",
        precision="bf16", slo_class="interactive", status=status, http_status=http_status,
        stream=True, arrived_wall_s=1000.0, arrived_s=0.0, dispatched_s=None,
        first_byte_s=None, first_token_s=reads[0] if reads else None,
        finished_s=reads[-1] if reads else 0.01, read_times=reads,
        read_events=tuple(1 for _ in reads), prompt_tokens=10,
        completion_tokens=len(reads), attempts=1, latency=lat,
        slo_met=slo_met(SLO, lat, status == "ok"))


def samples(metrics: GatewayMetrics, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for family in text_string_to_metric_families(metrics.render().decode()):
        out += [(s.labels, s.value) for s in family.samples if s.name == name]
    return out


def by_outcome(metrics: GatewayMetrics) -> dict[str, float]:
    totals: dict[str, float] = {}
    for labels, value in samples(metrics, "wattgate_requests_total"):
        totals[labels["outcome"]] = totals.get(labels["outcome"], 0.0) + value
    return totals


ENDINGS = [  # (status, http status, class)
    ("ok", 200, "served"),
    ("rate_limit_exceeded", 429, "refused"),
    ("budget_exceeded", 429, "refused"),
    ("invalid_api_key", 401, "refused"),
    ("upstream_http_400", 400, "refused"),  # the engine says the request itself is invalid
    ("client_disconnected", 499, "cancelled"),
    ("upstream_timeout", 504, "failed"),
    ("upstream_http_429", 429, "failed"),  # an engine out of capacity
    ("upstream_http_502", 502, "failed"),
    ("upstream_error_event", 200, "failed"),  # an error after the client had its 200
]


def test_every_ending_is_counted_with_its_status_and_outcome_class() -> None:
    metrics = GatewayMetrics()
    for status, http_status, _ in ENDINGS:
        metrics.observe(record(status, http_status))
    seen = {(labels["status"], labels["outcome"])
            for labels, value in samples(metrics, "wattgate_requests_total") if value == 1}
    assert seen == {(status, cls) for status, _, cls in ENDINGS}


def test_refused_and_cancelled_requests_are_not_slo_misses() -> None:
    """Two served (one met, one missed its TTFT), one failed: attainment is 1/3 whatever
    the refusals and cancellations around them."""
    metrics = GatewayMetrics()
    metrics.observe(record("ok", 200, ttft_s=0.1))
    metrics.observe(record("ok", 200, ttft_s=0.9))
    metrics.observe(record("upstream_timeout", 504))
    for _ in range(20):
        metrics.observe(record("budget_exceeded", 429))
        metrics.observe(record("invalid_api_key", 401))
        metrics.observe(record("client_disconnected", 499))
    met = sum(v for _, v in samples(metrics, "wattgate_slo_met_total"))
    outcomes = by_outcome(metrics)
    assert met == 1
    assert outcomes == {"served": 2, "failed": 1, "refused": 40, "cancelled": 20}
    assert met / (outcomes["served"] + outcomes["failed"]) == pytest.approx(1 / 3)


def test_the_same_status_with_another_http_status_keeps_its_own_class() -> None:
    """The cached counter is keyed by status and HTTP status: a gateway error whose code is
    reused with another status is not counted in the first one's class."""
    metrics = GatewayMetrics()
    metrics.observe(record("upstream_error", 502))
    metrics.observe(record("upstream_error", 400))
    metrics.observe(record("upstream_error", 502))
    assert by_outcome(metrics) == {"failed": 2, "refused": 1}


def test_tenants_are_counted_apart() -> None:
    metrics = GatewayMetrics()
    metrics.observe(record("ok", 200, tenant="acme"))
    metrics.observe(dataclasses.replace(record("budget_exceeded", 429), tenant="initech"))
    rows = {(labels["tenant"], labels["outcome"]): value
            for labels, value in samples(metrics, "wattgate_requests_total")}
    assert rows == {("acme", "served"): 1, ("initech", "refused"): 1}
