"""QueuedPrompts compiled (accounting/_queued.c), as the accounting child places queued long
prompts: the same chunks as the Python class (accounting/queued.py), to the bit, record after
record, over queues read first come, first served, and over records of every shape (no step,
no rate, a first token at dispatch, long streams, engines that forget)."""

from __future__ import annotations

import dataclasses
import random
import struct

import pytest

from accounting import queued
from accounting.queued import QueuedPrompts, queued_prompts
from bench.apportion_workload import make_records
from core.records import RequestRecord
from tests.accounting.test_queued_prompts import fcfs

try:
    from accounting._queued import QueuedPrompts as Compiled
except ImportError:  # pragma: no cover - a build without a C compiler
    Compiled = None  # type: ignore[assignment,misc]

pytestmark = pytest.mark.skipif(Compiled is None, reason="accounting/_queued.c was not built")


def _bits(chunks: list[tuple[float, float, float]] | None) -> list[bytes] | None:
    return None if chunks is None else [struct.pack("<3d", *c) for c in chunks]


def _same(recs: list[RequestRecord], rates: list[float]) -> int:
    """Place `recs` with both; the number that got chunks."""
    py, c = QueuedPrompts(), queued_prompts()
    assert type(c) is Compiled
    placed = 0
    for i, (rec, rate) in enumerate(zip(recs, rates, strict=True)):
        want = py.place(rec, rate)
        got = c.place(rec, rate)
        assert _bits(got) == _bits(want), (i, rec.request_id)
        placed += want is not None
    return placed


def test_queues_read_first_come_first_served() -> None:
    """Queues of 1-12 prompts, short and long, recorded in any order, at rates learnt, guessed
    and unknown: every record's chunks the same."""
    rnd = random.Random(3)
    placed = 0
    for trial in range(150):
        prompts = [rnd.choice([rnd.randint(1, 8192), rnd.randint(8193, 40_000),
                               rnd.randint(10, 300)]) for _ in range(rnd.randint(1, 12))]
        recs, _ = fcfs(prompts, rnd.uniform(0.005, 0.05), rnd.uniform(1e-6, 2e-5),
                       gap_s=rnd.uniform(0.0001, 0.05), wall0=1000.0 + trial * 100)
        rnd.shuffle(recs)
        rates = [rnd.choice([0.0, 8192 / rnd.uniform(0.01, 0.2), 50_000.0]) for _ in recs]
        placed += _same(recs, rates)
    assert placed > 50  # the chunks were compared, not only the Nones


def test_records_of_every_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two engines' records over 120 s as they finish (prompts forgotten, blocks split):
    prompts of 0, short and long tokens, steps missing or too short, first tokens at
    dispatch, requests dispatched together."""
    monkeypatch.setattr(queued, "BLOCK", 16)  # both get it: many splits
    rnd = random.Random(5)
    recs: list[RequestRecord] = []
    made = make_records(12_000, engines=2, span_s=120.0, seed=5)
    for i in range(2, len(made), 5):  # sent with the one before its engine's last (same clock)
        r, was = made[i], made[i - 2]
        assert r.first_token_s is not None and was.dispatched_s is not None
        made[i] = dataclasses.replace(r, arrived_s=was.arrived_s,
                                      arrived_wall_s=was.arrived_wall_s,
                                      dispatched_s=was.dispatched_s,
                                      first_token_s=max(r.first_token_s, was.dispatched_s + 0.01))
    for r in sorted(made, key=lambda r: r.finished_s):
        assert r.first_token_s is not None and r.dispatched_s is not None
        first = rnd.choice([r.first_token_s, r.first_token_s, r.dispatched_s + 0.0005])
        recs.append(dataclasses.replace(
            r, first_token_s=first,
            prompt_tokens=rnd.choice([0, rnd.randint(1, 300), rnd.randint(8000, 30_000)]),
            step_from_s=rnd.choice([None, first - rnd.uniform(0, 0.3), first - 0.001])))
    recs[5] = dataclasses.replace(recs[5], engine="")
    recs[6] = dataclasses.replace(recs[6], first_token_s=None)
    assert _same(recs, [rnd.choice([0.0, 20_000.0, 80_000.0]) for _ in recs]) > 20
