"""Work rows on the interval grid, the energy track, and the online coefficient fit."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest

from accounting.coefficients import fit_intervals, fitted, nnls
from accounting.energy import Boundary, EnergyTrack
from accounting.prefill import chunk_spans
from accounting.work import WorkRow, spread, work_rows
from core.records import RequestRecord
from core.timing import latency, split_reads


def record(**kw: object) -> RequestRecord:
    rec = RequestRecord(
        request_id="r", tenant="t", model="m", engine="e", precision="bf16", slo_class="d",
        status="ok", http_status=200, stream=True, arrived_wall_s=1000.0, arrived_s=0.0,
        dispatched_s=0.5, first_byte_s=0.6, first_token_s=1.5, finished_s=3.5,
        read_times=(1.5, 2.2, 3.5), read_events=(1, 2, 1), prompt_tokens=1000, completion_tokens=8,
        attempts=1, latency=latency(0.0, (), 0, 3.5), slo_met=True)
    return dataclasses.replace(rec, **kw)  # type: ignore[arg-type]


def test_streamed_request_spreads_prefill_decode_and_residency() -> None:
    """Queueing before the prefill's span (prompt / prefill rate: 1000 / 4000 = 0.25 s before
    the first token) is not residency."""
    rows = {r.interval_idx: r for r in map(WorkRow._make, work_rows(record(), 1.0, 4000.0))}
    assert sorted(rows) == [1001, 1002, 1003]
    assert rows[1001].prefill_tokens == pytest.approx(1000)  # 1001.25..1001.5 is the prefill
    # 8 tokens out over 4 events; the first came with the prompt's last step, not decoded
    assert [rows[k].decode_tokens for k in sorted(rows)] == pytest.approx([1, 4, 2])
    assert rows[1001].residency_s == pytest.approx(0.75) and rows[1001].start_s == 0.25
    assert rows[1003].residency_s == pytest.approx(0.5) and rows[1003].start_s == 0.0
    assert math.fsum(r.residency_s for r in rows.values()) == pytest.approx(2.25)
    # KV work: each decoded token times its context (prompt + tokens decoded before it).
    assert rows[1002].kv_tokens == pytest.approx(4 * (1000 + 1 + 2))


def test_non_streamed_request_places_decode_at_its_end_and_prefill_before_it() -> None:
    """Dispatched at 1000.5, done at 1003.5: 8 tokens at 0.1 s each end the span
    (1002.7..1003.5), the prefill (1000 / 2000 tok/s = 0.5 s) comes just before them
    (1002.2..1002.7), and the 1.7 s before that (more than the request's own 1.3 s) was
    queueing: not resident."""
    rec = record(stream=False, first_token_s=None, read_times=(), read_events=())
    rows = {r.interval_idx: r for r in map(WorkRow._make, work_rows(rec, 1.0, 2000.0, 0.1))}
    assert sorted(rows) == [1002, 1003]
    assert rows[1002].prefill_tokens == 1000
    # 7 decoded (the first token came with the prompt's last step), spread over 0.8 s
    assert [rows[k].decode_tokens for k in sorted(rows)] == pytest.approx([7 * 0.3 / 0.8,
                                                                          7 * 0.5 / 0.8])
    assert math.fsum(r.residency_s for r in rows.values()) == pytest.approx(1.3)


def test_non_streamed_request_that_decoded_slower_than_the_pace_was_not_queued() -> None:
    """Dispatched at 1000.5, done at 1002.0: the prefill (0.5 s) and 8 tokens at the 0.1 s
    pace would take 1.3 s of the 1.5 s span. An engine that is not queueing starts a request
    in its next step; the decode was slower than the pace (steps that held neighbours'
    prompts), so the request was resident from its dispatch, prefill first (it was placed
    0.2 s late, its prefill straddling two intervals)."""
    rec = record(stream=False, first_token_s=None, read_times=(), read_events=(),
                 engine_done_s=2.0, finished_s=2.0)
    rows = {r.interval_idx: r for r in map(WorkRow._make, work_rows(rec, 1.0, 2000.0, 0.1))}
    assert sorted(rows) == [1000, 1001]
    assert rows[1000].prefill_tokens == 1000 and rows[1000].decode_tokens == 0.0
    assert rows[1000].start_s == pytest.approx(0.5)
    assert rows[1001].decode_tokens == pytest.approx(7)
    assert math.fsum(r.residency_s for r in rows.values()) == pytest.approx(1.5)


def test_long_prefill_is_placed_over_its_whole_span_before_the_first_token() -> None:
    """30,000 prompt tokens at 10,000 tok/s: 3 s of prefill, all of it the request's own, and
    the request resident for all of it (it was 0.25 s before)."""
    rec = record(prompt_tokens=30_000, dispatched_s=0.1, first_token_s=4.0,
                 read_times=(4.0,), read_events=(1,), completion_tokens=1, finished_s=4.0)
    rows = {r.interval_idx: r for r in map(WorkRow._make, work_rows(rec, 1.0, 10_000.0))}
    # its one token came with the prompt's last step: no decode after it
    assert sorted(rows) == [1001, 1002, 1003]
    # chunk by chunk, each step as long as its work: the later chunks attend over more
    # context, so the first second holds more of the prompt than the last
    assert [rows[k].prefill_tokens for k in sorted(rows)] == pytest.approx(
        _chunked(30_000, 1001.0, 1004.0))
    assert rows[1001].prefill_tokens > 10_000 > rows[1003].prefill_tokens
    assert math.fsum(r.prefill_tokens for r in rows.values()) == pytest.approx(30_000)
    assert math.fsum(r.residency_s for r in rows.values()) == pytest.approx(3.0)


def _chunked(prompt: float, t0: float, t1: float) -> list[float]:
    """A prompt's tokens per 1-s interval, read over t0..t1 chunk by chunk."""
    acc: dict[int, float] = {}
    for tokens, lo, hi in chunk_spans(prompt, t0, t1):
        spread(tokens, lo, hi, 1.0, acc)
    return [acc[k] for k in sorted(acc)]


def test_long_prefill_is_bounded_by_the_dispatch() -> None:
    rec = record(prompt_tokens=30_000, dispatched_s=2.5, first_token_s=4.0,
                 read_times=(4.0,), read_events=(1,), completion_tokens=1, finished_s=4.0)
    rows = {r.interval_idx: r for r in map(WorkRow._make, work_rows(rec, 1.0, 10_000.0))}
    assert [rows[k].prefill_tokens for k in sorted(rows)] == pytest.approx(
        _chunked(30_000, 1002.5, 1004.0))
    assert math.fsum(r.residency_s for r in rows.values()) == pytest.approx(1.5)


def test_non_streamed_work_ends_when_the_engine_finished_not_when_the_gateway_read() -> None:
    """A busy gateway read the body 2 s after the engine sent its head: the engine's span
    ends at the head."""
    rec = record(stream=False, first_token_s=None, read_times=(), read_events=(),
                 dispatched_s=0.1, engine_done_s=0.9, finished_s=2.9)
    rows = [WorkRow._make(r) for r in work_rows(rec, 1.0, 10_000.0, 0.05)]
    assert [r.interval_idx for r in rows] == [1000]
    assert rows[0].decode_tokens == pytest.approx(7) and rows[0].prefill_tokens == 1000
    # prefill 0.1 s and decode 8 x 0.05 s fill the engine's span: no queueing in it
    assert rows[0].residency_s == pytest.approx(0.8)


def test_stream_ended_before_its_first_token_is_charged_its_prefill() -> None:
    rec = record(first_token_s=None, read_times=(), read_events=(), completion_tokens=0,
                 status="client_disconnected", dispatched_s=0.2, finished_s=1.7)
    rows = [WorkRow._make(r) for r in work_rows(rec, 1.0, 1000.0)]
    assert math.fsum(r.prefill_tokens for r in rows) == pytest.approx(1000)
    # the prefill (1 s) ends when the stream did (1001.7), after 0.5 s of queueing
    assert rows[0].prefill_tokens == pytest.approx(300)
    assert rows[1].prefill_tokens == pytest.approx(700)


def test_request_that_never_reached_an_engine_has_no_work() -> None:
    rec = record(engine="", dispatched_s=None, first_token_s=None, read_times=(), read_events=())
    assert work_rows(rec, 1.0) == []


def test_spread_conserves_the_amount() -> None:
    acc: dict[int, float] = {}
    spread(100.0, 0.3, 7.9, 0.5, acc)
    assert math.fsum(acc.values()) == pytest.approx(100.0)
    assert min(acc) == 0 and max(acc) == 15


def test_energy_track_interpolates_and_rebases_a_drop() -> None:
    track = EnergyTrack()
    for t, e in [(0.0, 0.0), (1.0, 100.0), (2.0, 300.0), (3.0, 50.0), (4.0, 150.0)]:
        track.add(t, e)
    assert track.energy_at(1.5) == pytest.approx(200.0)
    assert track.energy_at(3.5) == pytest.approx(350.0)  # 300 + half of the 100 after reset
    assert track.energy_at(5.0) is None
    assert track.energy_at(5.0, hold=True) == pytest.approx(400.0)
    assert track.resets == 1


def test_energy_track_anchors_to_a_stored_boundary_after_restart() -> None:
    track = EnergyTrack()
    track.add(10.0, 5.0)  # a fresh meter whose counter is below the stored boundary
    track.add(11.0, 105.0)
    track.anchor(Boundary(8.0, 1000.0))
    assert track.energy_at(8.0) == 1000.0
    assert track.energy_at(11.0) == pytest.approx(1100.0)


def test_nnls_keeps_coefficients_non_negative() -> None:
    x = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    assert nnls(x, [1.0, -1.0, 0.0]) == pytest.approx([0.5, 0.0])


def test_online_fit_recovers_the_engine_power_model() -> None:
    rnd = random.Random(4)
    samples = []
    for _ in range(200):
        p, d, steps = rnd.uniform(0, 20000), rnd.uniform(0, 2000), rnd.uniform(10, 60)
        kv = d * rnd.uniform(100, 3000)
        e = 90.0 + 0.015 * p + 0.01 * d + 2e-5 * kv + 1.25 * steps + rnd.gauss(0, 0.5)
        samples.append((e, 1.0, p, d, kv, steps))
    fit = fit_intervals(samples)
    assert fit is not None
    assert fit.idle_power_w == pytest.approx(90.0, rel=0.05)
    c = fitted(fit)
    assert c.alpha / c.delta == pytest.approx(0.015 / 1.25, rel=0.05)
    assert c.gamma / c.delta == pytest.approx(2e-5 / 1.25, rel=0.1)
    assert fit_intervals(samples[:5]) is None


def _random_record(rnd: random.Random, interval_s: float) -> RequestRecord:
    """Requests that mostly fit in one interval, with the edge cases of token times on its
    bounds, outside it, and missing."""
    base = rnd.choice([0.0, 0.25, 0.999999, 1.0, 7.3])
    grid = rnd.choice([0.0, interval_s * rnd.randint(0, 3)])
    t_disp = base + grid + rnd.choice([0.0, rnd.uniform(0.0, interval_s)])
    t_end = t_disp + rnd.choice([0.0, 1e-9, rnd.uniform(0, 0.02), rnd.uniform(0, interval_s),
                                 rnd.uniform(-0.01, 0.0)])
    first = rnd.choice([None, t_disp, rnd.uniform(t_disp - 0.01, t_end + 0.01),
                        (t_disp + t_end) / 2])
    n_reads = rnd.choice([0, 0, 1, 3, 20])
    lo = first if first is not None else t_disp
    reads = tuple(sorted((rnd.uniform(lo, max(lo, t_end) + rnd.choice([0.0, 0.0, 0.3])),
                          rnd.choice([1, 1, 2, 3])) for _ in range(n_reads)))
    times, events = split_reads(reads)
    return record(arrived_wall_s=1000.0 + rnd.choice([0.0, 0.5]), arrived_s=0.0,
                  dispatched_s=t_disp, first_byte_s=first, first_token_s=first,
                  finished_s=t_end, read_times=times, read_events=events,
                  stream=bool(reads),
                  prompt_tokens=rnd.choice([0, 1, 17, 4000]),
                  completion_tokens=rnd.choice([0, 1, 7, 600]))


def test_the_one_interval_path_builds_the_general_paths_rows_bit_for_bit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """work_rows' shortcuts for requests inside one interval (streamed or not) change no value,
    not one bit."""
    import accounting.work as work

    streams: list[str] = []
    one_stream = work._one_interval_stream

    def counted(rid: str, *args: Any) -> list[work._Row]:
        streams.append(rid)
        return one_stream(rid, *args)

    monkeypatch.setattr(work, "_one_interval_stream", counted)
    rnd = random.Random(11)
    taken = 0
    for _ in range(20_000):
        interval_s = rnd.choice([1.0, 0.5, 0.1])
        rec = _random_record(rnd, interval_s)
        fast = work_rows(rec, interval_s)
        general = work_rows(rec, interval_s, shortcut=False)
        assert [tuple(map(repr, r)) for r in fast] == [tuple(map(repr, r)) for r in general], rec
        off = rec.arrived_wall_s - rec.arrived_s
        assert rec.dispatched_s is not None
        t_disp, t_end = rec.dispatched_s + off, rec.finished_s + off
        taken += (not rec.read_times and math.floor(t_disp / interval_s)
                  == math.floor(t_end / interval_s))
    assert taken > 5_000  # the shortcut was tried on many of them
    assert len(streams) > 2_000  # and the streams' one


def test_long_prompt_prefill_carries_its_attention_work() -> None:
    """Attention grows with the square of the prompt: 20,000 tokens carry 400x the attention
    work of 1,000, placed where the prefill is (the later intervals attend over more)."""
    from accounting.work import PREFILL_ATTENTION_PER_KV

    def attention(prompt: int) -> float:
        rec = record(prompt_tokens=prompt, completion_tokens=0, read_times=(), read_events=(),
                     first_token_s=None, stream=False, dispatched_s=0.0, finished_s=3.0)
        return math.fsum(WorkRow._make(r).kv_tokens for r in work_rows(rec, 1.0, 10_000.0))

    assert attention(1000) == pytest.approx(PREFILL_ATTENTION_PER_KV * 1000 * 500)
    assert attention(20_000) == pytest.approx(400 * attention(1000))


def test_an_engine_that_refused_the_request_did_no_work() -> None:
    rec = record(status="upstream_http_400", http_status=400, first_token_s=None,
                 read_times=(), read_events=(), completion_tokens=0)
    assert work_rows(rec, 1.0) == []


def test_non_streamed_request_without_its_answer_is_resident_from_its_dispatch() -> None:
    """The client left a non-streamed request after 1 s: the engine read the prompt and then
    decoded, unseen, the whole time; it was resident all of it (it was 0.4 ms)."""
    rec = record(stream=False, first_token_s=None, read_times=(), read_events=(),
                 completion_tokens=0, prompt_tokens=8, status="client_disconnected",
                 dispatched_s=0.0, finished_s=1.0)
    rows = [WorkRow._make(r) for r in work_rows(rec, 1.0)]
    assert math.fsum(r.residency_s for r in rows) == pytest.approx(1.0)
    assert math.fsum(r.prefill_tokens for r in rows) == pytest.approx(8)
