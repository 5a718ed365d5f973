"""A client that hangs up as soon as it has read what it wanted (as the openai SDK and GuideLLM
do after `data: [DONE]`)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import orjson

from tests.support.gateway import KEY_A


async def raw_stream(url: str, path: str, body: dict[str, Any], stop_at: bytes, *,
                     key: str = KEY_A, read_timeout_s: float = 10.0) -> bytes:
    """POST with a raw socket, read until `stop_at` has arrived, then close at once, as the
    openai SDK does after `[DONE]`. Returns what was read."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    data = orjson.dumps(body)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                 .encode() + data)
    got = b""
    try:
        while stop_at not in got:
            chunk = await asyncio.wait_for(reader.read(65536), read_timeout_s)
            if not chunk:
                break
            got += chunk
    finally:
        writer.close()
    return got
