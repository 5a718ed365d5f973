"""A scriptable misbehaving engine: a real HTTP/1.1 server on 127.0.0.1 on raw asyncio protocols.

It answers like vLLM (streaming and not, chat and completions, usage when asked) unless a fault
is chosen for the request: by the request header `x-fault: MODE`, else by the next entry of
`script` (consumed one per completion request), else by `default`. `GET /health` is 200 while
`health_ok` (a hung engine passes its health checks: that is the point), else 503; `GET
/metrics` is vLLM's text.

Modes (FAULTS):
  ok            a normal answer
  hang-head     read the request, never send a byte
  hang-mid      stream: the head and `hang_after` token events, then silence
  bad-status    an invalid status line (`HTTP/1.1 2x0 WHAT`)
  truncate      stream: `hang_after` token events, half of the next one, then close
  429           429 with `Retry-After: 7` and an OpenAI-style error body
  500-text      500, text/plain body          503-text   the same with 503 and Retry-After: 3
  500-json      500, non-OpenAI JSON body     503-json   the same with 503 and Retry-After: 3
  big-head      a 200 whose head is 100 KB of headers
  reset         close with RST (SO_LINGER 0) right after reading the request
  reset-mid     stream: `hang_after` token events, then RST
  hang-body     a 200 head (non-stream: its Content-Length; stream: SSE), then silence
  trickle       a 200 head, then one byte of the answer every `trickle_s`, never ending
  short-body    non-stream: a 200 whose body is 40 bytes shorter than its Content-Length,
                then close (stream: as truncate)
  garbage       a 200 that is neither JSON nor SSE (stream: text/event-stream, no [DONE])
  sse-body      the SSE stream of a streamed answer, whether or not one was asked for

Counters: `received` (mode -> completion requests), `health_checks`, `bodies`, `headers`
(each completion request's head, names lowercased), `connections`.
Hung requests stay hung until their connection closes or the engine stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

FAULTS = ("ok", "hang-head", "hang-mid", "bad-status", "truncate", "429", "500-text", "503-text",
          "500-json", "503-json", "big-head", "reset", "reset-mid", "hang-body", "trickle",
          "short-body", "garbage", "sse-body")
GARBAGE = b"\x00\x01\xfe<html>not an answer {{{\n\n\x7f]]\n\n"
ENGINE_TEXT_ERROR = "engine exploded: CUDA out of memory (text)"
ENGINE_JSON_ERROR = "engine exploded: KV cache exhausted (json)"
ENGINE_429_MESSAGE = "engine rate limit reached, slow down"
ENGINE_429_CODE = "engine_rate_limited"
MAX_HEAD_BYTES = 64 * 1024


@dataclass
class FaultEngine:
    default: str = "ok"
    script: Iterable[str] = ()
    model: str = "m"
    tokens: int = 4
    itl_s: float = 0.0
    hang_after: int = 2  # token events before hang-mid / truncate / reset-mid strike
    trickle_s: float = 0.2  # trickle: the pause between bytes
    health_ok: bool = True  # False: /health answers 503
    port: int = 0
    received: Counter[str] = field(default_factory=Counter)
    health_checks: int = 0
    connections: int = 0  # accepted so far
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[list[tuple[str, str]]] = field(default_factory=list)
    _queue: deque[str] = field(default_factory=deque)
    _open: set[_EngineProtocol] = field(default_factory=set)
    _server: asyncio.Server | None = None

    def __post_init__(self) -> None:
        self._queue.extend(self.script)
        for mode in (self.default, *self._queue):
            if mode not in FAULTS:
                raise ValueError(f"unknown fault {mode!r}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def completions(self) -> int:
        return sum(self.received.values())

    def then(self, *modes: str) -> None:
        """Queue more scripted modes (one per upcoming completion request)."""
        self._queue.extend(modes)

    @property
    def traceparents(self) -> list[str]:
        """The `traceparent` of each completion request received ("": none)."""
        return [next((v for k, v in pairs if k.lower() == "traceparent"), "")
                for pairs in self.headers]

    def next_mode(self, header: str | None) -> str:
        if header:
            return header if header in FAULTS else "ok"
        return self._queue.popleft() if self._queue else self.default

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _EngineProtocol(self), "127.0.0.1",
                                                self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self._open):
            conn.abort()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await self._server.wait_closed()
        self._server = None

    # --- answers -----------------------------------------------------------------------------

    def _chunk(self, chat: bool, text: str, finish: str | None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        return b"data: " + orjson.dumps({
            "id": "cmpl-fault", "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 0, "model": self.model, "choices": [choice]}) + b"\n\n"

    def events(self, chat: bool, n: int, usage: bool) -> list[bytes]:
        out = [self._chunk(chat, " tok", "length" if i == n - 1 else None) for i in range(n)]
        if usage:
            out.append(b"data: " + orjson.dumps({
                "id": "cmpl-fault", "object": "chunk", "model": self.model, "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": n,
                          "total_tokens": n + 5}}) + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return out

    def whole(self, chat: bool, n: int) -> bytes:
        text = " tok" * n
        choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                   "finish_reason": "length"} if chat else
                                  {"index": 0, "text": text, "finish_reason": "length"})
        return orjson.dumps({"id": "cmpl-fault", "object": "chat.completion" if chat else
                             "text_completion", "created": 0, "model": self.model,
                             "choices": [choice],
                             "usage": {"prompt_tokens": 5, "completion_tokens": n,
                                       "total_tokens": n + 5}})


def response(status: str, headers: Iterable[tuple[str, str]], body: bytes = b"") -> bytes:
    head = [f"HTTP/1.1 {status}\r\n", f"Content-Length: {len(body)}\r\n"]
    head += [f"{k}: {v}\r\n" for k, v in headers]
    return "".join(head).encode() + b"\r\n" + body


def _error(mode: str) -> bytes:
    status = mode[:3]
    phrase = {"429": "Too Many Requests", "500": "Internal Server Error",
              "503": "Service Unavailable"}[status]
    headers: list[tuple[str, str]] = []
    if status in ("429", "503"):
        headers.append(("Retry-After", "7" if status == "429" else "3"))
    if mode == "429":
        body = orjson.dumps({"error": {"message": ENGINE_429_MESSAGE, "type": "rate_limit",
                                       "param": None, "code": ENGINE_429_CODE}})
        headers.append(("Content-Type", "application/json"))
    elif mode.endswith("-text"):
        body = ENGINE_TEXT_ERROR.encode()
        headers.append(("Content-Type", "text/plain; charset=utf-8"))
    else:  # FastAPI's shape, not OpenAI's
        body = orjson.dumps({"detail": ENGINE_JSON_ERROR})
        headers.append(("Content-Type", "application/json"))
    return response(f"{status} {phrase}", headers, body)


class _EngineProtocol(asyncio.Protocol):
    """One engine connection: requests served one at a time, keep-alive."""

    def __init__(self, engine: FaultEngine):
        self.engine = engine
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.engine.connections += 1
        self.engine._open.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.engine._open.discard(self)
        if self.task is not None:
            self.task.cancel()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        if self.busy or self.transport is None or self.transport.is_closing():
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                self.abort()
            return
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        method, target, _ = [*lines[0].split(" ", 2), "", ""][:3]
        pairs = []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            pairs.append((name.strip().lower(), value.strip()))
        headers = dict(pairs)
        length = int(headers.get("content-length") or 0)
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4:end + 4 + length])
        del self.buf[:end + 4 + length]
        self.busy = True
        self.task = asyncio.get_running_loop().create_task(
            self._serve(method, target.split("?", 1)[0], headers, body, pairs))

    async def _serve(self, method: str, path: str, headers: dict[str, str], body: bytes,
                     pairs: list[tuple[str, str]]) -> None:
        try:
            await self._answer(method, path, headers, body, pairs)
        except (ConnectionError, asyncio.CancelledError):
            return
        self.busy = False
        self.task = None
        self._next()

    def _write(self, data: bytes) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            raise ConnectionResetError("client gone")
        self.transport.write(data)

    def _reset(self) -> None:
        assert self.transport is not None
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()
        raise ConnectionResetError("reset on purpose")

    async def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes,
                      pairs: list[tuple[str, str]]) -> None:
        eng = self.engine
        if method == "GET" and path in ("/health", "/v1/models"):
            eng.health_checks += path == "/health"
            ok = eng.health_ok or path != "/health"
            self._write(response("200 OK" if ok else "503 Service Unavailable",
                                 [("Content-Type", "text/plain")], b"ok" if ok else b"down"))
            return
        if method == "GET" and path == "/metrics":
            self._write(response("200 OK", [("Content-Type", "text/plain")],
                                 b'vllm:num_requests_running{model_name="m"} 0.0\n'
                                 b'vllm:num_requests_waiting{model_name="m"} 0.0\n'))
            return
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            self._write(response("404 Not Found", [("Content-Type", "application/json")],
                                 b'{"detail": "Not Found"}'))
            return
        mode = eng.next_mode(headers.get("x-fault"))
        eng.received[mode] += 1
        eng.headers.append(pairs)
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = {}
        eng.bodies.append(parsed)
        await self._complete(mode, path.endswith("/chat/completions"), parsed)

    async def _complete(self, mode: str, chat: bool, req: dict[str, Any]) -> None:
        eng = self.engine
        n = int(req.get("max_tokens") or eng.tokens)
        stream = bool(req.get("stream"))
        if mode == "hang-head":
            await asyncio.Event().wait()
        if mode == "reset":
            self._reset()
        if mode == "bad-status":
            self._write(b"HTTP/1.1 2x0 WHAT\r\nContent-Length: 0\r\n\r\n")
            return
        if mode in ("429", "500-text", "503-text", "500-json", "503-json"):
            self._write(_error(mode))
            return
        if mode == "big-head":
            filler = "".join(f"X-Filler-{i}: {'f' * 90}\r\n" for i in range(1024))
            self._write(b"HTTP/1.1 200 OK\r\n" + filler.encode() + b"Content-Length: 2\r\n\r\n{}")
            return
        if mode in ("hang-body", "trickle", "garbage") or (mode == "short-body" and not stream):
            await self._broken(mode, chat, n, stream)
            return
        if mode == "sse-body":
            stream = True
        if not stream:
            if eng.itl_s:
                await asyncio.sleep(eng.itl_s * n)
            self._write(response("200 OK", [("Content-Type", "application/json")],
                                 eng.whole(chat, n)))
            return
        await self._stream(mode, chat, n, bool((req.get("stream_options") or {})
                                               .get("include_usage")))

    async def _broken(self, mode: str, chat: bool, n: int, stream: bool) -> None:
        """A 200 head, then an answer that is never right: silence, a trickle, a short body,
        garbage."""
        answer = b"".join(self.engine.events(chat, n, False)) if stream else \
            self.engine.whole(chat, n)
        if mode == "garbage":
            answer = GARBAGE
        kind = "text/event-stream" if stream else "application/json"
        length = len(answer) + (40 if mode == "short-body" else 0)
        self._write(f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\n"
                    f"Content-Length: {length}\r\n\r\n".encode())
        if mode == "hang-body":
            await asyncio.Event().wait()
        if mode == "trickle":
            for i in range(len(answer)):
                self._write(answer[i:i + 1])
                await asyncio.sleep(self.engine.trickle_s)
            await asyncio.Event().wait()
        self._write(answer)
        if mode == "short-body":
            assert self.transport is not None
            self.transport.close()
            raise ConnectionResetError("short on purpose")

    async def _stream(self, mode: str, chat: bool, n: int, usage: bool) -> None:
        eng = self.engine
        self._write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
        events = eng.events(chat, n, usage)
        for i, event in enumerate(events):
            if i == eng.hang_after and mode in ("hang-mid", "truncate", "reset-mid",
                                                "short-body"):
                if mode == "hang-mid":
                    await asyncio.Event().wait()
                if mode == "reset-mid":
                    self._reset()
                half = event[:len(event) // 2]
                self._write(b"%x\r\n%b\r\n" % (len(half), half))
                assert self.transport is not None
                self.transport.close()
                raise ConnectionResetError("truncated on purpose")
            self._write(b"%x\r\n%b\r\n" % (len(event), event))
            if eng.itl_s:
                await asyncio.sleep(eng.itl_s)
        self._write(b"0\r\n\r\n")


@contextlib.asynccontextmanager
async def fault_engine(engine: FaultEngine) -> AsyncIterator[FaultEngine]:
    """Serve `engine` on a free 127.0.0.1 port (unless engine.port is set); always stopped."""
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


def main() -> None:
    """Run a fault engine as its own process: --port P [--default MODE] [--itl-s S]."""
    import argparse

    import uvloop

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--default", default="ok", choices=FAULTS)
    parser.add_argument("--itl-s", type=float, default=0.0)
    args = parser.parse_args()

    async def run() -> None:
        async with fault_engine(FaultEngine(default=args.default, itl_s=args.itl_s,
                                            port=args.port)):
            await asyncio.Event().wait()

    uvloop.run(run())


if __name__ == "__main__":
    main()
