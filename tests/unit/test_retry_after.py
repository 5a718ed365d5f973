"""An engine's Retry-After as the gateway reads it: delay-seconds or an HTTP-date (RFC 9110),
passed on exactly up to a day; anything else is no Retry-After."""

from __future__ import annotations

import pytest

from core.errors import MAX_RETRY_AFTER_S, engine_error, retry_after_seconds

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


@pytest.mark.parametrize(("value", "seconds"), [
    (b"7", 7), (b" 12 ", 12), (b"0", 0),
    (b"99999999999999999999999", MAX_RETRY_AFTER_S),  # passed on as a day, not as a float's digits
    (b"Fri, 15 Jan 2027 08:00:30 GMT", 30),  # an HTTP-date: from now
    (b"Fri, 15 Jan 2027 07:00:00 GMT", 0),  # already past
    (b"Wed, 21 Oct 2037 07:28:00 GMT", MAX_RETRY_AFTER_S),
    (b"-5", None), (b"1.5", None), (b"garbage", None), (b"", None),
    (b"\xd9\xa3", None),  # a non-ASCII digit
    (b"Fri, 15 Jan 2027 08:00:30", None),  # an HTTP-date is GMT
])
def test_retry_after_seconds(value: bytes, seconds: int | None) -> None:
    assert retry_after_seconds(value, now=NOW) == seconds


def test_an_engines_http_date_retry_after_reaches_the_client() -> None:
    """It used to be dropped: the client of a 429 got no Retry-After at all."""
    error = engine_error(429, b"{}", [(b"Retry-After", b"Wed, 21 Oct 2037 07:28:00 GMT")])
    assert error.headers() == {"Retry-After": str(MAX_RETRY_AFTER_S)}
    huge = engine_error(429, b"{}", [(b"retry-after", b"99999999999999999999999")])
    assert huge.headers() == {"Retry-After": "86400"}
    assert engine_error(503, b"{}", [(b"Retry-After", b"soon")]).headers() == {}
