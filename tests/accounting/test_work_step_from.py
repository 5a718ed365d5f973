"""A prompt that shared its engine step with other prompts (a burst's) is read over that whole
step, from the engine's previous step on, not over its own tokens' time before its first
token; the gateway marks that previous step from the token events it relays."""

from __future__ import annotations

import pytest

from accounting.prefill import CHUNK_TOKENS, MIN_PROMPT_TOKENS, chunk_spans
from accounting.work import WorkRow, spread, work_rows
from gateway.pipeline.flight import STEP_GAP_S, Flight
from tests.accounting.test_accounting_work import record


def _first_row(**kw: object) -> WorkRow:
    return WorkRow._make(work_rows(record(**kw), 1.0, 25_000.0)[0])


def test_a_prompt_in_a_shared_step_is_read_from_the_previous_step() -> None:
    """500 tokens at 25,000 tok/s take 20 ms; its step began at 1001.3 (the engine's last
    event before it), 200 ms before its first token at 1001.5: prefill and residency from
    1001.3, the head 0.2 s."""
    row = _first_row(prompt_tokens=500, step_from_s=1.3)
    assert row.start_s == pytest.approx(0.3)
    assert row.head_s == pytest.approx(0.2)
    alone = _first_row(prompt_tokens=500)
    assert alone.start_s == pytest.approx(0.48)


def test_the_step_never_moves_the_prefill_before_the_dispatch_nor_shortens_it() -> None:
    """From the dispatch (1000.5) at the earliest; a step that began after prompt / rate
    before the first token leaves the prefill as its tokens take."""
    assert _first_row(prompt_tokens=500, step_from_s=0.2).start_s == pytest.approx(0.5)
    assert _first_row(prompt_tokens=500, step_from_s=1.495).start_s == pytest.approx(0.48)


def test_only_a_prompt_of_one_chunk_and_of_a_measurable_length_is_read_from_the_step() -> None:
    """A prompt over CHUNK_TOKENS is read in several steps (its rate places it); a prompt
    under MIN_PROMPT_TOKENS rides in whatever step it joins."""
    long = _first_row(prompt_tokens=int(CHUNK_TOKENS) + 1000, dispatched_s=1.1,
                      step_from_s=1.2)
    # not queued (its 9,192 / 25,000 s of reading began 32 ms after its dispatch): read over
    # its tokens' time before its first token, not from 1001.2
    assert long.start_s == pytest.approx(1.5 - 9192 / 25_000 - 1.0)
    tiny = _first_row(prompt_tokens=MIN_PROMPT_TOKENS - 1, step_from_s=1.3)
    assert tiny.start_s > 0.49


_STEP = CHUNK_TOKENS / 25_000.0  # one full step's reading time: 0.328 s
_LONG = int(CHUNK_TOKENS) + 4000  # read in two steps


def _queued(first: float, step_from: float) -> WorkRow:
    """A long prompt dispatched at 1000.0, queued behind others, its first token at `first`."""
    rows = work_rows(record(prompt_tokens=_LONG, dispatched_s=0.0, first_token_s=first,
                            step_from_s=step_from, read_times=(first, 3.0), read_events=(1, 1),
                            finished_s=3.0), 1.0, 25_000.0)
    return WorkRow._make(rows[0])


def test_a_queued_long_prompt_ends_its_reading_inside_a_full_last_step() -> None:
    """Queued prompts are read back to back in chunks: a full last step (1001.2-1001.528,
    a chunk's time) also read the next prompt's first chunk, so this prompt's reading ended
    half way through it on average, 1001.364, and began its tokens' time before that."""
    row = _queued(1.2 + _STEP, 1.2)
    end = 1.2 + _STEP / 2.0
    assert row.start_s == pytest.approx(end - _LONG / 25_000.0)  # in interval 1000
    # its tokens spread over that reading, chunk by chunk: the part before 1001.0 in 1000
    before: dict[int, float] = {}
    for tokens, lo, hi in chunk_spans(_LONG, 1000.0 + row.start_s, 1000.0 + end):
        spread(tokens, lo, hi, 1.0, before)
    assert row.prefill_tokens == pytest.approx(before[1000])
    # a step longer than a chunk's time: half way through it
    slow = _queued(1.2 + 2 * _STEP, 1.2)
    assert slow.start_s == pytest.approx(1.2 + _STEP - _LONG / 25_000.0 - 1.0)  # in 1001


def test_a_short_last_step_held_only_the_prompts_tail() -> None:
    """A last step shorter than half a chunk's time read nothing after this prompt: its reading
    ends at its first token."""
    row = _queued(1.3, 1.2)
    assert row.start_s == pytest.approx(1.3 - _LONG / 25_000.0)


def test_events_of_one_step_read_apart_are_not_a_step() -> None:
    """A "step" of 5 ms (one step's events relayed 5 ms apart) is taken as a full one."""
    row = _queued(1.4, 1.395)
    assert row.start_s == pytest.approx(1.4 - _STEP / 2.0 - _LONG / 25_000.0)


class _Engine:
    last_token_s = 0.0
    step_end_s = 0.0


def _flight(engine: _Engine) -> Flight:
    f = Flight("r", 0.0, 0.0, "d")
    f.endpoint = engine  # type: ignore[assignment]
    return f


def test_the_gateway_marks_the_engine_step_before_each_first_token() -> None:
    """Events of one step arrive within STEP_GAP_S: three first tokens at 10.000-10.002 s
    all get the step that ended at 9.8 s; one at 10.2 s gets 10.002 s."""
    engine = _Engine()
    f0 = _flight(engine)
    f0.token_read(9.8, 1)
    assert f0.step_from_s is None  # nothing before it
    burst = [_flight(engine) for _ in range(3)]
    for i, f in enumerate(burst):
        f.token_read(10.0 + i * STEP_GAP_S / 3, 1)
    assert [f.step_from_s for f in burst] == [9.8] * 3
    late = _flight(engine)
    late.token_read(10.2, 1)
    assert late.step_from_s == pytest.approx(10.0 + 2 * STEP_GAP_S / 3)
    burst[0].token_read(10.21, 1)  # a later token keeps its first one's step
    assert burst[0].step_from_s == 9.8


def test_the_published_record_carries_the_step_before_its_first_token() -> None:
    """RecordPublisher.publish hands the flight's step_from_s to the record's sinks."""
    from types import SimpleNamespace

    from core.vocab import SloClass
    from gateway.pipeline.record import RecordPublisher

    got: list[object] = []
    config = SimpleNamespace(slo_classes=[SloClass("d")])
    publisher = RecordPublisher(config, None, None, [got.append], lambda: 11.0)  # type: ignore[arg-type]
    engine = _Engine()
    first = _flight(engine)
    first.token_read(9.8, 1)
    f = _flight(engine)
    f.token_read(10.0, 1)
    f.endpoint = None  # no endpoint chosen: the record names none, the step stays
    publisher.publish(f, 10.5)
    assert [r.step_from_s for r in got] == [9.8]  # type: ignore[attr-defined]
