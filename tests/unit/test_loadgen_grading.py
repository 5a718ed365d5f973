"""The load generator grades requests by the gateway's outcome classes: an error answer by the
status the gateway recorded for it, attainment over served and failed requests, refusals and
cancellations in their own columns."""

from __future__ import annotations

import orjson
import pytest

from core.errors import error_body
from gateway.config import SloClass
from loadgen import report, run_summary
from loadgen.client import Target
from loadgen.results import RequestResult, answer_status, client_outcome
from loadgen.runner import RunOutcome

SLO = SloClass("fast", ttft_s=0.1, tpot_s=0.02)


def gateway_error(code: str) -> bytes:
    return error_body("no", "requests", code)


@pytest.mark.parametrize(("http_status", "body", "by_gateway", "status", "cls"), [
    # the gateway's own refusals, named by their code
    (429, gateway_error("budget_exceeded"), True, "budget_exceeded", "refused"),
    (429, gateway_error("rate_limit_exceeded"), True, "rate_limit_exceeded", "refused"),
    (401, gateway_error("invalid_api_key"), True, "invalid_api_key", "refused"),
    (413, gateway_error("request_too_large"), True, "request_too_large", "refused"),
    # the gateway's own failures
    (503, gateway_error("no_healthy_endpoint"), True, "no_healthy_endpoint", "failed"),
    (504, gateway_error("upstream_timeout"), True, "upstream_timeout", "failed"),
    # an engine's 429 relayed (x-wattgate-endpoint), whatever code it gave: its failure
    (429, gateway_error("engine_rate_limited"), False, "upstream_http_429", "failed"),
    (429, b"slow down", False, "upstream_http_429", "failed"),
    # an engine's other 4xx: the request itself is invalid
    (400, gateway_error("bad_prompt"), False, "upstream_http_400", "refused"),
    # an engine met directly (no gateway headers), or a body with no string code
    (503, b'{"object": "error", "code": 503}', False, "upstream_http_503", "failed"),
    (429, b'{"error": {"code": 429}}', True, "upstream_http_429", "failed"),
    (500, b"<html>oops</html>", True, "upstream_http_500", "failed"),
])
def test_an_error_answer_is_graded_by_the_status_the_gateway_recorded(
        http_status: int, body: bytes, by_gateway: bool, status: str, cls: str) -> None:
    assert answer_status(http_status, body, by_gateway) == status
    assert client_outcome(f"http_{http_status}", http_status, status) == cls


@pytest.mark.parametrize(("status", "http_status", "cls"), [
    ("ok", 200, "served"),
    ("cancelled", 0, "cancelled"),  # the run's deadline passed: this client left
    ("timeout", 0, "failed"),
    ("connect_error", 0, "failed"),
    ("client_error", 0, "failed"),
    ("stream_error", 200, "failed"),  # an error event, or no token, after the 200
])
def test_no_answer_or_a_broken_one_is_a_failure_and_a_deadline_a_cancellation(
        status: str, http_status: int, cls: str) -> None:
    assert client_outcome(status, http_status, "") == cls


def result(i: int, tenant: str, status: str = "ok", ttft_s: float = 0.05,
           http_status: int = 200, code: str = "") -> RequestResult:
    ok = status == "ok"
    reads = tuple((ttft_s + k * 0.01, 1) for k in range(5)) if ok else ()
    return RequestResult(i, tenant, "fast", 0.0, 0.0, reads[0][0] if ok else None,
                         reads[-1][0] if ok else 0.01, reads, 10, len(reads), status,
                         http_status, f"r{i}", code=code)


def mixed() -> list[RequestResult]:
    """initech: 1 served (met), 40 refused at its budget; acme: 3 served (2 met), 1 engine
    504, 1 cancelled, 2 refused for a bad key."""
    rs = [result(0, "initech")]
    rs += [result(1 + i, "initech", "http_429", http_status=429, code="budget_exceeded")
           for i in range(40)]
    rs += [result(50, "acme"), result(51, "acme"), result(52, "acme", ttft_s=0.5),
           result(53, "acme", "http_504", http_status=504, code="upstream_timeout"),
           result(54, "acme", "cancelled", http_status=0),
           result(55, "acme", "http_401", http_status=401, code="invalid_api_key"),
           result(56, "acme", "http_401", http_status=401, code="invalid_api_key")]
    return rs


def test_attainment_is_over_served_and_failed_requests_refusals_apart() -> None:
    s, ms = run_summary.summarize(mixed(), lambda _: SLO, requested_rate_rps=1.0, closed_loop=True)
    assert (s.requests, s.ok, s.refused, s.failed, s.cancelled) == (48, 4, 42, 1, 1)
    assert s.attainment == pytest.approx(3 / 5)  # not 3 / 48
    tenants = {g.name: g for g in s.per_tenant}
    assert tenants["initech"].attainment == 1.0  # not 1 / 41: its 429s are refusals
    assert (tenants["initech"].refused, tenants["initech"].failed) == (40, 0)
    assert tenants["acme"].attainment == pytest.approx(2 / 4)
    assert (tenants["acme"].refused, tenants["acme"].failed, tenants["acme"].cancelled) == (
        2, 1, 1)
    assert s.goodput_rps == pytest.approx(3 / s.duration_s)
    assert sum(m.slo_met for m in ms) == 3


def test_a_group_with_nothing_served_or_failed_has_no_attainment() -> None:
    rs = [result(i, "initech", "http_429", http_status=429, code="budget_exceeded")
          for i in range(5)]
    s, _ = run_summary.summarize(rs, lambda _: SLO, requested_rate_rps=1.0, closed_loop=True)
    assert s.graded and s.attainment is None and s.per_tenant[0].attainment is None
    assert report.tenant_rows(outcome(rs))[0][8] == "n/a"


def outcome(rs: list[RequestResult]) -> RunOutcome:
    s, ms = run_summary.summarize(rs, lambda _: SLO, requested_rate_rps=1.0, closed_loop=True)
    return RunOutcome("run", Target("http://127.0.0.1:1", "m"), s, ms, None, None, (), ())


def test_tables_and_files_show_refused_and_failed_in_their_own_columns() -> None:
    o = outcome(mixed())
    head = list(report.TENANT_HEADER)
    rows = {row[0]: dict(zip(head, row, strict=True)) for row in report.tenant_rows(o)}
    assert (rows["initech"]["ok"], rows["initech"]["refused"], rows["initech"]["failed"],
            rows["initech"]["attain"]) == ("1", "40", "0", "100.0%")
    assert (rows["acme"]["refused"], rows["acme"]["failed"], rows["acme"]["attain"]) == (
        "2", "1", "50.0%")
    run = dict(zip(report.RUN_HEADER, report.run_rows([o])[0], strict=True))
    assert (run["sent"], run["ok"], run["refused"], run["failed"], run["attain"]) == (
        "48", "4", "42", "1", "60.0%")
    assert "attain = SLO met / (ok + failed)" in report.run_table([o])
    rows_out = report.request_rows(o)
    assert {(r["code"], r["outcome"]) for r in rows_out} == {
        ("", "served"), ("budget_exceeded", "refused"), ("upstream_timeout", "failed"),
        ("", "cancelled"), ("invalid_api_key", "refused")}
    assert orjson.loads(orjson.dumps(rows_out))[1]["outcome"] == "refused"
