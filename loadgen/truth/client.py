"""The client side: one request of a given shape through the gateway, streamed or not, read
fast or slowly, run to the end or dropped after some tokens."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
import orjson

from loadgen.truth.fleet import MODEL, api_key

ID_HEADER = "x-wattgate-request-id"
TOKEN_MARK = b'"finish_reason"'  # one per choice in every token-bearing chunk (vLLM shapes)


@dataclass(frozen=True, slots=True)
class Shape:
    """What a client asks for and how it behaves. Prompts are words of 3 letters and a
    space: the simulator counts one token per word, and so does the gateway's 4-byte
    estimate when it has to count a dropped stream's prompt itself."""

    cls: str  # request class, for the report
    tenant: str
    prompt_tokens: int
    max_tokens: int
    stream: bool = True
    chat: bool = False
    cancel_after: int | None = None  # hang up after this many token events
    read_pause_s: float = 0.0  # a slow reader: pause after every read
    n: int = 1


@dataclass(frozen=True, slots=True)
class Sent:
    shape: Shape
    request_id: str | None  # the gateway's id (None: no response head came back)
    http_status: int
    tokens_seen: int
    cancelled: bool
    duration_s: float
    error: str = ""


def body(shape: Shape) -> bytes:
    words = " ".join(["tok"] * shape.prompt_tokens)
    doc: dict[str, object] = {"model": MODEL, "max_tokens": shape.max_tokens,
                              "stream": shape.stream}
    if shape.chat:
        doc["messages"] = [{"role": "user", "content": words}]
    else:
        doc["prompt"] = words
    if shape.n != 1:
        doc["n"] = shape.n
    return orjson.dumps(doc)


async def send(http: aiohttp.ClientSession, base_url: str, shape: Shape,
               timeout_s: float = 120.0) -> Sent:
    """Send one request and read it as `shape` says; never raises for an HTTP or wire error."""
    path = "/v1/chat/completions" if shape.chat else "/v1/completions"
    headers = {"authorization": f"Bearer {api_key(shape.tenant)}",
               "content-type": "application/json"}
    t0 = time.monotonic()
    rid: str | None = None
    status = 0
    tokens = 0
    try:
        async with asyncio.timeout(timeout_s), http.post(
                f"{base_url}{path}", data=body(shape), headers=headers) as resp:
            rid, status = resp.headers.get(ID_HEADER), resp.status
            if not shape.stream or status != 200:
                await resp.read()
                return Sent(shape, rid, status, 0, False, time.monotonic() - t0)
            async for chunk in resp.content.iter_any():
                tokens += chunk.count(TOKEN_MARK)
                if shape.cancel_after is not None and tokens >= shape.cancel_after:
                    resp.close()  # drop the connection mid-stream, as a client that hangs up
                    return Sent(shape, rid, status, tokens, True, time.monotonic() - t0)
                if shape.read_pause_s:
                    await asyncio.sleep(shape.read_pause_s)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Sent(shape, rid, status, tokens, False, time.monotonic() - t0, repr(exc))
    return Sent(shape, rid, status, tokens, False, time.monotonic() - t0)


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False),
                                 timeout=aiohttp.ClientTimeout(total=None))
