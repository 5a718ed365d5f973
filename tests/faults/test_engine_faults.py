"""What a client sees for each engine fault, through the real gateway (front and aiohttp paths),
and how each request is recorded (record sinks and the access log)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from core.records import RequestRecord
from tests.faults.helpers import access_log_of, body, ep, error_of, post, sse_events
from tests.support.fault_engine import (
    ENGINE_429_CODE,
    ENGINE_429_MESSAGE,
    ENGINE_JSON_ERROR,
    ENGINE_TEXT_ERROR,
    FaultEngine,
    fault_engine,
)
from tests.support.gateway import make_config, running_gateway

pytestmark = pytest.mark.timeout(90)
TIMEOUTS = {"connect_s": 2, "first_byte_s": 1.5, "read_s": 1.5, "total_s": 30}

# mode -> (client status, error code, Retry-After, text the engine's message must keep)
BEFORE_HEAD: dict[str, tuple[int, str, str | None, str | None]] = {
    "hang-head": (504, "upstream_timeout", None, None),
    "bad-status": (502, "upstream_protocol_error", None, None),
    "big-head": (502, "upstream_protocol_error", None, None),
    "429": (429, ENGINE_429_CODE, "7", ENGINE_429_MESSAGE),
    "500-text": (500, "upstream_http_500", None, ENGINE_TEXT_ERROR),
    "500-json": (500, "upstream_http_500", None, ENGINE_JSON_ERROR),
    "503-text": (503, "upstream_http_503", "3", ENGINE_TEXT_ERROR),
    "503-json": (503, "upstream_http_503", "3", ENGINE_JSON_ERROR),
}
# the record's status: the error code, except that an engine's own code stays out of the
# (bounded) status label: an engine error is recorded as upstream_http_<status>
RECORD_STATUS = {mode: (f"upstream_http_{want[0]}" if mode in ("429", "500-text", "500-json",
                                                                  "503-text", "503-json")
                        else want[1]) for mode, want in BEFORE_HEAD.items()}


def _check_error(status: int, raw: bytes, headers: dict[str, str],
                 want: tuple[int, str, str | None, str | None]) -> None:
    want_status, want_code, want_retry, want_text = want
    err = error_of(raw)  # OpenAI-style JSON, whatever the engine sent
    assert (status, err["code"]) == (want_status, want_code), raw
    assert headers.get("Content-Type", "").startswith("application/json")
    assert headers.get("Retry-After") == want_retry
    if want_text is not None:
        assert want_text in err["message"]
    assert "127.0.0.1" not in raw.decode() and "Traceback" not in raw.decode()
    assert "x-wattgate-request-id" in headers


async def _serve_faults(tmp_path: Path, front: bool, calls: list[tuple[dict[str, Any], str]]
                        ) -> tuple[list[tuple[int, bytes, dict[str, str]]], list[RequestRecord],
                                   list[dict[str, Any]]]:
    """Send each (body, x-fault) through a one-engine gateway, then one normal request."""
    records: list[RequestRecord] = []
    log = tmp_path / "access.log"
    results = []
    async with fault_engine(FaultEngine()) as eng:
        config = make_config([ep(eng)], timeouts=TIMEOUTS, access_log=str(log))
        async with running_gateway(config, sinks=[records.append], front=front) as gw, \
                aiohttp.ClientSession() as s:
            for req, fault in calls:
                results.append(await post(s, gw, req, {"x-fault": fault}))
            # one failure never takes the only endpoint away: the next request is served
            results.append(await post(s, gw, body()))
            lines = await access_log_of(log, len(calls) + 1)
    status, raw, _ = results[-1]
    assert status == 200 and b"tok" in raw, raw
    return results[:-1], records, lines


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
@pytest.mark.parametrize("mode", list(BEFORE_HEAD))
async def test_engine_fault_before_the_head_reaches_the_client_as_one_json_error(
        tmp_path: Path, mode: str, front: bool) -> None:
    """Streamed or not, a fault before the engine's head gives the client the mode's status,
    an OpenAI-style JSON error with a stable code (the engine's message kept, its
    Retry-After kept for 429/503), and one record and access-log line with that status."""
    want = BEFORE_HEAD[mode]
    calls = [(body(stream=False), mode), (body(stream=True), mode)]
    results, records, lines = await _serve_faults(tmp_path, front, calls)
    for status, raw, headers in results:
        _check_error(status, raw, headers, want)
    failed = records[:2]
    assert [(r.status, r.http_status) for r in failed] == [(RECORD_STATUS[mode], want[0])] * 2
    assert [r.engine for r in failed] == ["e1", "e1"]
    by_id = {line["request_id"]: line for line in lines}
    for (_, _, headers), rec in zip(results, failed, strict=True):
        line = by_id[headers["x-wattgate-request-id"]]
        assert (line["status"], line["http_status"]) == (rec.status, rec.http_status)
        assert line["endpoint"] == "e1"
    assert records[-1].status == "ok"


MID_STREAM = {
    "hang-mid": "upstream_timeout",
    "truncate": "upstream_stream_error",
    "reset-mid": "upstream_stream_error",
}


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
@pytest.mark.parametrize("mode", list(MID_STREAM))
async def test_engine_fault_mid_stream_ends_the_stream_with_an_error_event(
        tmp_path: Path, mode: str, front: bool) -> None:
    """After 2 token events the engine hangs, closes mid-event or resets: the client got a 200
    stream with those 2 events and then one error event with the stable code (no half event,
    no [DONE]); the record keeps the 2 tokens relayed and the error status."""
    want_code = MID_STREAM[mode]
    results, records, lines = await _serve_faults(tmp_path, front,
                                                  [(body(stream=True, max_tokens=8), mode)])
    status, raw, _ = results[0]
    assert status == 200
    events = sse_events(raw)
    assert len(events) == 3, raw
    assert all(e.startswith(b"data: {") and e.endswith(b"}") for e in events)
    assert error_of(events[-1][len(b"data: "):])["code"] == want_code
    assert b"[DONE]" not in raw
    rec = records[0]
    assert rec.status == want_code and rec.completion_tokens == 2 and rec.first_token_s is not None
    assert lines[0]["status"] == want_code and lines[0]["completion_tokens"] == 2
