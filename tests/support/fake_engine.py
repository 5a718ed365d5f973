"""A small in-process OpenAI-style engine with exactly known timing, for gateway tests.

Streams `tokens` tokens: the first after `ttft_s`, then one event every `itl_s`, with
`tokens_per_event` tokens per event; honours `stream_options.include_usage`. Request header
`x-fake-fault` injects failures: `status:503`, `abort-after:N` (drop the connection after N token
events), `stall-s:S` (sleep before the headers). It remembers every request body it received.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


@dataclass
class FakeEngine:
    ttft_s: float = 0.0
    itl_s: float = 0.0
    tokens: int = 8
    tokens_per_event: int = 1
    model: str = "fake-model"
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    port: int = 0
    done_gap_s: float = 0.0  # pause between `data: [DONE]` and the end of the response
    finish_gap_s: float = 0.0  # pause between the finish_reason event and what follows it
    aborted: int = 0  # streams whose client went away before the end
    # per stream: (request received, first token event written, last token event written),
    # time.monotonic() seconds: what the engine really did, event-loop lag included
    wire: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_post("/v1/embeddings", self.embed)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text='vllm:num_requests_running{model_name="m"} 0.0\n'
                                 'vllm:num_requests_waiting{model_name="m"} 0.0\n')

    def _chunk(self, chat: bool, text: str, finish: str | None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        return b"data: " + orjson.dumps({"id": "cmpl-1", "object": "chunk", "model": self.model,
                                         "choices": [choice]}) + b"\n\n"

    async def embed(self, request: web.Request) -> web.Response:
        """vLLM's embeddings shape; 5 prompt tokens per input, after `ttft_s`."""
        body = await request.json(loads=orjson.loads)
        self.bodies.append(body)
        inputs = body.get("input")
        n = len(inputs) if isinstance(inputs, list) else 1
        await asyncio.sleep(self.ttft_s)
        data = [{"object": "embedding", "index": i, "embedding": [0.0, 1.0]} for i in range(n)]
        return web.json_response({"object": "list", "data": data, "model": self.model,
                                  "usage": {"prompt_tokens": 5 * n, "total_tokens": 5 * n}},
                                 dumps=_dumps)

    def _role_chunk(self) -> bytes:
        return b"data: " + orjson.dumps({
            "id": "cmpl-1", "object": "chat.completion.chunk", "model": self.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": None, "finish_reason": None}]}) + b"\n\n"

    async def complete(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic()
        body = await request.json(loads=orjson.loads)
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        fault = request.headers.get("x-fake-fault", "")
        if fault.startswith("status:"):
            status = int(fault.split(":")[1])
            return web.json_response({"error": {"message": "injected", "type": "x", "code": status}},
                                     status=status)
        if fault.startswith("stall-s:"):
            await asyncio.sleep(float(fault.split(":")[1]))
        abort_after = int(fault.split(":")[1]) if fault.startswith("abort-after:") else None
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_tokens") or self.tokens)
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
        if not body.get("stream"):
            await asyncio.sleep(self.ttft_s + self.itl_s * max(0, n - 1))
            text = " tok" * n
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": text, "finish_reason": "length"})
            return web.json_response({"id": "cmpl-1", "object": "completion", "model": self.model,
                                      "choices": [choice], "usage": usage}, dumps=_dumps)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(self.ttft_s)
        if chat:  # as vLLM: the role chunk goes out with the first token, in a write of its own
            await resp.write(self._role_chunk())
        try:
            await self._stream(resp, request, chat, n, abort_after, body, usage, received)
        except (ConnectionError, asyncio.CancelledError):
            self.aborted += 1
            raise
        return resp

    async def _stream(self, resp: web.StreamResponse, request: web.Request, chat: bool, n: int,
                      abort_after: int | None, body: dict[str, Any], usage: dict[str, int],
                      received: float) -> None:
        sent = events = 0
        first = last = 0.0
        while sent < n:
            k = min(self.tokens_per_event, n - sent)
            sent += k
            events += 1
            await resp.write(self._chunk(chat, " tok" * k, "length" if sent == n else None))
            last = time.monotonic()
            first = first or last
            if abort_after is not None and events >= abort_after:
                assert request.transport is not None
                request.transport.abort()
                return
            if sent < n:
                await asyncio.sleep(self.itl_s)
        self.wire.append((received, first, last))
        if self.finish_gap_s:
            await asyncio.sleep(self.finish_gap_s)
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            await resp.write(b"data: " + orjson.dumps({"id": "cmpl-1", "object": "chunk",
                                                       "model": self.model, "choices": [],
                                                       "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        if self.done_gap_s:
            await asyncio.sleep(self.done_gap_s)
        await resp.write_eof()


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


@contextlib.asynccontextmanager
async def serving(app: web.Application, port: int = 0, *, handler_cancellation: bool = False
                  ) -> AsyncIterator[int]:
    """Serve `app` on 127.0.0.1 (a free port unless given); yields the port."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=handler_cancellation)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server = site._server
    assert server is not None
    sockets = getattr(server, "sockets", None)
    bound = sockets[0].getsockname()[1] if sockets else port
    try:
        yield int(bound)
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def fake_engine(engine: FakeEngine) -> AsyncIterator[FakeEngine]:
    async with serving(engine.app()) as port:
        engine.port = port
        yield engine


def main() -> None:
    """Run a fake engine as its own process (for tests that kill it abruptly)."""
    import argparse

    import uvloop

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-s", type=float, default=0.0)
    parser.add_argument("--itl-s", type=float, default=0.0)
    parser.add_argument("--model", default="m")
    args = parser.parse_args()

    async def run() -> None:
        engine = FakeEngine(ttft_s=args.ttft_s, itl_s=args.itl_s, model=args.model)
        async with serving(engine.app(), args.port):
            await asyncio.Event().wait()

    uvloop.run(run())


if __name__ == "__main__":
    main()
