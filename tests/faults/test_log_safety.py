"""The gateway's log (a `wattgate serve` process, `logging: {format: json}`) never holds an API
key, prompt text or raw header bytes, whatever the input; each failed request is one log line
carrying its request id."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.faults.helpers import (
    body,
    completion_head,
    ep,
    gateway_process,
    post,
    read_response,
    write_config,
)
from tests.support.procs import free_port, running

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
KEY = "sk-LOGCANARYKEY0123456789"
PROMPT = "PROMPTCANARY the secret plan"
HEADER = "HDRCANARY-value"
CANARIES = ("LOGCANARYKEY", "PROMPTCANARY", "HDRCANARY")

RAW_INPUTS = [
    # a key with a NUL (aiohttp refuses the head)
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
     + b"\x00\r\nContent-Length: 2\r\n\r\n{}"),
    # a bare LF inside a header
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Note: " + HEADER.encode() + b"\nAuthorization: "
     b"Bearer " + KEY.encode() + b"\r\n\r\n"),
    # a bad chunked body that carries prompt text
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
     + b"\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n"
     b'{"model": "m", "prompt": "' + PROMPT.encode() + b'"}\r\n0\r\n\r\n'),
    # a body that is not JSON, with prompt text
    completion_head(len(PROMPT)) + PROMPT.encode(),
    # an oversized header line naming the key
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + HEADER.encode() * 2000 + b"\r\n\r\n"),
]


async def _send_raw(port: int, data: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await read_response(reader, 15, check_close=False)
    except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
        pass  # a refused head may just be closed: what matters here is the log
    finally:
        writer.close()


async def test_gateway_log_holds_no_key_prompt_or_header_bytes(tmp_path: Path) -> None:
    port = free_port()
    engine_url = f"http://127.0.0.1:{port}"
    engine_cmd = [sys.executable, "-m", "tests.support.fault_engine", "--port", str(port)]
    config, gw_port = write_config(tmp_path, [ep(engine_url)],
                                   logging={"format": "json", "level": "info"},
                                   timeouts={"first_byte_s": 2, "read_s": 2})
    log = tmp_path / "gateway.log"
    failed_ids = []
    with running(engine_cmd, engine_url + "/health"), \
            gateway_process(config, gw_port, log) as gw:
        for data in RAW_INPUTS:
            await _send_raw(gw_port, data)
        async with aiohttp.ClientSession() as s:
            prompt_body = {**body(stream=True), "prompt": PROMPT}
            # engine faults with prompt text and canary headers on the way
            for fault in ("truncate", "500-text", "bad-status", "hang-head", "reset"):
                status, _, headers = await post(s, gw, prompt_body,
                                                {"x-fault": fault, "X-Note": HEADER})
                failed_ids.append(headers["x-wattgate-request-id"])
            status, _, _ = await post(s, gw, prompt_body, {"Authorization": f"Bearer {KEY}"})
            assert status == 401
            status, _, _ = await post(s, gw, prompt_body)
            assert status == 200
    text = log.read_text(errors="replace")
    for canary in CANARIES:
        assert canary not in text, f"{canary} leaked into the gateway log"
    assert "\\x00" not in text and "\x00" not in text
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))  # format json: every log record is one object
    assert records, "no JSON log lines"
    for request_id in failed_ids:
        lines = [line for line in text.splitlines() if request_id in line]
        assert len(lines) == 1, (request_id, lines)
