"""The compiled loop of a stream's work rows (accounting/_streamed.c) gives the rows the
Python loop gives, bit for bit (each float's repr, and each value's type), over random
streams: one event per read or several, a prefill over several intervals, reads past the
span (clock skew), intervals of several lengths."""

from __future__ import annotations

import dataclasses
import gc
import random

import pytest

from accounting import heads, work
from accounting.work import WorkRow, work_rows
from bench.apportion_workload import make_records
from core.records import RequestRecord


def _streams(seed: int, n: int) -> list[RequestRecord]:
    rnd = random.Random(seed)
    out = []
    for rec in make_records(n, engines=3, span_s=20.0, seed=seed):
        times = rec.read_times
        events = tuple(rnd.choice((1, 1, 2, 3)) for _ in times)
        if rnd.random() < 0.3:
            rec = dataclasses.replace(rec, read_events=events)
        if rnd.random() < 0.2:  # a long prompt whose prefill spans intervals
            rec = dataclasses.replace(rec, prompt_tokens=rnd.randint(20_000, 200_000))
        if rnd.random() < 0.1:  # reads stamped after the finish
            rec = dataclasses.replace(rec, finished_s=times[len(times) // 2])
        out.append(rec)
    return out


@pytest.mark.skipif(work.compiled is None, reason="accounting/_streamed.c was not built")
@pytest.mark.parametrize("interval_s", [1.0, 0.25, 2.5])
def test_the_compiled_loop_gives_the_python_loops_rows_bit_for_bit(
        interval_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    recs = _streams(int(interval_s * 100), 600)
    rates = (2_000.0, 20_000.0)
    compiled = [work_rows(r, interval_s, rates[i % 2]) for i, r in enumerate(recs)]
    monkeypatch.setattr(work, "compiled", None)
    python = [work_rows(r, interval_s, rates[i % 2]) for i, r in enumerate(recs)]
    assert list(map(repr, compiled)) == list(map(repr, python))
    assert sum(len(rows) > 1 for rows in python) > 100  # streams over several intervals


@pytest.mark.skipif(heads.compiled is None, reason="accounting/_streamed.c was not built")
@pytest.mark.parametrize("interval_s", [1.0, 0.25, 2.5])
def test_the_compiled_heads_are_the_python_heads_bit_for_bit(
        interval_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """heads.with_heads in C and in Python (its cut found in Python too) give the same rows:
    prefill heads, heads cut where the pace changes, whole-span heads and none."""
    recs = _streams(int(interval_s * 100) + 1, 600)
    rates = (2_000.0, 20_000.0)
    compiled = [work_rows(r, interval_s, rates[i % 2]) for i, r in enumerate(recs)]
    monkeypatch.setattr(heads, "compiled", None)
    monkeypatch.setattr(heads, "split", heads.cusum_split)
    python = [work_rows(r, interval_s, rates[i % 2]) for i, r in enumerate(recs)]
    assert list(map(repr, compiled)) == list(map(repr, python))
    # rows of atoms, in no reference cycle: the collector does not walk them while they wait
    assert not any(gc.is_tracked(w) for ws in compiled for w in ws)
    rows = [WorkRow._make(w) for ws in python for w in ws]
    assert sum(0.0 < r.head_s < r.residency_s for r in rows) > 20  # cut where the pace changed
    assert sum(r.head_s == r.residency_s > 0.0 for r in rows) > 100  # one pace: the whole span
    assert sum(r.head_s == 0.0 and r.head_decode == 0.0 for r in rows) > 20  # none
