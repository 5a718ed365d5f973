"""SSE scanning: token events per read, usage capture and stripping, byte-exact relay."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sse import SseScanner, usage_of_body


def ev(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


ROLE = ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
TOK = [ev({"choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]})
       for i in range(5)]
USAGE = ev({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})
DONE = b"data: [DONE]\n\n"
STREAM = ROLE + b"".join(TOK) + USAGE + DONE


def relay(chunks: list[bytes], strip: bool) -> tuple[bytes, int, SseScanner]:
    sc = SseScanner(strip_usage=strip)
    out, tokens = b"", 0
    for c in chunks:
        o, n = sc.feed(c)
        out += o
        tokens += n
    return out + sc.pending(), tokens, sc


def test_every_event_with_choices_is_a_token_event_as_vllm_bench_serve_counts() -> None:
    """The role chunk counts (its `choices` is non-empty); the usage-only chunk does not."""
    out, tokens, sc = relay([ROLE, *TOK, USAGE, DONE], strip=False)
    assert tokens == 6
    assert sc.role_events == 1
    assert out == STREAM
    assert sc.usage == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert sc.done


def test_complete_once_done_or_the_final_usage_chunk_the_client_asked_for() -> None:
    sc = SseScanner(strip_usage=False)
    sc.feed(ROLE + TOK[0])
    assert not sc.complete
    sc.feed(USAGE)
    assert sc.complete  # a client that asked for usage may stop reading here
    stripped = SseScanner(strip_usage=True)
    stripped.feed(ROLE + TOK[0] + USAGE)
    assert not stripped.complete  # the client never sees that chunk: it waits for [DONE]
    stripped.feed(DONE)
    assert stripped.complete


def test_continuous_usage_does_not_mark_the_stream_complete() -> None:
    sc = SseScanner(strip_usage=False)
    sc.feed(ev({"choices": [{"text": " a"}], "usage": {"completion_tokens": 1}}))
    assert sc.usage is not None and not sc.complete


def test_usage_chunk_is_stripped_when_client_did_not_ask() -> None:
    out, tokens, sc = relay([STREAM], strip=True)
    assert out == ROLE + b"".join(TOK) + DONE
    assert tokens == 6 and sc.usage is not None and sc.usage["completion_tokens"] == 5


def test_events_in_one_read_are_counted_separately() -> None:
    sc = SseScanner(strip_usage=False)
    assert sc.feed(TOK[0] + TOK[1] + TOK[2]) == (TOK[0] + TOK[1] + TOK[2], 3)


def test_partial_event_is_held_until_complete() -> None:
    sc = SseScanner(strip_usage=False)
    assert sc.feed(TOK[0][:10]) == (b"", 0)
    assert sc.feed(TOK[0][10:]) == (TOK[0], 1)


def test_empty_text_events_are_token_events() -> None:
    """A special token, or a token ending inside a multi-byte character, comes as "" text."""
    sc = SseScanner(strip_usage=False)
    assert sc.feed(ev({"choices": [{"text": " hello"}]}))[1] == 1
    assert sc.feed(ev({"choices": [{"index": 0, "text": ""}]}))[1] == 1
    assert sc.feed(ev({"choices": [{"delta": {"content": ""}}]}) * 3)[1] == 3
    assert sc.feed(ev({"choices": [{"text": "", "finish_reason": "stop"}]}))[1] == 1
    assert sc.feed(ev({"choices": []}))[1] == 0


def test_crlf_separated_events() -> None:
    sc = SseScanner(strip_usage=True)
    crlf = STREAM.replace(b"\n\n", b"\r\n\r\n")
    out, n = sc.feed(crlf)
    assert n == 6 and b'"usage"' not in out and out.endswith(b"[DONE]\r\n\r\n")


def test_error_event_is_seen() -> None:
    sc = SseScanner(strip_usage=True)
    sc.feed(ev({"error": {"message": "boom"}}))
    assert sc.error


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12),
       strip=st.booleans())
def test_any_split_into_reads_relays_the_same_bytes(cuts: list[int], strip: bool) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    out, tokens, sc = relay(chunks, strip)
    assert out == (STREAM.replace(USAGE, b"") if strip else STREAM)
    assert tokens == 6
    assert sc.usage is not None and sc.usage["completion_tokens"] == 5


def test_usage_of_non_streamed_body() -> None:
    assert usage_of_body(b'{"usage": {"completion_tokens": 4}}') == {"completion_tokens": 4}
    assert usage_of_body(b"not json") is None


def test_spaced_json_and_tool_call_deltas_are_counted_per_event() -> None:
    sc = SseScanner(strip_usage=False)
    spaced = b'data: {"choices": [{"delta": {"content": " hi"}}]}\n\n' * 2
    assert sc.feed(spaced)[1] == 2
    assert sc.feed(b'data: {"choices": [ ], "usage": {}}\n\n')[1] == 0
    tool = ev({"choices": [{"delta": {"content": "", "tool_calls": [{"function": {"arguments": "{"}}]}}]})
    assert sc.feed(tool + TOK[0])[1] == 2


def test_continuous_usage_chunks_keep_tokens_and_update_usage() -> None:
    sc = SseScanner(strip_usage=True)
    chunk = ev({"choices": [{"text": " a"}], "usage": {"completion_tokens": 1}})
    out, n = sc.feed(chunk)
    assert (out, n) == (chunk, 1)
    assert sc.usage == {"completion_tokens": 1}


def test_the_finish_reason_event_completes_the_answer_in_either_spacing() -> None:
    sc = SseScanner(strip_usage=True)
    sc.feed(TOK[0])
    assert not sc.complete  # "finish_reason": null is not an end
    sc.feed(b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}\n\n')
    assert sc.finished and sc.complete and not sc.done
    compact = SseScanner(strip_usage=True)
    compact.feed(b'data: {"choices":[{"index":0,"text":"x","finish_reason":"length"}]}\n\n')
    assert compact.complete


def test_with_several_choices_the_answer_ends_at_the_last_ones_finish_reason() -> None:
    sc = SseScanner(strip_usage=True, choices=2)
    sc.feed(b'data: {"choices":[{"index":0,"text":"x","finish_reason":"length"}]}\n\n')
    assert not sc.complete  # choice 1 is still decoding
    sc.feed(b'data: {"choices":[{"index":1,"text":"y","finish_reason":null}]}\n\n')
    assert not sc.complete
    sc.feed(b'data: {"choices": [{"index": 1, "text": "z", "finish_reason": "stop"}]}\n\n')
    assert sc.finished and sc.complete
