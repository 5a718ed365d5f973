"""The load client's reading of a stream (loadgen/tally.py): however the body is split into
reads, the token events, the usage and an error event come out the same."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.tally import StreamTally

EVENTS = (b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
          b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
          b'data: {"choices":[{"delta":{"content": "b"}}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
          b"data: [DONE]\n\n")


def tally_of(body: bytes, cuts: list[int], api: str = "chat") -> StreamTally:
    tally = StreamTally(api, 0.0)
    points = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
    for a, b in itertools.pairwise(points):
        tally.feed(body[a:b])
    tally.finish()
    return tally


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(EVENTS)), max_size=10))
def test_tokens_and_usage_do_not_depend_on_the_read_split(cuts: list[int]) -> None:
    tally = tally_of(EVENTS, cuts)
    assert sum(n for _, n in tally.reads) == 2  # the empty role chunk carries no token
    assert tally.usage == (7, 2) and tally.error == b""


def test_a_tokenless_stream_gives_its_usage_from_an_unterminated_tail() -> None:
    body = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}'
    tally = tally_of(body, [10], api="completions")
    assert tally.reads == [] and tally.usage == (3, 1)


def test_an_error_event_is_kept_for_the_report() -> None:
    tally = tally_of(b'data: {"error":{"message":"engine broke"}}\n\n', [5])
    assert b"engine broke" in tally.error
