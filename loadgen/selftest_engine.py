"""A minimal OpenAI-compatible streaming endpoint with exact, fixed timing, for testing and
benchmarking the load generator itself (`wattgate loadgen selftest-engine`).

It is a raw asyncio protocol (no web framework) so that it costs far less per request than the
client it measures: it answers `POST /v1/chat/completions` and `/v1/completions` with an SSE
stream of exactly `max_tokens` token events, the first after `ttft_s` and the others `itl_s`
apart (all in one write when both are 0), then a usage chunk and `[DONE]`. Header
`x-sim-fault: stall-ms:N` delays that request's first token by N ms more, as the simulated engine
does.

Its usage reports prompt tokens as the simulated engine counts them (words, plus 4 per chat
message), or, given a tokenizer (`--tokenizer`), as that tokenizer encodes them: a completion's
prompt with the tokenizer's special tokens, a chat's message contents alone (there is no chat
template). Encoding costs the engine time per request: use it to check prompt lengths, not to
measure timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import orjson

_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n")
_404 = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass(frozen=True, slots=True)
class EngineTiming:
    ttft_s: float = 0.0
    itl_s: float = 0.0


PromptCounter = Callable[[str, bool], int]  # (text, chat) -> prompt tokens


def count_words(text: str, chat: bool) -> int:
    """The simulated engine's count: one token per word (engines/sim/protocol.py)."""
    return len(text.split())


def token_counter(spec: str) -> PromptCounter:
    """Counts with the tokenizer `spec` names (see core.tokenizer.tokenizer_file)."""
    from core.tokenizer import load_tokenizer

    tok = load_tokenizer(spec)
    return lambda text, chat: len(tok.encode(text, add_special_tokens=not chat).ids)


def prompt_tokens(req: dict[str, Any], chat: bool, count: PromptCounter) -> int:
    if not chat:
        return count(str(req.get("prompt", "")), False)
    messages = req["messages"]
    template = 4 * len(messages) if count is count_words else 0  # the simulator's markers
    return sum(count(str(m.get("content", "")), True) for m in messages) + template


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _token_event(chat: bool) -> bytes:
    if chat:
        return (b'data: {"object":"chat.completion.chunk",'
                b'"choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n')
    return b'data: {"object":"text_completion","choices":[{"index":0,"text":"tok "}]}\n\n'


def _tail(prompt_tokens: int, completion_tokens: int) -> bytes:
    usage = orjson.dumps({"choices": [], "usage": {
        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens}})
    return b"data: " + usage + b"\n\ndata: [DONE]\n\n"


class _Conn(asyncio.Protocol):
    def __init__(self, server: SelftestEngine):
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport does not subclass asyncio.Transport; it has the same methods.
        self.transport = cast(asyncio.Transport, transport)
        self.server.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.server.conns.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            lines = head.split("\r\n")
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            length = int(headers.get("content-length", "0"))
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4: head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            self.handle(lines[0], headers, body)

    def handle(self, request_line: str, headers: dict[str, str], body: bytes) -> None:
        tr = self.transport
        if tr is None:
            return
        method, path = request_line.split(" ")[:2]
        if method == "GET":
            tr.write(_OK if path in ("/health", "/v1/models", "/readyz") else _404)
            return
        chat = path == "/v1/chat/completions"
        if not chat and path != "/v1/completions":
            tr.write(_404)
            return
        req = orjson.loads(body)
        n = int(req.get("max_tokens") or 16)
        p_tokens = prompt_tokens(req, chat, self.server.count_prompt)
        stall_s = 0.0
        fault = headers.get("x-sim-fault", "")
        if fault.startswith("stall-ms:"):
            stall_s = float(fault.split(":", 1)[1]) / 1000.0
        self.server.requests += 1
        tr.write(_HEAD)
        timing = self.server.timing
        event = _token_event(chat)
        tail = _chunk(_tail(p_tokens, n)) + b"0\r\n\r\n"
        if timing.ttft_s == 0 and timing.itl_s == 0 and stall_s == 0:
            tr.write(_chunk(event * n) + tail)
            return
        loop = asyncio.get_running_loop()
        start = loop.time()

        def emit(i: int) -> None:
            if self.transport is None:
                return
            self.transport.write(_chunk(event))
            if i + 1 < n:
                # Absolute times from the start, so timer slack does not accumulate.
                loop.call_at(start + stall_s + timing.ttft_s + (i + 1) * timing.itl_s, emit,
                             i + 1)
            else:
                self.transport.write(tail)

        loop.call_at(start + stall_s + timing.ttft_s, emit, 0)


class SelftestEngine:
    """Start with `await engine.start(host, port)`; stop with `engine.close()`."""

    def __init__(self, timing: EngineTiming = EngineTiming(),
                 count_prompt: PromptCounter = count_words):
        self.timing = timing
        self.count_prompt = count_prompt
        self.requests = 0
        self.conns: set[_Conn] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Conn(self), host, port, backlog=4096)
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            # Python 3.11's Server.close leaves accepted connections open; close them here.
            for conn in list(self.conns):
                if conn.transport is not None:
                    conn.transport.close()
            await self._server.wait_closed()

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()


def serve(host: str, port: int, timing: EngineTiming,
          count_prompt: PromptCounter = count_words) -> None:
    """Run the engine in this process until interrupted (blocking)."""
    import uvloop

    async def main() -> None:
        engine = SelftestEngine(timing, count_prompt)
        await engine.start(host, port)
        try:
            await engine.serve_forever()
        finally:
            await engine.close()

    uvloop.run(main())
