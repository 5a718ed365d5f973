"""How a request ended: one table of outcomes, and the flight's endings read from it."""

from __future__ import annotations

import pytest

from core.errors import RequestError, UpstreamTimeoutError
from core.outcomes import OUTCOMES, counts_for_slo, engine_outcome, error_outcome, outcome_class
from core.vocab import OUTCOME_CLASSES, Outcome
from gateway.pipeline.flight import Flight

pytestmark = pytest.mark.timeout(10)


def flight() -> Flight:
    return Flight("rid", 1.0, 1000.0, "interactive")


def test_each_fixed_outcome_has_its_status_and_http_code() -> None:
    assert {name: tuple(row) for name, row in OUTCOMES.items()} == {
        "ok": ("ok", 200), "client_disconnected": ("client_disconnected", 499),
        "internal_error": ("internal_error", 500),
        "upstream_error_event": ("upstream_error_event", 200)}


def test_every_outcome_name_is_in_the_vocabulary_and_the_table() -> None:
    from typing import get_args
    assert set(get_args(Outcome)) == set(OUTCOMES)


def test_a_client_that_leaves_before_the_end_is_disconnected_after_it_ok() -> None:
    early = flight()
    early.client_gone()
    assert (early.status, early.http_status) == ("client_disconnected", 499)
    late = flight()
    late.delivered = True
    late.client_gone()
    assert (late.status, late.http_status) == ("ok", 200)


def test_an_error_ends_the_request_with_its_own_code_and_status() -> None:
    f = flight()
    f.fail(UpstreamTimeoutError("slow"))
    assert (f.status, f.http_status) == ("upstream_timeout", 504)
    assert error_outcome(RequestError("bad", code="invalid_type")) == ("invalid_type", 400)


def test_an_engines_own_refusal_is_named_by_its_status() -> None:
    f = flight()
    f.engine_refused(429)
    assert (f.status, f.http_status) == ("upstream_http_429", 429) == engine_outcome(429)


def test_end_sets_a_fixed_outcome() -> None:
    f = flight()
    f.end("upstream_error_event")
    assert (f.status, f.http_status) == ("upstream_error_event", 200)


def test_response_headers_name_the_request_endpoint_and_the_tenant_controls() -> None:
    from gateway.config import Endpoint
    from gateway.tenancy.admission import Ticket
    from gateway.upstreams import EndpointState

    f = flight()
    assert f.response_headers() == {"x-wattgate-request-id": "rid"}
    f.ticket = Ticket("t", headers={"x-ratelimit-remaining-requests": "4"})
    f.endpoint = EndpointState("m", Endpoint(name="e1", url="http://127.0.0.1:1",
                                                   kind="vllm", precision="fp8"))
    assert f.response_headers() == {"x-wattgate-request-id": "rid",
                                    "x-ratelimit-remaining-requests": "4",
                                    "x-wattgate-endpoint": "e1", "x-wattgate-precision": "fp8"}


@pytest.mark.parametrize(("status", "http_status", "expected"), [
    ("ok", 200, "served"),
    ("client_disconnected", 499, "cancelled"),
    ("rate_limited", 429, "refused"),  # the gateway's policy: the tenant's limit
    ("budget_exceeded", 429, "refused"),
    ("invalid_api_key", 401, "refused"),
    ("payload_too_large", 413, "refused"),
    ("upstream_http_400", 400, "refused"),  # the engine says the request itself is invalid
    ("upstream_http_429", 429, "failed"),  # the engine is out of capacity: its failure
    ("upstream_timeout", 504, "failed"),
    ("no_healthy_endpoint", 503, "failed"),
    ("internal_error", 500, "failed"),
    ("upstream_error_event", 200, "failed"),  # broke after the client had its 200
])
def test_every_ending_falls_in_one_outcome_class(status: str, http_status: int,
                                                 expected: str) -> None:
    assert outcome_class(status, http_status) == expected


def test_attainment_counts_served_and_failed_requests_only() -> None:
    assert [c for c in OUTCOME_CLASSES if counts_for_slo(c)] == ["served", "failed"]
