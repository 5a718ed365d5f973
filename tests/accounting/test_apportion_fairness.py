"""Fairness of the apportioner as properties: no tenant can lower its bill (and so move its
energy onto others) by how it ends, sizes, splits or orders its requests.

The rows are one engine-interval's work as the service builds it (`work_rows`), apportioned
in the service's mode (`instant=True`, with the per-step weight-streaming term where a
property holds with it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from accounting.apportion import Apportionment, apportion
from accounting.work import WorkRow, work_rows
from core.records import RequestRecord
from core.timing import latency

DT = 1.0
ALPHA, BETA, GAMMA = 0.0135, 0.0275, 3.0e-5  # the BF16 defaults (docs/accounting.md)
DELTA, DELTA_1, HALF = 1.07, 2.566, 38.0  # FP8's weight streaming: it varies with batch


@st.composite
def spans(draw: st.DrawFn) -> tuple[float, float]:
    """(start offset, residency) inside one interval; often the whole interval."""
    res = draw(st.sampled_from([DT]) | st.floats(0.01, DT))
    start = draw(st.floats(0.0, DT - res)) if res < DT else 0.0
    return start, res


@st.composite
def work_row(draw: st.DrawFn, rid: str) -> WorkRow:
    start, res = draw(spans())
    prefill = draw(st.sampled_from([0.0]) | st.floats(1.0, 8192.0))
    decode = draw(st.sampled_from([0.0]) | st.floats(1.0, 200.0))
    kv = decode * draw(st.floats(0.0, 4000.0))
    return WorkRow(rid, 0, prefill, decode, res, start, kv)


@st.composite
def tenant_rows(draw: st.DrawFn, tenant: str, lo: int = 0, hi: int = 8) -> list[WorkRow]:
    n = draw(st.integers(lo, hi))
    return [draw(work_row(f"{tenant}{i}")) for i in range(n)]


energies = st.floats(1.0, 3000.0)
idle_powers = st.floats(0.0, 700.0)


def split(energy_j: float, idle_w: float, rows: Sequence[WorkRow], *, steps: bool
          ) -> Apportionment:
    if steps:
        return apportion(energy_j, DT, idle_w, rows, ALPHA, BETA, GAMMA, DELTA, delta_1=DELTA_1,
                         delta_half_tokens=HALF, instant=True)
    return apportion(energy_j, DT, idle_w, rows, ALPHA, BETA, GAMMA, instant=True)


def bill(a: Apportionment, prefix: str) -> float:
    """The total of the shares of one tenant (request ids starting with `prefix`)."""
    return math.fsum(s.energy_j for s in a.shares if s.request_id.startswith(prefix))


@settings(max_examples=150, deadline=None)
@given(tenant_rows("a", 1), tenant_rows("b"), energies, idle_powers, st.booleans())
def test_no_share_is_negative_and_shares_plus_idle_are_the_measured_energy(
        a_rows: list[WorkRow], b_rows: list[WorkRow], energy_j: float, idle_w: float,
        steps: bool) -> None:
    a = split(energy_j, idle_w, [*a_rows, *b_rows], steps=steps)
    assert a.idle_j >= 0.0
    assert all(s.energy_j >= 0.0 and s.static_j >= 0.0 and s.dynamic_j >= 0.0 for s in a.shares)
    assert math.fsum(s.energy_j for s in a.shares) + a.idle_j == pytest.approx(energy_j, rel=1e-9)


@settings(max_examples=150, deadline=None)
@given(tenant_rows("a", 1), tenant_rows("b"), energies, idle_powers, st.booleans(), st.randoms())
def test_tenant_bills_do_not_depend_on_the_order_of_requests(
        a_rows: list[WorkRow], b_rows: list[WorkRow], energy_j: float, idle_w: float,
        steps: bool, rnd: object) -> None:
    rows = [*a_rows, *b_rows]
    shuffled = list(rows)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    x, y = split(energy_j, idle_w, rows, steps=steps), split(energy_j, idle_w, shuffled, steps=steps)
    for tenant in ("a", "b"):
        assert bill(x, tenant) == pytest.approx(bill(y, tenant), rel=1e-12, abs=1e-12)


@st.composite
def one_split(draw: st.DrawFn) -> tuple[WorkRow, list[WorkRow]]:
    """One request and the same work as 2-6 requests one after another: their spans tile the
    original's, its token work divided between them in any proportions."""
    start, res = draw(spans())
    k = draw(st.integers(2, 6))
    cuts = sorted(draw(st.lists(st.floats(0.05, 0.95), min_size=k - 1, max_size=k - 1,
                                unique=True)))
    bounds = [start, *(start + c * res for c in cuts), start + res]
    assume(all(hi - lo > 1e-6 for lo, hi in pairwise(bounds)))
    # Whole tokens per piece, as an engine counts them.
    prefills = draw(st.lists(st.integers(0, 4096), min_size=k, max_size=k))
    decodes = draw(st.lists(st.integers(0, 60), min_size=k, max_size=k))
    ctx = draw(st.floats(0.0, 4000.0))  # the context each decoded token reads
    whole = WorkRow("a-whole", 0, float(sum(prefills)), float(sum(decodes)), res, start,
                    sum(decodes) * ctx)
    pieces = [WorkRow(f"a-piece{i}", 0, float(p), float(d), hi - lo, lo, d * ctx)
              for i, (p, d, (lo, hi)) in enumerate(zip(prefills, decodes, pairwise(bounds),
                                                       strict=True))]
    return whole, pieces


@settings(max_examples=200, deadline=None)
@given(one_split(), tenant_rows("b", 1), energies, idle_powers)
def test_splitting_a_request_into_pieces_with_the_same_work_and_span_keeps_the_bill(
        case: tuple[WorkRow, list[WorkRow]], b_rows: list[WorkRow], energy_j: float,
        idle_w: float) -> None:
    """Static energy follows the instants resident, token work is linear: the pieces pay what
    the whole paid, and the neighbour too (without the per-step term, which estimates steps
    from the largest decode of one request)."""
    whole, pieces = case
    x = split(energy_j, idle_w, [whole, *b_rows], steps=False)
    y = split(energy_j, idle_w, [*pieces, *b_rows], steps=False)
    assert bill(y, "a") == pytest.approx(bill(x, "a"), rel=1e-9, abs=1e-9)
    assert bill(y, "b") == pytest.approx(bill(x, "b"), rel=1e-9, abs=1e-9)


@pytest.mark.xfail(strict=True, reason=(
    "the per-step term assumes a request's decode tokens are spread evenly over "
    "its span: a split that puts the tokens into a short piece at the end of the span (1 "
    "token over 1 s as five empty pieces and one of 0.125 s) makes the neighbour look alone "
    "in the batch for most of the interval, and moves step energy onto it (the strategy "
    "tests and bench.accounting_truth see at most 2.6 % on real splits)"))
@settings(derandomize=True, max_examples=200, deadline=None)
@given(one_split(), tenant_rows("b", 1), energies, idle_powers)
def test_splitting_a_request_moves_little_of_its_bill_with_the_step_term(
        case: tuple[WorkRow, list[WorkRow]], b_rows: list[WorkRow], energy_j: float,
        idle_w: float) -> None:
    """With weight streaming per step, splitting the longest decoder changes the estimated
    step count; the split must not lower the splitter's bill by more than 2 % of it."""
    whole, pieces = case
    x = split(energy_j, idle_w, [whole, *b_rows], steps=True)
    y = split(energy_j, idle_w, [*pieces, *b_rows], steps=True)
    assert bill(y, "a") >= bill(x, "a") * 0.98 - 1e-9


def grow_one(a_rows: list[WorkRow], data: st.DataObject) -> list[WorkRow]:
    """The tenant's rows with more prompt or decoded tokens in one of its requests."""
    i = data.draw(st.integers(0, len(a_rows) - 1))
    r = a_rows[i]
    more_p = data.draw(st.floats(0.0, 4096.0))
    more_d = data.draw(st.floats(0.0, 100.0)) if r.decode_tokens > 0 else 0.0
    ctx = r.kv_tokens / r.decode_tokens if r.decode_tokens > 0 else 0.0
    grown = r._replace(prefill_tokens=r.prefill_tokens + more_p,
                       decode_tokens=r.decode_tokens + more_d,
                       kv_tokens=r.kv_tokens + more_d * ctx)
    return [*a_rows[:i], grown, *a_rows[i + 1:]]


@settings(max_examples=200, deadline=None)
@given(tenant_rows("a", 1), tenant_rows("b", 1), energies, idle_powers, st.data())
def test_a_tenant_that_adds_token_work_does_not_pay_less(
        a_rows: list[WorkRow], b_rows: list[WorkRow], energy_j: float, idle_w: float,
        data: st.DataObject) -> None:
    """More prompt or decoded tokens in one of its requests, the same measured energy: the
    tenant's bill does not fall, its neighbour's does not rise."""
    before = split(energy_j, idle_w, [*a_rows, *b_rows], steps=False)
    after = split(energy_j, idle_w, [*grow_one(a_rows, data), *b_rows], steps=False)
    assert bill(after, "a") >= bill(before, "a") * (1 - 1e-9) - 1e-9
    assert bill(after, "b") <= bill(before, "b") * (1 + 1e-9) + 1e-9


@pytest.mark.xfail(strict=True, reason=(
    "the per-step term: adding a decoded token raises the interval's estimated "
    "steps and the per-token price of every sequence's steps, so a tenant whose bill is "
    "mostly prompt tokens can pay slightly less when its decoder grows (seen on intervals of "
    "one or two tokens)"))
@settings(derandomize=True, max_examples=200, deadline=None)
@given(tenant_rows("a", 1), tenant_rows("b", 1), energies, idle_powers, st.data())
def test_a_tenant_that_adds_token_work_does_not_pay_less_with_the_step_term(
        a_rows: list[WorkRow], b_rows: list[WorkRow], energy_j: float, idle_w: float,
        data: st.DataObject) -> None:
    before = split(energy_j, idle_w, [*a_rows, *b_rows], steps=True)
    after = split(energy_j, idle_w, [*grow_one(a_rows, data), *b_rows], steps=True)
    assert bill(after, "a") >= bill(before, "a") * (1 - 1e-9) - 1e-9


@settings(max_examples=150, deadline=None)
@given(tenant_rows("a", 0, 6), tenant_rows("b", 1), work_row("a-new"), energies, idle_powers)
def test_a_tenant_that_adds_a_request_does_not_pay_less(
        a_rows: list[WorkRow], b_rows: list[WorkRow], new: WorkRow, energy_j: float,
        idle_w: float) -> None:
    before = split(energy_j, idle_w, [*a_rows, *b_rows], steps=False)
    after = split(energy_j, idle_w, [*a_rows, new, *b_rows], steps=False)
    assert bill(after, "a") >= bill(before, "a") * (1 - 1e-9) - 1e-9


@pytest.mark.xfail(strict=True, reason=(
    "the per-step term: a new request with a few prompt tokens joins the batch "
    "and thins the tenant's own decoder's share of the steps more than its own one chunk "
    "adds (seen on intervals of one decode token and one prompt token)"))
@settings(derandomize=True, max_examples=150, deadline=None)
@given(tenant_rows("a", 0, 6), tenant_rows("b", 1), work_row("a-new"), energies, idle_powers)
# the case found, kept: which examples a derandomized search draws depends on the constants
# of the modules loaded with it, so the search alone may miss it in a bigger run
@example([WorkRow("a0", 0, 0.0, 1.0, 1.0, 0.0, 0.0)], [WorkRow("b0", 0, 0.0, 1.0, 1.0, 0.0, 1340.0)],
         WorkRow("a-new", 0, 1.0, 0.0, 1.0, 0.0, 0.0), 1.0, 0.0)
def test_a_tenant_that_adds_a_request_does_not_pay_less_with_the_step_term(
        a_rows: list[WorkRow], b_rows: list[WorkRow], new: WorkRow, energy_j: float,
        idle_w: float) -> None:
    before = split(energy_j, idle_w, [*a_rows, *b_rows], steps=True)
    after = split(energy_j, idle_w, [*a_rows, new, *b_rows], steps=True)
    assert bill(after, "a") >= bill(before, "a") * (1 - 1e-9) - 1e-9


def record(prompt: int, read_times: tuple[float, ...], finished_s: float) -> RequestRecord:
    """A streamed request, one token per read, dispatched at 100.0 s (monotonic = wall)."""
    reads = [(t, 1) for t in read_times]
    return RequestRecord(
        request_id="r", tenant="a", model="m", engine="e", precision="bf16", slo_class="d",
        status="client_disconnected", http_status=200, stream=True, arrived_wall_s=100.0,
        arrived_s=100.0, dispatched_s=100.0, first_byte_s=read_times[0],
        first_token_s=read_times[0], finished_s=finished_s, read_times=read_times,
        read_events=tuple(1 for _ in read_times), prompt_tokens=prompt,
        completion_tokens=len(read_times), attempts=1,
        latency=latency(100.0, reads, len(read_times), finished_s), slo_met=False)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 30000), st.floats(0.01, 0.9), st.floats(0.002, 0.05),
       st.integers(2, 400), st.data())
def test_a_stream_ended_early_is_charged_the_work_it_did(
        prompt: int, ttft_s: float, itl_s: float, n: int, data: st.DataObject) -> None:
    """A stream dropped after k of its n tokens: its rows carry its whole prompt and exactly
    the k - 1 tokens it decoded (the first came with the prompt), none after its end; the
    full stream's rows up to that point are the same work."""
    k = data.draw(st.integers(1, n - 1))
    times = tuple(100.0 + ttft_s + i * itl_s for i in range(n))
    full = work_rows(record(prompt, times, times[-1]), DT)
    cut = work_rows(record(prompt, times[:k], times[k - 1]), DT)
    assert math.fsum(r[2] for r in cut) == pytest.approx(prompt)
    assert math.fsum(r[3] for r in cut) == pytest.approx(k - 1 if prompt else k)
    last = math.floor(times[k - 1] / DT)
    assert all(r[1] <= last for r in cut)
    done_by_cut = math.fsum(r[3] for r in full if r[1] < last)
    assert math.fsum(r[3] for r in cut if r[1] < last) == pytest.approx(done_by_cut)
