"""A minimal OpenAI-compatible streaming endpoint with exact, fixed timing, for testing and
benchmarking the load generator itself (`wattgate loadgen selftest-engine`).

It is a raw asyncio protocol (no web framework), reading requests and writing answers through
`wire` as the gateway's front does, so that it costs far less per request than the client it
measures: it answers `POST /v1/chat/completions` and `/v1/completions` with an SSE
stream of exactly `max_tokens` token events, the first after `ttft_s` and the others `itl_s`
apart (all in one write when both are 0), then a usage chunk and `[DONE]`. Header
`x-sim-fault: stall-ms:N` delays that request's first token by N ms more, as the simulated engine
does. `GET /health`, `/v1/models` and `/readyz` answer `{}`; a body that is not a completion
request (or asks for more than MAX_TOKENS, or a stall that is not a finite number >= 0) gets a
JSON 400, anything else a JSON 404, and the connection closes after either.

Its usage reports prompt tokens as the simulated engine counts them (words, plus 4 per chat
message), or, given a tokenizer (`--tokenizer`), as that tokenizer encodes them: a completion's
prompt with the tokenizer's special tokens, a chat's message contents alone (there is no chat
template). Encoding costs the engine time per request: use it to check prompt lengths, not to
measure timing.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import orjson

from wire.request_head import Handoff, Refusal, RequestHead, parse_head
from wire.response_encoder import LAST_CHUNK, chunk, encode_response, encode_stream_head

_ROUTES = frozenset((b"/v1/chat/completions", b"/v1/completions"))  # POST
_GET_ROUTES = frozenset((b"/health", b"/v1/models", b"/readyz"))  # answered with {}
MAX_BODY_BYTES = 64 * 1024 * 1024  # far past any prompt a load test sends
# the most tokens one answer streams (a long context's worth): with no timing the whole answer
# is one write, and `max_tokens: 1e9` would ask for 80 GB of it
MAX_TOKENS = 1 << 17


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


def _error(status: int, message: str) -> bytes:
    return encode_response(status, orjson.dumps({"error": {
        "message": message, "type": "invalid_request_error", "param": None,
        "code": "not_found" if status == 404 else "bad_request"}}), "application/json", {},
        keep_alive=False)


class _Conn(asyncio.Protocol):
    """One client connection: heads parsed by wire.request_head, answers encoded by
    wire.response_encoder."""

    def __init__(self, server: SelftestEngine):
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        # an answer streams on timers: requests pipelined behind it wait in `buf` until it
        # ends, so answers go out whole and in order
        self.streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport does not subclass asyncio.Transport; it has the same methods.
        self.transport = cast(asyncio.Transport, transport)
        self.server.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.server.conns.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._serve()

    def _serve(self) -> None:
        """Answer the requests whole in `buf`, one after the other, until one streams."""
        while self.transport is not None and not self.streaming:
            head = parse_head(self.buf, _ROUTES, MAX_BODY_BYTES, _GET_ROUTES)
            if head is None:
                return
            if not isinstance(head, RequestHead):
                self._refuse(head)
                return
            end = head.body_start + head.content_length
            if len(self.buf) < end:
                return
            body = bytes(self.buf[head.body_start:end])
            del self.buf[:end]
            self.handle(head, body)

    def _refuse(self, head: Refusal | Handoff) -> None:
        """What is not served here (another route or method, a body coding, HTTP/1.0) is a
        404, a head no server should take its own status; the connection closes either way."""
        assert self.transport is not None
        self.buf.clear()
        if isinstance(head, Refusal):
            self.transport.write(_error(head.status, head.reason))
        else:
            self.transport.write(_error(404, "the self-test engine serves POST "
                                        "/v1/chat/completions and /v1/completions"))
        self.transport.close()

    def _finish(self, data: bytes, keep_alive: bool) -> None:
        """Write the answer's last bytes; close when the client asked to."""
        if self.transport is not None:
            self.transport.write(data)
            if not keep_alive:
                self.transport.close()

    def handle(self, head: RequestHead, body: bytes) -> None:
        if head.method == b"GET":
            self._finish(encode_response(200, b"{}", "application/json", {}, head.keep_alive),
                         head.keep_alive)
            return
        chat = head.path == "/v1/chat/completions"
        try:
            req = orjson.loads(body)
            n = int(req.get("max_tokens") or 16)
            if not 1 <= n <= MAX_TOKENS:
                raise ValueError(n)
            p_tokens = prompt_tokens(req, chat, self.server.count_prompt)
            fault = head.headers.get(b"x-sim-fault", b"").decode("latin-1")
            stall_s = (float(fault.split(":", 1)[1]) / 1000.0 if fault.startswith("stall-ms:")
                       else 0.0)
            if not 0.0 <= stall_s < math.inf:  # NaN too: the loop's timers take neither
                raise ValueError(stall_s)
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError,
                OverflowError) as exc:
            self._finish(_error(400, f"not a completion request: {type(exc).__name__}"), False)
            return
        self.server.requests += 1
        self._stream(chat, n, p_tokens, stall_s, head.keep_alive)

    def _stream(self, chat: bool, n: int, p_tokens: int, stall_s: float, keep_alive: bool
                ) -> None:
        assert self.transport is not None
        head = encode_stream_head({}, keep_alive)
        timing = self.server.timing
        event = _token_event(chat)
        tail = chunk(_tail(p_tokens, n)) + LAST_CHUNK
        if timing.ttft_s == 0 and timing.itl_s == 0 and stall_s == 0:
            self._finish(head + chunk(event * n) + tail, keep_alive)
            return
        self.transport.write(head)
        self.streaming = True
        loop = asyncio.get_running_loop()
        start = loop.time()

        def emit(i: int) -> None:
            if self.transport is None:
                return
            if i + 1 < n:
                self.transport.write(chunk(event))
                # Absolute times from the start, so timer slack does not accumulate.
                loop.call_at(start + stall_s + timing.ttft_s + (i + 1) * timing.itl_s, emit,
                             i + 1)
            else:
                self.streaming = False
                self._finish(chunk(event) + tail, keep_alive)
                self._serve()  # what was pipelined behind it

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
