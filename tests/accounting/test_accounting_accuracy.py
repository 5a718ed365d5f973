"""Apportioning accuracy against a synthetic ground truth.

`run_engine` is a small continuous-batching engine in pure Python: each step it admits
waiting requests (up to a batch limit), prefills them, decodes one token for every running
request, and spends idle_w * step_s of static energy shared equally by the requests resident
in the step plus e_prefill / e_decode joules per token of dynamic energy; with nothing
resident the energy goes to the idle account. Its counter is sampled like a meter and its
requests become RequestRecords like the gateway emits. The apportioner sees only those.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field

import pytest

from accounting.apportion import apportion
from accounting.energy import EnergyTrack
from accounting.work import WorkRow, interval_index, work_rows
from core.records import RequestRecord
from core.timing import latency, split_reads
from core.vocab import Precision

T0_WALL = 1_700_000_000.0  # wall clock of monotonic 0


@dataclass
class _Req:
    rid: str
    tenant: str
    arrive_s: float
    prompt: int
    output: int
    admitted_s: float | None = None
    first_token_s: float | None = None
    done_s: float | None = None
    emitted: int = 0
    events: list[float] = field(default_factory=list)
    truth_j: float = 0.0


@dataclass
class EngineRun:
    records: list[RequestRecord]
    truth_j: dict[str, float]
    tenant_of: dict[str, str]
    readings: list[tuple[float, float]]  # (wall s, cumulative J)
    idle_j: float
    total_j: float


def make_record(r: _Req, engine: str, precision: Precision, coalesce: int) -> RequestRecord:
    assert r.done_s is not None
    events = r.events
    reads = []
    for i in range(0, len(events), coalesce):
        chunk = events[i:i + coalesce]
        reads.append((chunk[-1], len(chunk)))
    lat = latency(r.arrive_s, reads, r.output, r.done_s)
    read_times, read_events = split_reads(reads)
    return RequestRecord(
        request_id=r.rid, tenant=r.tenant, model="m", engine=engine, precision=precision,
        slo_class="default", status="ok", http_status=200, stream=True,
        arrived_wall_s=T0_WALL + r.arrive_s, arrived_s=r.arrive_s, dispatched_s=r.arrive_s,
        first_byte_s=r.arrive_s, first_token_s=r.first_token_s, finished_s=r.done_s,
        read_times=read_times, read_events=read_events,
        prompt_tokens=r.prompt, completion_tokens=r.output, attempts=1,
        latency=lat, slo_met=True)


def run_engine(seed: int, *, duration_s: float = 60.0, rate: float = 6.0, max_batch: int = 64,
               idle_w: float = 90.0, e_prefill: float = 0.004, e_decode: float = 0.12,
               step_s: float = 0.025, poll_s: float = 0.25, tenants: int = 3,
               engine: str = "e0", precision: Precision = "bf16", coalesce: int = 2) -> EngineRun:
    rnd = random.Random(seed)
    arrivals: list[_Req] = []
    t = 0.5
    n = 0
    while t < duration_s:
        t += rnd.expovariate(rate)
        prompt = rnd.choice([rnd.randint(16, 256), rnd.randint(1000, 4000)])
        out = rnd.choice([rnd.randint(4, 64), rnd.randint(100, 400)])
        arrivals.append(_Req(f"{engine}-{n}", f"t{n % tenants}", t, prompt, out))
        n += 1
    waiting: list[_Req] = []
    running: list[_Req] = []
    done: list[_Req] = []
    counter = idle_total = 0.0
    readings = [(T0_WALL, 0.0)]
    next_poll = poll_s
    now = 0.0
    ai = 0
    while ai < len(arrivals) or waiting or running:
        while ai < len(arrivals) and arrivals[ai].arrive_s <= now:
            waiting.append(arrivals[ai])
            ai += 1
        prefilling: list[_Req] = []
        while waiting and len(running) + len(prefilling) < max_batch:
            r = waiting.pop(0)
            r.admitted_s = now
            prefilling.append(r)
        residents = running + prefilling
        end = now + step_s
        if residents:
            static = idle_w * step_s / len(residents)
            for r in residents:
                r.truth_j += static
            for r in prefilling:
                r.truth_j += e_prefill * r.prompt
            for r in running:
                r.truth_j += e_decode
            counter += idle_w * step_s + e_prefill * sum(r.prompt for r in prefilling) \
                + e_decode * len(running)
            for r in running:
                r.emitted += 1
                r.events.append(end)
            for r in prefilling:
                r.first_token_s = end
                r.emitted = 1
                r.events.append(end)
                r.truth_j += e_decode  # the first token comes out of the prefill step
                counter += e_decode
            running += prefilling
            finished = [r for r in running if r.emitted >= r.output]
            for r in finished:
                r.done_s = end
                done.append(r)
            running = [r for r in running if r.emitted < r.output]
        else:
            idle_total += idle_w * step_s
            counter += idle_w * step_s
        now = end
        while next_poll <= now:
            readings.append((T0_WALL + now, counter))
            next_poll += poll_s
    # Keep the meter running idle a few seconds past the end.
    for _ in range(int(4 / step_s)):
        now += step_s
        idle_total += idle_w * step_s
        counter += idle_w * step_s
        if now >= next_poll:
            readings.append((T0_WALL + now, counter))
            next_poll += poll_s
    return EngineRun(
        records=[make_record(r, engine, precision, coalesce) for r in done],
        truth_j={r.rid: r.truth_j for r in done}, tenant_of={r.rid: r.tenant for r in done},
        readings=readings, idle_j=idle_total, total_j=counter)


def apportion_run(run: EngineRun, *, interval_s: float = 1.0, idle_w: float = 90.0,
                  alpha: float = 0.004 / 0.12, beta: float = 1.0
                  ) -> tuple[dict[str, float], float, float]:
    """The pure pipeline: records -> work rows; readings -> interval energy -> shares.
    Returns (joules per request, idle joules, metered joules over the intervals)."""
    track = EnergyTrack()
    for t, e in run.readings:
        track.add(t, e)
    by_idx: dict[int, list[WorkRow]] = {}
    for rec in run.records:
        for row in map(WorkRow._make, work_rows(rec, interval_s)):
            by_idx.setdefault(row.interval_idx, []).append(row)
    k0 = interval_index(run.readings[0][0], interval_s)
    k1 = interval_index(run.readings[-1][0], interval_s)
    got: dict[str, float] = {}
    idle = 0.0
    e_prev = track.energy_at(k0 * interval_s)
    assert e_prev is not None
    for k in range(k0, k1):
        e_end = track.energy_at((k + 1) * interval_s)
        assert e_end is not None
        a = apportion(e_end - e_prev, interval_s, idle_w, by_idx.get(k, []), alpha, beta)
        for s in a.shares:
            got[s.request_id] = got.get(s.request_id, 0.0) + s.energy_j
        idle += a.idle_j
        e_prev = e_end
    first = track.energy_at(k0 * interval_s)
    assert first is not None
    return got, idle, e_prev - first


def errors(run: EngineRun, got: dict[str, float]) -> list[float]:
    return [abs(got.get(rid, 0.0) - truth) / truth for rid, truth in run.truth_j.items()]


def tenant_totals(run: EngineRun, energies: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for rid, e in energies.items():
        out[run.tenant_of[rid]] = out.get(run.tenant_of[rid], 0.0) + e
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_apportioned_energy_matches_ground_truth_per_request_and_tenant(seed: int) -> None:
    """Mixed short/long prompts, 3 tenants, batches 1..64: median <= 5%, p95 <= 15%,
    tenants within 2%, and everything metered is accounted for."""
    run = run_engine(seed)
    got, idle, metered = apportion_run(run)
    errs = sorted(errors(run, got))
    median = statistics.median(errs)
    p95 = errs[int(0.95 * (len(errs) - 1))]
    print(f"\nseed {seed}: {len(errs)} requests, median error {median:.3%}, p95 {p95:.3%}")
    assert median <= 0.05
    assert p95 <= 0.15
    truth_t = tenant_totals(run, run.truth_j)
    got_t = tenant_totals(run, got)
    for tenant, truth in truth_t.items():
        assert got_t[tenant] == pytest.approx(truth, rel=0.02), tenant
    assert math.fsum(got.values()) + idle == pytest.approx(metered, rel=1e-9)
    assert metered == pytest.approx(run.total_j, rel=0.01)


def test_wrong_coefficients_make_accuracy_worse() -> None:
    """The accuracy test can fail: charging prefill like decode breaks the long-prompt bills."""
    run = run_engine(3)
    good = statistics.median(errors(run, apportion_run(run)[0]))
    bad = statistics.median(errors(run, apportion_run(run, alpha=1.0)[0]))
    assert bad > 2 * good
