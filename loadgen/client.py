"""The load client: sends a plan on an absolute schedule and records each request's timeline.

Timing rules (no coordinated omission: docs/loadgen.md, "Timing"):
- One monotonic clock (`time.monotonic`, system-wide on Linux, so worker processes share it).
- Absolute schedule (loadgen/schedule.py): request i is due at t0 + intended_s, never early.
- Per request: intended, sent, one timestamp per read with the token-bearing SSE events that read
  completed (loadgen/tally.py), end, usage tokens, status, gateway request id.

One transport: wire's pooled keep-alive HTTP/1.1 client (http:// and https://), the one the
gateway uses towards engines. Each request is encoded before the clock starts and written in
one write; each read of a 200 answer is handed to the request's tally from the connection's own
callback, with no task switch per read. TCP_NODELAY on every connection keeps the last small
write of a keep-alive stream from waiting for a delayed ACK.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from loadgen.results import Progress, RequestResult, answer_status
from loadgen.schedule import closed_loop, open_loop, young_gc_only
from loadgen.tally import ERROR_CHARS, StreamTally
from loadgen.workload import PlannedRequest
from wire.client import ClientSettings, UpstreamClient, UpstreamResponse
from wire.errors import UpstreamFailure

REQUEST_ID_HEADER = "x-wattgate-request-id"
_RID_BYTES = REQUEST_ID_HEADER.encode()
ENDPOINT_HEADER = "x-wattgate-endpoint"  # on the answers an engine gave, relayed by the gateway
_ENDPOINT_BYTES = ENDPOINT_HEADER.encode()
PRECISION_HEADER = "x-wattgate-precision"
_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how to send: an OpenAI-compatible base URL (gateway or engine)."""

    base_url: str
    model: str  # sent as the body's "model" (e.g. "llama-3.1-8b@fp8" through the gateway)
    api: str = "chat"
    precision_header: str = ""  # sent as x-wattgate-precision when set
    ignore_eos: bool = True  # vLLM extension: produce exactly max_tokens tokens
    extra_headers: tuple[tuple[str, str], ...] = ()
    # When set, request i carries `x-request-id: <prefix><i>` (engines key their records by it).
    request_id_prefix: str = ""

    @property
    def path(self) -> str:
        return _PATHS[self.api]


@dataclass(frozen=True, slots=True)
class ClientOptions:
    max_connections: int = 4096
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0  # longest silence between two reads of one stream
    request_timeout_s: float = 600.0
    grace_s: float = 30.0  # after the last request is due, how long outstanding ones may take
    max_concurrency: int | None = None  # cap on requests in flight (as vLLM's --max-concurrency)


def json_body(req: PlannedRequest, target: Target) -> bytes:
    """The request's JSON body: a streamed completion with usage in the last event."""
    body: dict[str, Any] = {"model": target.model, "max_tokens": req.max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if target.api == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    if target.ignore_eos:
        body["ignore_eos"] = True
    return orjson.dumps(body)


def _headers(req: PlannedRequest, target: Target) -> list[tuple[str, str]]:
    h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if req.api_key:
        h["Authorization"] = f"Bearer {req.api_key}"
    if target.precision_header:
        h[PRECISION_HEADER] = target.precision_header
    h.update(target.extra_headers)
    h.update(req.headers)
    if target.request_id_prefix:
        h["x-request-id"] = f"{target.request_id_prefix}{req.index}"
    return list(h.items())


class Client:
    """Sends the requests of a plan over one pooled wire client; see `run_plan`."""

    def __init__(self, http: UpstreamClient, target: Target, t0: float,
                 progress: Progress | None = None, max_concurrency: int | None = None,
                 total_timeout_s: float = 600.0):
        self.http = http
        self.total_timeout_s = total_timeout_s
        self.target = target
        self.t0 = t0
        self.progress = progress or Progress()
        self._sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    def encode(self, req: PlannedRequest) -> bytes:
        """The whole request, head and body, built before the clock starts."""
        target = self.target
        return self.http.encode_post(target.base_url, target.path, json_body(req, target),
                                     _headers(req, target))

    async def send(self, req: PlannedRequest, request: bytes, intended_s: float
                   ) -> RequestResult:
        """Send one request encoded by `encode` and record its timeline."""
        if self._sem is None:
            return await self._send(req, request, intended_s)
        # A request waiting here for a slot is late: "sent" is taken after the wait, so only
        # latency from intended arrival (and the schedule lag) shows the wait.
        async with self._sem:
            return await self._send(req, request, intended_s)

    async def _send(self, req: PlannedRequest, request: bytes, intended_s: float
                    ) -> RequestResult:
        tally = StreamTally(self.target.api, self.t0)
        answer = _Answer()
        self.progress.sent += 1
        sent = time.monotonic() - self.t0
        try:
            async with asyncio.timeout(self.total_timeout_s):
                response = await self.http.send(self.target.base_url, request)
                try:
                    await answer.read(response, tally)
                finally:
                    response.close()  # back to the pool if the whole response was read
        except TimeoutError as exc:
            answer.status, answer.error = "timeout", repr(exc)
        except UpstreamFailure as exc:
            # before the head: no answer at all; after it: the answer was cut off
            answer.status = "stream_error" if answer.http_status else "connect_error"
            answer.error = repr(exc)
        if answer.http_status == 200:
            tally.finish()
            if answer.status == "ok" and tally.error:
                answer.status = "stream_error"
                answer.error = tally.error.decode("utf-8", "replace")
        return self._result(req, intended_s, sent, tally, answer)

    def _result(self, req: PlannedRequest, intended_s: float, sent: float, tally: StreamTally,
                answer: _Answer) -> RequestResult:
        end = time.monotonic() - self.t0
        reads, usage, status, error = tally.reads, tally.usage, answer.status, answer.error
        if status == "ok" and not reads and usage is None:
            status, error = "stream_error", "stream ended without tokens or usage"
        prog = self.progress
        prog.done += 1
        if status == "ok":
            prog.ok += 1
        prefix = self.target.request_id_prefix
        return RequestResult(
            index=req.index, tenant=req.tenant, slo_class=req.slo_class, intended_s=intended_s,
            sent_s=sent, first_token_s=reads[0][0] if reads else None, end_s=end,
            reads=tuple(reads), prompt_tokens=usage[0] if usage else req.prompt_tokens,
            completion_tokens=usage[1] if usage else sum(n for _, n in reads), status=status,
            http_status=answer.http_status, request_id=answer.request_id,
            usage_reported=usage is not None, error=error,
            client_request_id=f"{prefix}{req.index}" if prefix else "", code=answer.code)


class _Answer:
    """What one response said, filled in as it is read (the request's status stays "ok"
    unless something went wrong)."""

    __slots__ = ("code", "error", "http_status", "request_id", "status")

    def __init__(self) -> None:
        self.status = "ok"
        self.http_status = 0
        self.request_id = ""
        self.error = ""
        self.code = ""  # an error answer's status as the gateway recorded it

    async def read(self, response: UpstreamResponse, tally: StreamTally) -> None:
        """A 200 answer's body goes to `tally` read by read; an error answer's start is kept
        for the report."""
        head = response.head
        self.http_status = status = response.status
        self.request_id = rid = (head.header(_RID_BYTES) or b"").decode("latin-1")
        if status == 200:
            response.stream_to(tally.feed)
            await response.finished()
            return
        self.status = f"http_{status}"
        body = await response.read_all()
        self.error = body[:ERROR_CHARS].decode("utf-8", "replace")
        by_gateway = bool(rid) and not head.header(_ENDPOINT_BYTES)
        self.code = answer_status(status, body, by_gateway)


async def run_plan(plan: Sequence[PlannedRequest], target: Target, *, t0: float,
                   concurrency: int | None = None, opts: ClientOptions = ClientOptions(),
                   progress: Progress | None = None) -> list[RequestResult]:
    """Run `plan` (open loop on its schedule, or closed loop with `concurrency` in flight) and
    return one result per planned request, in plan order.

    `t0` is the monotonic instant of offset 0. The run is bounded: requests still outstanding
    `opts.grace_s` after the last one was due are cancelled and recorded as "cancelled".
    """
    http = UpstreamClient(ClientSettings(
        connect_s=opts.connect_timeout_s, first_byte_s=opts.request_timeout_s,
        read_s=opts.read_timeout_s, max_connections=opts.max_connections))
    client = Client(http, target, t0, progress, opts.max_concurrency, opts.request_timeout_s)
    client.progress.planned = len(plan)
    requests = [client.encode(r) for r in plan]  # before the clock starts
    try:
        with young_gc_only():
            if concurrency is None:
                return await open_loop(client.send, t0, plan, requests, opts.grace_s)
            return await closed_loop(client.send, t0, plan, requests, concurrency)
    finally:
        http.close()
