"""Every error the gateway sends is OpenAI-style JSON with a stable code, also for heads aiohttp
refuses itself (400, or 505 for an HTTP version other than 1.x); nothing of the input is
echoed; no Server header names Python or aiohttp."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.faults.helpers import ADMIN, body, ep, error_of, metrics_text, post, read_response
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway import make_config, running_gateway

pytestmark = pytest.mark.timeout(60)
CANARY = b"CANARY7f3a"

MALFORMED = {
    "bad-request-line": b"GARBAGE " + CANARY + b" WHAT\r\n\r\n",
    "bare-lf-in-header": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Note: " + CANARY
                          + b"\nX-Evil: 1\r\n\r\n"),
    "nul-in-header": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-"
                      + CANARY + b"\x00\r\nContent-Length: 2\r\n\r\n{}"),
    "http10-bad-length": (b"POST /v1/completions HTTP/1.0\r\nContent-Length: " + CANARY
                          + b"\r\n\r\n"),
    "unknown-version": b"GET /v1/models HTTP/7.3\r\nX-Note: " + CANARY + b"\r\n\r\n",
    # bare LFs only: no CRLF CRLF ever comes, and the answer must not wait for the head deadline
    "bare-lf-only": b"GET /healthz HTTP/1.1\nHost: x\nX-Note: " + CANARY + b"\n\n",
    "length-and-chunked": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                           b"Transfer-Encoding: chunked\r\nX-Note: " + CANARY + b"\r\n\r\n"
                           b"0\r\n\r\n"),
    "two-lengths": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                    b"Content-Length: 3\r\nX-Note: " + CANARY + b"\r\n\r\n{}"),
    "obs-fold": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Note: a\r\n " + CANARY
                 + b"\r\n\r\n"),
    "bad-chunked-body": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                         b"chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n"
                         b'{"prompt": "' + CANARY + b'"}\r\n0\r\n\r\n'),
}


# answered otherwise than 400 bad_request: (status, code, the counter's reason)
NOT_400 = {"unknown-version": (505, "http_version_not_supported", "http_version_not_supported")}


def _no_python_server(headers: dict[str, str]) -> None:
    server = {k.lower(): v for k, v in headers.items()}.get("server", "")
    assert "python" not in server.lower() and "aiohttp" not in server.lower(), server


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_malformed_requests_get_json_400_bad_request_without_echo(case: str) -> None:
    async with fault_engine(FaultEngine()) as eng, running_gateway(make_config([ep(eng)])) as gw:
        port = int(gw.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(MALFORMED[case])
            # well inside listen.header_timeout_s (10 s): a refusal is at once
            status, headers, data, _ = await read_response(reader, 3, check_close=False)
        finally:
            writer.close()
        async with aiohttp.ClientSession() as s:
            counted = await metrics_text(s, gw)
    want_status, want_code, reason = NOT_400.get(case, (400, "bad_request", "bad_request"))
    assert f'wattgate_client_connection_errors_total{{reason="{reason}"}} 1.0' in counted
    assert status == want_status, data
    assert headers.get("content-type", "").startswith("application/json")
    assert error_of(data)["code"] == want_code
    assert CANARY not in data
    _no_python_server(headers)


async def test_no_server_header_names_python_or_aiohttp_on_any_path(tmp_path: Path) -> None:
    async with fault_engine(FaultEngine()) as eng, \
            running_gateway(make_config([ep(eng)])) as gw, aiohttp.ClientSession() as s:
        for path in ("/healthz", "/metrics", "/nope"):
            async with s.get(gw + path) as r:
                _no_python_server(dict(r.headers))
        _, _, headers = await post(s, gw, body())
        _no_python_server(headers)
        _, _, headers = await post(s, gw, body(stream=True))
        _no_python_server(headers)


async def test_usage_since_nan_is_400(tmp_path: Path) -> None:
    async with fault_engine(FaultEngine()) as eng:
        config = make_config([ep(eng)], accounting={
            "ledger": {"kind": "sqlite", "path": str(tmp_path / "ledger.db")}})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            for query in ("since=nan", "until=nan", "since=inf", "since=-inf"):
                async with s.get(gw + "/admin/v1/usage?" + query, headers=ADMIN) as r:
                    assert r.status == 400, query
                    error_of(await r.read())


@pytest.mark.parametrize("value", [b'"5"', b"-5", b"0", b"1e308", b"2.5", b"true"])
async def test_a_max_tokens_that_is_not_a_positive_integer_is_400_and_never_reaches_the_engine(
        value: bytes) -> None:
    raw = b'{"model":"m","prompt":"hi","max_tokens":' + value + b"}"
    async with fault_engine(FaultEngine()) as eng, running_gateway(make_config([ep(eng)])) as gw, \
            aiohttp.ClientSession() as s:
        status, data, _ = await post(s, gw, raw)
        counted = await metrics_text(s, gw)
        assert eng.completions == 0
    err = error_of(data)
    assert (status, err["type"], err["param"]) == (400, "invalid_request_error", "max_tokens")
    assert f'status="{err["code"]}"' in counted  # recorded like any other refused request


async def test_usage_over_a_window_past_the_epoch_or_far_ahead_is_answered(tmp_path: Path
                                                                           ) -> None:
    """Finite but huge bounds: the window's whole hours were integers past 64 bits for the
    store (500 internal_error); they read as the span there is, with the request served."""
    async with fault_engine(FaultEngine()) as eng:
        config = make_config([ep(eng)], accounting={
            "ledger": {"kind": "sqlite", "path": str(tmp_path / "ledger.db")}})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as s:
            status, raw, _ = await post(s, gw, body())
            assert status == 200, raw

            async def requests_in(query: str) -> int:
                async with s.get(gw + "/admin/v1/usage?group_by=tenant&" + query,
                                 headers=ADMIN) as r:
                    assert r.status == 200, (query, await r.text())
                    return int((await r.json())["total"]["requests"])

            for _ in range(100):  # until the ledger has it (written in batches)
                if await requests_in("since=-1h"):
                    break
                await asyncio.sleep(0.1)
            for query in ("since=-1e300", "since=0&until=1e300", "since=-1e300&until=1e300"):
                assert await requests_in(query) == 1, query
