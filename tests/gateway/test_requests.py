"""The prepared request: one parse, the checks a client sees, and the exact upstream bytes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from core.errors import InvalidJSONError, RequestError
from gateway import requests as requests_module
from gateway.requests import PreparedRequest, prepare

pytestmark = pytest.mark.timeout(10)

MODELS: dict[str, str | None] = {"m": "m", "renamed": "org/model-7b", "mixed": None}


def prep(body: Any, header: str | None = None, **kw: Any) -> PreparedRequest:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return prepare(raw, header, MODELS, **kw)


def test_a_body_the_engine_may_take_as_is_goes_upstream_as_the_same_bytes() -> None:
    """Non-streamed, or streamed with the client's own include_usage: no re-encoding."""
    for body in ({"model": "m", "prompt": "hi", "max_tokens": 3},
                 {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                  "prompt": "hi"}):
        req = prep(body)
        assert req.upstream_body("m") is req.raw


def test_a_stream_asks_the_engine_for_usage_keeping_the_clients_key_order() -> None:
    raw = b'{"stream":true,"model":"m","stream_options":{"continuous_usage_stats":false},"x":1}'
    req = prep(raw)
    assert req.upstream_body("m") == (b'{"stream":true,"model":"m","stream_options":'
                                      b'{"continuous_usage_stats":false,"include_usage":true},'
                                      b'"x":1}')
    assert not req.client_wants_usage
    plain = prep(b'{"model":"m","stream":true}')
    assert plain.upstream_body("m") == b'{"model":"m","stream":true,' \
                                       b'"stream_options":{"include_usage":true}}'


def test_the_model_is_renamed_for_the_engine_and_the_precision_suffix_dropped() -> None:
    req = prep({"model": "renamed@fp8", "prompt": "p"})
    assert (req.model, req.precision) == ("renamed", "fp8")
    assert req.upstream_body("org/model-7b") == b'{"model":"org/model-7b","prompt":"p"}'


def test_the_upstream_body_is_built_once_for_the_name_all_engines_of_the_pool_serve() -> None:
    """Retries to engines serving the same name reuse one body; a pool whose engines name
    the model differently builds each engine's body on its attempt."""
    req = prep({"model": "renamed", "stream": True})
    assert req.upstream_body("org/model-7b") is req.upstream_body("org/model-7b")
    mixed = prep({"model": "mixed", "prompt": "p"})
    assert mixed.upstream_model is None
    assert mixed.upstream_body("mixed") is mixed.raw
    assert mixed.upstream_body("other") == b'{"model":"other","prompt":"p"}'


def test_the_body_is_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefix key, size hints and upstream body all come from the one decode."""
    calls = []

    class CountingOrjson:
        JSONDecodeError = orjson.JSONDecodeError
        dumps = staticmethod(orjson.dumps)

        @staticmethod
        def loads(raw: bytes) -> Any:
            calls.append(raw)
            return orjson.loads(raw)

    monkeypatch.setattr(requests_module, "orjson", CountingOrjson)
    req = prep({"model": "renamed", "stream": True, "max_tokens": 9,
                "messages": [{"role": "user", "content": "x" * 40}]},
               prefix_chars=8, estimate=True)
    req.upstream_body("org/model-7b")
    req.upstream_body("another")
    assert len(calls) == 1
    assert req.prefix_key == b"x" * 8 and req.max_tokens == 9
    assert req.prompt_estimate == pytest.approx(len("user\n" + "x" * 40) / 4.0)


def test_size_hints_and_prefix_are_taken_only_when_asked_for() -> None:
    """They walk the whole prompt: a policy that reads neither pays for neither."""
    body = {"model": "m", "prompt": "abcdefgh", "max_completion_tokens": 5, "max_tokens": 7}
    req = prep(body)
    assert (req.prompt_estimate, req.prefix_key, req.max_tokens) == (None, b"", None)
    asked = prep(body, prefix_chars=3, estimate=True)
    assert (asked.prompt_estimate, asked.prefix_key, asked.max_tokens) == (2.0, b"abc", 5)
    ids = prep({"model": "m", "prompt": [1, 2, 3], "max_tokens": None}, estimate=True)
    assert (ids.prompt_estimate, ids.max_tokens) == (3.0, None)


@pytest.mark.parametrize(("raw", "error", "code"), [
    (b"", InvalidJSONError, "invalid_json"),
    (b"{nope", InvalidJSONError, "invalid_json"),
    (b"[1]", InvalidJSONError, "invalid_json"),
    (b'{"prompt":"x"}', RequestError, "missing_model"),
    (b'{"model":""}', RequestError, "invalid_model"),
    (b'{"model":"m","stream":"yes"}', RequestError, "invalid_type"),
    (b'{"model":"m","stream_options":[]}', RequestError, "invalid_type"),
    (b'{"model":"m","max_tokens":"5"}', RequestError, "invalid_type"),
])
def test_a_malformed_request_is_refused_with_its_code(raw: bytes, error: type[RequestError],
                                                       code: str) -> None:
    with pytest.raises(error) as caught:
        prep(raw)
    assert caught.value.code == code and caught.value.status == 400


def test_the_precision_header_must_agree_with_the_model_suffix() -> None:
    assert prep({"model": "m"}, " FP8 ").precision == "fp8"
    assert prep({"model": "m@int4"}, "int4").precision == "int4"
    with pytest.raises(RequestError) as caught:
        prep({"model": "m@int4"}, "fp8")
    assert caught.value.code == "conflicting_precision"


def test_an_unknown_model_is_prepared_for_the_caller_to_refuse() -> None:
    """Whether the model exists is the admit step's question (after the body's checks)."""
    req = prep({"model": "nope", "stream": True})
    assert req.model == "nope" and req.upstream_model is None and req.upstream is req.raw


@pytest.mark.parametrize(("name", "value", "code"), [
    ("max_tokens", b'"5"', "invalid_type"),
    ("max_tokens", b"-5", "integer_below_min_value"),
    ("max_tokens", b"0", "integer_below_min_value"),
    ("max_tokens", b"1e308", "invalid_type"),
    ("max_tokens", b"2.5", "invalid_type"),
    ("max_tokens", b"5.0", "invalid_type"),
    ("max_tokens", b"true", "invalid_type"),
    ("max_tokens", b"[5]", "invalid_type"),
    ("max_completion_tokens", b"false", "invalid_type"),
    ("max_completion_tokens", b"-1", "integer_below_min_value"),
])
def test_a_token_limit_that_is_not_a_positive_integer_is_refused_naming_it(
        name: str, value: bytes, code: str) -> None:
    """Admission and routing read it, so the gateway checks it (the prompt it leaves alone)."""
    raw = b'{"model":"m","prompt":"x","%s":%s}' % (name.encode(), value)
    with pytest.raises(RequestError) as caught:
        prep(raw)
    assert (caught.value.code, caught.value.param, caught.value.status) == (code, name, 400)


def test_a_positive_integer_or_null_token_limit_is_taken() -> None:
    req = prep({"model": "m", "prompt": "x", "max_tokens": 1, "max_completion_tokens": None},
               estimate=True)
    assert req.max_tokens == 1  # a null max_completion_tokens is unset
    req = prep({"model": "m", "messages": "not checked here", "max_tokens": 2**40})
    assert req.body["max_tokens"] == 2**40
