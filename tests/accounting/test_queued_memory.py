"""An engine's remembered prompts (accounting/queued.py `_Engine`) are kept in blocks so that
an insert far behind the latest first token moves at most a block; they must answer as one
list in order of first token would: the same predecessor, the same prompts forgotten."""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right

import pytest

from accounting import queued
from accounting.queued import LOOK_BACK, MEMORY_S, _Engine, _Seen


class FlatEngine:
    """The reference: one list in order of first token, trimmed on every forget."""

    def __init__(self) -> None:
        self.firsts: list[float] = []
        self.seen: list[_Seen] = []
        self.latest = -math.inf

    def forget(self, t_disp: float) -> None:
        self.latest = max(self.latest, t_disp)
        cut = bisect_left(self.firsts, self.latest - MEMORY_S)
        del self.firsts[:cut], self.seen[:cut]

    def add(self, s: _Seen) -> None:
        i = bisect_right(self.firsts, s.first)
        self.firsts.insert(i, s.first)
        self.seen.insert(i, s)

    def predecessor(self, t_disp: float, t_first: float) -> _Seen | None:
        i = bisect_right(self.firsts, t_first)
        for j in range(i - 1, max(0, i - LOOK_BACK) - 1, -1):
            s = self.seen[j]
            if s.first <= t_disp:
                return None
            if s.dispatched < t_disp:
                return s
        return None


@pytest.mark.parametrize("seed", range(6))
def test_blocks_answer_as_one_ordered_list(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of prompts recorded as they finish (first tokens up to 40 s behind, ties
    included), blocks split and forgotten whole: every predecessor and the kept prompts
    equal the flat list's."""
    monkeypatch.setattr(queued, "BLOCK", 8)  # many splits and whole blocks forgotten
    rnd = random.Random(seed)
    blocks, flat = _Engine(), FlatEngine()
    t, found = 0.0, 0
    for _ in range(4000):
        t += rnd.expovariate(40.0)
        first = round(t - rnd.choice([0.0, rnd.uniform(0, 2), rnd.uniform(0, 40)]), 2)
        disp = first - rnd.uniform(0.0, 0.5)
        for e in (blocks, flat):
            e.forget(disp)
        got = blocks.predecessor(disp, first)
        assert got == flat.predecessor(disp, first)
        found += got is not None
        s = _Seen(disp, first, first - 0.01, 1.0)
        blocks.add(s)
        flat.add(s)
        assert [x for b in blocks.firsts for x in b] == flat.firsts
        assert blocks.maxes == [b[-1] for b in blocks.firsts] and all(blocks.firsts)
    assert found > 100  # the predecessors were looked for among many kept prompts
    assert len(blocks.firsts) > 10


@pytest.mark.parametrize("others", [LOOK_BACK - 1, LOOK_BACK])
def test_look_back_spans_blocks(others: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The predecessor is looked for among the LOOK_BACK prompts whose first token came last,
    across blocks: found behind LOOK_BACK - 1 prompts dispatched later, not behind LOOK_BACK."""
    monkeypatch.setattr(queued, "BLOCK", 4)
    blocks, flat = _Engine(), FlatEngine()
    before = _Seen(0.0, 1.0, 0.99, 1.0)  # dispatched before the prompt asked about
    later = [_Seen(0.6, 1.0 + (i + 1) * 0.01, 0.0, 1.0) for i in range(others)]
    for e in (blocks, flat):
        for s in (before, *later):
            e.add(s)
    want = before if others < LOOK_BACK else None
    assert blocks.predecessor(0.5, 5.0) is want
    assert flat.predecessor(0.5, 5.0) is want
    assert len(blocks.firsts) > 2
