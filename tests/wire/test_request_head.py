"""The lean front's request-head parser: it serves the plain shape, hands over the rest."""

from __future__ import annotations

import pytest

from wire.request_head import (
    BARE_LF,
    CODING_NOT_IMPLEMENTED,
    HANDOFF,
    HEAD_TOO_LARGE,
    MAX_HEAD_BYTES,
    NO_VERSION,
    URI_TOO_LONG,
    VERSION_NOT_SUPPORTED,
    RequestHead,
    parse_head,
    shape_refusal,
)

ROUTES = frozenset({b"/v1/completions", b"/v1/chat/completions"})
GOOD = (b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer k\r\n"
        b"Content-Type: application/json\r\nX-Trace:  a b \r\nContent-Length: 2\r\n\r\n{}")


def test_plain_completion_request_is_parsed() -> None:
    head = parse_head(GOOD, ROUTES, 1024)
    assert isinstance(head, RequestHead)
    assert head.path == "/v1/completions" and head.content_length == 2 and head.keep_alive
    assert GOOD[head.body_start:] == b"{}"
    assert head.headers[b"authorization"] == b"Bearer k"
    assert (b"X-Trace", b"a b") in head.raw_headers  # value trimmed, name as sent


def test_incomplete_head_waits_and_an_endless_one_is_refused_431() -> None:
    assert parse_head(GOOD[:40], ROUTES, 1024) is None
    assert parse_head(b"POST /v1/completions HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES,
                      ROUTES, 1024) is HEAD_TOO_LARGE
    assert HEAD_TOO_LARGE.status == 431


@pytest.mark.parametrize("request_bytes", [
    b"GET /v1/models HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(5000)),
    b"GET /v1/models HTTP/1.1\r\nX: " + b"a" * 200_000 + b"\r\n\r\n",  # whole, but too big
    b"GET /v1/models HTTP/1.1\r\n" + b"a:b\r\n" * 5000 + b"\r\n",
])
def test_a_head_past_the_limit_is_431_whatever_its_route(request_bytes: bytes) -> None:
    assert parse_head(request_bytes, ROUTES, 1024) is HEAD_TOO_LARGE


@pytest.mark.parametrize("tail", [b"", b" HTTP/1.1\r\nHost: x\r\n\r\n"])
def test_a_request_line_past_the_limit_is_414(tail: bytes) -> None:
    request_bytes = b"GET /v1/models?q=" + b"a" * 100_000 + tail
    assert parse_head(request_bytes, ROUTES, 1024) is URI_TOO_LONG
    assert URI_TOO_LONG.status == 414


@pytest.mark.parametrize("request_bytes", [
    b"GET /healthz HTTP/1.1\nHost: x\n\n",  # the whole head in bare LFs: no CRLF CRLF ever
    b"GET /healthz HTTP/1.1\n",  # the first line is enough to tell
    b"POST /v1/completions HTTP/1.1\r\nHost: x\nContent-Length: 2\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\n\r\n\r\n{}",
    GOOD.replace(b"Host: gw", b"X-A: a\nX-Injected: b"),  # whole head, one bare LF in it
    # a bare-LF head whose "body" holds a CRLF CRLF: still the head's bare LF that counts
    b"POST /v1/completions HTTP/1.1\nContent-Length: 8\n\nab\r\n\r\ncd",
])
def test_a_bare_lf_in_the_head_is_refused_400_at_once(request_bytes: bytes) -> None:
    assert parse_head(request_bytes, ROUTES, 1024) is BARE_LF
    assert (BARE_LF.status, BARE_LF.reason) == (400, "bad_request")


def test_a_crlf_split_between_reads_is_not_a_bare_lf() -> None:
    """A head cut after its CR waits for the LF."""
    assert parse_head(GOOD[:GOOD.index(b"\r\n") + 1], ROUTES, 1024) is None
    assert parse_head(GOOD[:GOOD.index(b"\r\n") + 2], ROUTES, 1024) is None


def test_connection_close_is_noted() -> None:
    head = parse_head(GOOD.replace(b"Host: gw", b"Connection: Close"), ROUTES, 1024)
    assert isinstance(head, RequestHead) and not head.keep_alive


@pytest.mark.parametrize("request_bytes", [
    GOOD.replace(b"POST", b"GET"),  # other methods
    GOOD.replace(b"/v1/completions", b"/v1/models"),  # other routes
    GOOD.replace(b"/v1/completions", b"/v1/completions?x=1"),  # query strings
    GOOD.replace(b"HTTP/1.1", b"HTTP/1.0"),
    GOOD.replace(b"Content-Length: 2", b"Transfer-Encoding: chunked"),
    GOOD.replace(b"Host: gw", b"Expect: 100-continue"),
    GOOD.replace(b"Host: gw", b"Upgrade: h2c"),
    GOOD.replace(b"Content-Length: 2\r\n", b""),  # no length
    GOOD.replace(b"Content-Length: 2", b"Content-Length: +2"),
    GOOD.replace(b"Host: gw", b"Content-Length: 2"),  # duplicate length
    GOOD.replace(b"Content-Length: 2", b"Content-Length: 2000"),  # over the body limit
    GOOD.replace(b"Host: gw", b"Host gw"),  # not a header line
    GOOD.replace(b"Host: gw", b"Bad Name: v"),  # name is not a token
    GOOD.replace(b"Host: gw", b"X-A: a\rb"),  # bare CR
    GOOD.replace(b"Host: gw", b"X-A: a\x00b"),
    GOOD.replace(b"Host: gw", b" folded"),  # obsolete line folding
    b"\r\n" + GOOD,  # leading empty line
])
def test_anything_unusual_is_handed_to_aiohttp(request_bytes: bytes) -> None:
    assert parse_head(request_bytes, ROUTES, 1024) is HANDOFF


def test_repeated_headers_are_joined_for_lookup_and_kept_apart_for_forwarding() -> None:
    head = parse_head(GOOD.replace(b"Host: gw", b"Host: gw\r\nX-Tag: a\r\nX-Tag: b"), ROUTES, 1024)
    assert isinstance(head, RequestHead)
    assert head.headers[b"x-tag"] == b"a, b"
    assert [v for n, v in head.raw_headers if n == b"X-Tag"] == [b"a", b"b"]


@pytest.mark.parametrize(("request_bytes", "refusal"), [
    (b"GET /healthz\r\n\r\n", NO_VERSION),  # HTTP/0.9
    (GOOD.replace(b"HTTP/1.1", b"HTTP/2.0"), VERSION_NOT_SUPPORTED),
    (GOOD.replace(b"HTTP/1.1", b"HTTP/0.9"), VERSION_NOT_SUPPORTED),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", VERSION_NOT_SUPPORTED),  # the HTTP/2 preface
    (GOOD.replace(b"Content-Length: 2", b"Transfer-Encoding: gzip, chunked"),
     CODING_NOT_IMPLEMENTED),
    (GOOD.replace(b"Content-Length: 2", b"Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip"),
     CODING_NOT_IMPLEMENTED),
    (GOOD.replace(b"Content-Length: 2", b"Transfer-Encoding: identity"), CODING_NOT_IMPLEMENTED),
    (GOOD.replace(b"HTTP/1.1", b"HTTP/1.0").replace(b"Content-Length: 2",
                                                    b"Transfer-Encoding: gzip"),
     CODING_NOT_IMPLEMENTED),
])
def test_no_version_another_version_or_an_unknown_coding_is_refused(
        request_bytes: bytes, refusal: object) -> None:
    assert parse_head(request_bytes, ROUTES, 1024) is refusal


def test_the_shape_rules_aiohttp_asks_too() -> None:
    assert shape_refusal((1, 1), None) is None
    assert shape_refusal((1, 0), b" Chunked ") is None
    assert shape_refusal(None, None) is NO_VERSION
    assert shape_refusal((2, 0), None) is VERSION_NOT_SUPPORTED
    assert shape_refusal((1, 1), b"chunked, gzip") is CODING_NOT_IMPLEMENTED


GET_ROUTES = frozenset({b"/health"})


def test_a_get_to_a_get_route_is_parsed_with_no_body() -> None:
    request_bytes = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nPOST /next"
    head = parse_head(request_bytes, ROUTES, 1024, GET_ROUTES)
    assert isinstance(head, RequestHead)
    assert (head.method, head.path, head.content_length) == (b"GET", "/health", 0)
    assert request_bytes[head.body_start:] == b"POST /next"  # the next request starts there
    post = parse_head(GOOD, ROUTES, 1024, GET_ROUTES)
    assert isinstance(post, RequestHead) and post.method == b"POST"


@pytest.mark.parametrize(("request_bytes", "get_routes"), [
    (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", frozenset()),  # the front's case
    (b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", GET_ROUTES),  # a POST route, by GET
    (b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", GET_ROUTES),
    (b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n", GET_ROUTES),
])
def test_a_method_its_route_is_not_served_for_is_handed_off(
        request_bytes: bytes, get_routes: frozenset[bytes]) -> None:
    assert parse_head(request_bytes, ROUTES, 1024, get_routes) is HANDOFF
