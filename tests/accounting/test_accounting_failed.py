"""Failed work is not the tenant's: the split of a failed request's share (pure), the plan's
failed account with conservation under both settings of `accounting.failed_energy`, the
report's failed rows and outcome counts, and what the ledger row keeps of a record."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.apportion import ShareColumns
from accounting.failed import (
    BILL_ALL,
    BILL_NONE,
    Cut,
    bill_until,
    split_failed,
    static_fraction,
)
from accounting.ledger.base import PendingWork, RequestRow, UsageData, WorkSnapshot
from accounting.plan import Plan, ReadyInterval, StoredShare, plan_engine
from accounting.report import FAILED_TENANT, IDLE_TENANT, build_report
from accounting.work import WorkRow
from core.records import RequestRecord
from core.timing import Latency
from core.vocab import FailedEnergy
from tests.accounting.test_apportion_plan import BASE, plan_input, rows


def with_failed(k: int, until_s: float) -> list[PendingWork]:
    """rows(k) with tenant tb's request b{k} failed, billed until `until_s`."""
    out = rows(k)
    out[1] = out[1]._replace(bill_until_s=until_s)
    return out


def one_interval(until_s: float, **kw: Any) -> Plan:
    return plan_engine(plan_input(ready=[ReadyInterval(10, 5400.0)],
                                  snapshot=WorkSnapshot(with_failed(10, until_s), {10: 1}), **kw))


def conserved(plan: Plan) -> None:
    """Every interval's energy is its billed shares + idle + failed, and the failed account
    is the sum of the shares' failed parts (and, without revisions, the tenants' sums are
    their billed shares)."""
    for i in plan.intervals:
        shares = [s for s in plan.shares if s.interval_idx == i.interval_idx]
        billed = math.fsum(s.energy_j for s in shares)
        assert billed + i.idle_j + i.failed_j == pytest.approx(i.energy_j, rel=1e-12, abs=1e-9)
        assert i.failed_j == pytest.approx(math.fsum(s.failed_j for s in shares), abs=1e-12)
        assert all(s.energy_j >= -1e-12 and s.failed_j >= -1e-12 for s in shares)
    if not plan.revised:
        tenants = math.fsum(t.energy_j for t in plan.tenants.values())
        assert tenants == pytest.approx(math.fsum(s.energy_j for s in plan.shares), abs=1e-9)


def test_only_failed_requests_have_a_cut_and_only_under_failed_account() -> None:
    assert bill_until("served", 5.0, "failed_account") == BILL_ALL
    assert bill_until("cancelled", None, "failed_account") == BILL_ALL
    assert bill_until("refused", None, "failed_account") == BILL_ALL
    assert bill_until("failed", None, "failed_account") == BILL_NONE
    assert bill_until("failed", 12.5, "failed_account") == 12.5
    assert bill_until("failed", None, "tenant") == BILL_ALL
    assert static_fraction(Cut(10.25, 10.0, 1.0)) == 0.25
    assert static_fraction(Cut(9.0, 10.0, 1.0)) == 0.0
    assert static_fraction(Cut(12.0, 10.0, 1.0)) == 1.0


def test_a_failed_request_that_delivered_nothing_is_all_in_the_failed_account() -> None:
    clean = one_interval(BILL_ALL)
    plan = one_interval(BILL_NONE)
    conserved(plan)
    want = {s.request_id: s for s in clean.shares}
    got = {s.request_id: s for s in plan.shares}
    assert got["b10"].energy_j == 0.0 and got["b10"].cost_usd == 0.0 and got["b10"].gpu_s == 0.0
    assert got["b10"].failed_j == pytest.approx(want["b10"].energy_j)
    assert want["b10"].energy_j > 1.0
    for rid in ("a10", "c10"):  # the others' shares do not move
        assert got[rid].energy_j == want[rid].energy_j and got[rid].failed_j == 0.0
    interval = plan.intervals[0]
    assert interval.failed_j == pytest.approx(want["b10"].energy_j)
    assert interval.failed_cost_usd == pytest.approx(want["b10"].cost_usd)
    assert interval.failed_carbon_g == pytest.approx(want["b10"].carbon_g)
    assert interval.idle_j == clean.intervals[0].idle_j
    assert plan.tenants["tb"].energy_j == pytest.approx(
        clean.tenants["tb"].energy_j - want["b10"].energy_j)
    assert plan.failed_delta_j == pytest.approx(interval.failed_j)


def test_the_switch_bills_failed_energy_to_the_tenant() -> None:
    clean = one_interval(BILL_ALL)
    plan = one_interval(BILL_NONE, failed_energy="tenant")
    conserved(plan)
    assert plan.shares == clean.shares and plan.intervals == clean.intervals
    assert plan.intervals[0].failed_j == 0.0 and plan.failed_delta_j == 0.0


def test_a_stream_that_failed_after_tokens_pays_its_tokens_and_its_time_until_the_last() -> None:
    """b10 is resident over all of interval 10 (start 0, residency 1 s): delivered until
    10.25, its tenant keeps its dynamic share and a quarter of its static share."""
    clean = {s.request_id: s for s in one_interval(BILL_ALL).shares}
    plan = one_interval(10.25)
    conserved(plan)
    got = {s.request_id: s for s in plan.shares}["b10"]
    want = clean["b10"]
    assert want.static_j > 0.0 and want.dynamic_j > 0.0
    assert got.dynamic_j == want.dynamic_j
    assert got.static_j == pytest.approx(want.static_j * 0.25)
    assert got.gpu_s == pytest.approx(want.gpu_s * 0.25)
    assert got.energy_j == pytest.approx(want.dynamic_j + want.static_j * 0.25)
    assert got.failed_j == pytest.approx(want.static_j * 0.75)


def test_a_revision_moves_the_failed_account_by_its_change() -> None:
    first = plan_engine(plan_input(ready=[ReadyInterval(10, 5400.0)],
                                   snapshot=WorkSnapshot(rows(10), {10: 1})))
    stored = {10: first.intervals[0]}
    old = [StoredShare(10, t, s.energy_j, s.carbon_g, s.cost_usd)
           for t, s in first.tenants.items()]
    late = PendingWork("ta", WorkRow("late", 10, 0.0, 80.0, 1.0, 0.0, 5000.0), BILL_NONE)
    revised = plan_engine(plan_input(
        state=dataclasses.replace(BASE.state, next_interval=11, boundary_s=11.0,
                                  boundary_j=5400.0),
        ready=[], dirty=[10], snapshot=WorkSnapshot([*rows(10), late], {10: 2}),
        stored=stored, stored_shares=old))
    conserved(revised)
    assert revised.intervals[0].failed_j > 0.0
    assert revised.failed_delta_j == pytest.approx(revised.intervals[0].failed_j)
    # the late failed request took joules from the others and from idle; none billed to ta
    moved = math.fsum(t.energy_j for t in revised.tenants.values())
    assert moved + revised.idle_delta_j + revised.failed_delta_j == pytest.approx(0.0, abs=1e-9)


_amount = st.floats(0.0, 1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_amount, _amount, st.floats(0.0, 1.0), st.floats(0.0, 1.0),
                          st.sampled_from(["all", "none", "cut"]), st.floats(-0.5, 1.5)),
                min_size=1, max_size=12))
def test_split_keeps_every_share_whole(spec: list[tuple[Any, ...]]) -> None:
    """billed + failed is the share, each in [0, share], whatever the cuts."""
    rids = [f"r{i}" for i in range(len(spec))]
    static = [s[0] for s in spec]
    dynamic = [s[1] for s in spec]
    energy = [a + b for a, b in zip(static, dynamic, strict=True)]
    busy = [s[2] for s in spec]
    cuts = {}
    for rid, (_, _, _, res, kind, at) in zip(rids, spec, strict=True):
        until = {"all": BILL_ALL, "none": BILL_NONE}.get(kind, 10.0 + at)
        cuts[rid] = Cut(until, 10.0, res)
    billed, failed = split_failed(ShareColumns(rids, energy, static, dynamic, busy), cuts)
    for i, e in enumerate(energy):
        assert billed.energy_j[i] + failed.energy_j[i] == pytest.approx(e, rel=1e-15, abs=1e-12)
        assert -1e-12 <= billed.energy_j[i] <= e + 1e-12
        assert -1e-12 <= failed.energy_j[i] <= e + 1e-12
        assert billed.busy_s[i] + failed.busy_s[i] == pytest.approx(busy[i])
        kind = spec[i][4]
        if kind == "none":
            assert billed.energy_j[i] == 0.0
        elif kind == "all":
            assert failed.energy_j[i] == 0.0
        else:
            assert billed.dynamic_j[i] == dynamic[i]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 500.0), st.floats(0.0, 60.0), st.floats(0.0, 1.0),
                          st.floats(0.0, 1.0), st.sampled_from(["served", "none", "cut"]),
                          st.floats(0.0, 1.0), st.sampled_from(["ta", "tb", "tc"])),
                min_size=0, max_size=10),
       st.floats(0.0, 2000.0), st.sampled_from(["failed_account", "tenant"]))
def test_meters_are_tenants_plus_idle_plus_failed_under_both_settings(
        spec: list[tuple[Any, ...]], energy_j: float, setting: FailedEnergy) -> None:
    work = []
    for i, (p, d, start, res, kind, at, tenant) in enumerate(spec):
        until = {"served": BILL_ALL, "none": BILL_NONE}.get(kind, 10.0 + at)
        res = min(res, 1.0 - start)
        work.append(PendingWork(tenant, WorkRow(f"q{i}", 10, p, d, res, start, p * d), until))
    plan = plan_engine(plan_input(ready=[ReadyInterval(10, 5000.0 + energy_j)],
                                  snapshot=WorkSnapshot(work, {10: 1}),
                                  failed_energy=setting))
    conserved(plan)
    row = plan.intervals[0]
    tenants = math.fsum(t.energy_j for t in plan.tenants.values())
    assert tenants + row.idle_j + row.failed_j == pytest.approx(energy_j, rel=1e-9, abs=1e-9)
    if setting == "tenant" or all(s[4] == "served" for s in spec):
        assert row.failed_j == 0.0


def test_report_shows_the_failed_account_and_counts_requests_by_outcome_class() -> None:
    hour = 500_000
    data = UsageData(
        energy=[("acme", "m", "bf16", "e0", hour, 60.0, 20.0, 0.6, 0.006, 0, 30.0),
                ("beta", "m", "bf16", "e0", hour, 10.0, 4.0, 0.1, 0.001, 0, 0.0)],
        requests=[("acme", "m", "bf16", "e0", hour, 9, 5, 100, 50, 4, 1.8e9, 1.8e9 + 10,
                   5, 2, 1, 1),
                  ("beta", "m", "bf16", "e0", hour, 3, 3, 10, 5, 3, 1.8e9, 1.8e9 + 5,
                   3, 0, 0, 0)],
        idle=[("e0", "m", "bf16", hour, 25.0, 0.2, 0.002, 0, 1.8e9, 1.8e9 + 10)],
        failed=[("e0", "m", "bf16", hour, 30.0, 0.3, 0.003, 0)])
    rep = build_report(data, ["tenant"], 0.0, 2e9)
    by = {r["tenant"]: r for r in rep.rows}
    assert [r["account"] for r in rep.rows] == ["requests", "requests", "idle", "failed"]
    assert by["acme"]["energy_j"] == 60.0 and by["acme"]["failed_energy_j"] == 30.0
    assert (by["acme"]["served"], by["acme"]["refused"], by["acme"]["failed"],
            by["acme"]["cancelled"]) == (5, 2, 1, 1)
    assert by[FAILED_TENANT]["energy_j"] == 30.0 and by[FAILED_TENANT]["cost_usd"] == 0.003
    assert by[IDLE_TENANT]["energy_j"] == 25.0
    total = rep.total
    assert total["energy_j"] == 60.0 + 10.0 + 25.0 + 30.0  # tenants + idle + failed
    assert (total["served"], total["refused"], total["failed"], total["cancelled"]) == (8, 2, 1, 1)
    assert total["requests"] == 12 and total["ok"] == 8


def _record(**kw: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "request_id": "r", "tenant": "t", "model": "m", "engine": "e0", "precision": "bf16",
        "slo_class": "d", "status": "ok", "http_status": 200, "stream": True,
        "arrived_wall_s": 1000.0, "arrived_s": 50.0, "dispatched_s": 50.1,
        "first_byte_s": 50.2, "first_token_s": 50.3, "finished_s": 52.0,
        "read_times": (50.3, 50.6), "read_events": (1, 1), "prompt_tokens": 10,
        "completion_tokens": 2, "attempts": 1,
        "latency": Latency(0.3, 0.3, 2.0, (0.3,), (0.3,)), "slo_met": True}
    base.update(kw)
    return RequestRecord(**base)


def test_the_ledger_row_keeps_status_class_and_the_last_delivered_token() -> None:
    row = RequestRow.from_record(_record(status="upstream_timeout", http_status=200), 1.0, "x", [])
    assert (row.http_status, row.outcome) == (200, "failed")
    assert row.delivered_s == pytest.approx(1000.6)
    hung = RequestRow.from_record(_record(status="upstream_timeout", http_status=504,
                                          read_times=(), read_events=(), first_token_s=None),
                                  1.0, "x", [])
    assert (hung.http_status, hung.outcome, hung.delivered_s) == (504, "failed", None)
    ok = RequestRow.from_record(_record(), 1.0, "x", [])
    assert ok.outcome == "served"
