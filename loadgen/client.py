"""The load client: sends a plan on an absolute schedule and records each request's timeline.

Timing rules (no coordinated omission: docs/loadgen.md, "Timing"):
- One monotonic clock (`time.monotonic`, system-wide on Linux, so worker processes share it).
- Absolute schedule (loadgen/schedule.py): request i is due at t0 + intended_s, never early.
- Per request: intended, sent, one timestamp per read with the token-bearing SSE events that read
  completed (loadgen/tally.py), end, usage tokens, status, gateway request id.

Two transports. "raw" (http://): wire's pooled keep-alive client; each request is encoded
before the clock starts and written in one write, and each read is handed to the request's
tally from the connection's own callback, with no task switch per read. "aiohttp": one shared
`aiohttp.ClientSession` per process with a bounded connector. Both set TCP_NODELAY on every
connection, which keeps the last small write of a keep-alive stream from waiting for a delayed
ACK.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from loadgen.results import Progress, RequestResult, answer_status
from loadgen.schedule import closed_loop, open_loop, young_gc_only
from loadgen.tally import ERROR_CHARS, StreamTally
from loadgen.workload import PlannedRequest
from wire.client import ClientSettings, UpstreamClient
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
    def url(self) -> str:
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path


@dataclass(frozen=True, slots=True)
class ClientOptions:
    max_connections: int = 4096
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0  # longest silence between two reads of one stream
    request_timeout_s: float = 600.0
    grace_s: float = 30.0  # after the last request is due, how long outstanding ones may take
    max_concurrency: int | None = None  # cap on requests in flight (as vLLM's --max-concurrency)
    # "raw": wire's pooled client (http:// only, ~5x less CPU per request); "aiohttp": the
    # session.
    transport: str = "raw"


def encode_body(req: PlannedRequest, target: Target) -> bytes:
    body: dict[str, Any] = {"model": target.model, "max_tokens": req.max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if target.api == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    if target.ignore_eos:
        body["ignore_eos"] = True
    return orjson.dumps(body)


def _headers(req: PlannedRequest, target: Target) -> dict[str, str]:
    h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if req.api_key:
        h["Authorization"] = f"Bearer {req.api_key}"
    if target.precision_header:
        h[PRECISION_HEADER] = target.precision_header
    h.update(target.extra_headers)
    h.update(req.headers)
    return h


class Client:
    """Sends requests of a plan on one shared transport: `http` (wire, "raw") when given, else
    `session` (aiohttp); see `run_plan`."""

    def __init__(self, session: aiohttp.ClientSession | None, target: Target, t0: float,
                 progress: Progress | None = None, max_concurrency: int | None = None,
                 http: UpstreamClient | None = None, total_timeout_s: float = 600.0):
        self.session = session
        self.http = http
        self.total_timeout_s = total_timeout_s
        self.target = target
        self.t0 = t0
        self.url = target.url
        self.progress = progress or Progress()
        self._headers: dict[tuple[str, str, tuple[tuple[str, str], ...]], dict[str, str]] = {}
        self._sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    def headers_for(self, req: PlannedRequest) -> dict[str, str]:
        key = (req.api_key, req.tenant, req.headers)
        h = self._headers.get(key)
        if h is None:
            h = self._headers[key] = _headers(req, self.target)
        return h

    async def send(self, req: PlannedRequest, body: bytes, intended_s: float) -> RequestResult:
        """Send one request; `body` is the JSON body (aiohttp) or the whole encoded request
        (raw)."""
        send = self._send if self.http is None else self._send_raw
        if self._sem is None:
            return await send(req, body, intended_s)
        # A request waiting here for a slot is late: "sent" is taken after the wait, so only
        # latency from intended arrival (and the schedule lag) shows the wait.
        async with self._sem:
            return await send(req, body, intended_s)

    def encoded(self, req: PlannedRequest, body: bytes) -> bytes:
        """The whole request for the raw transport, built before the clock starts."""
        assert self.http is not None
        target = self.target
        return self.http.encode_post(target.base_url, _PATHS[target.api],
                                     body, list(self.request_headers(req).items()))

    def request_headers(self, req: PlannedRequest) -> dict[str, str]:
        h = self.headers_for(req)
        if self.target.request_id_prefix:
            h = {**h, "x-request-id": f"{self.target.request_id_prefix}{req.index}"}
        return h

    async def _send_raw(self, req: PlannedRequest, request: bytes, intended_s: float
                        ) -> RequestResult:
        assert self.http is not None
        tally = StreamTally(self.target.api, self.t0)
        status, http_status, rid, error, code = "ok", 0, "", "", ""
        self.progress.sent += 1
        sent = time.monotonic() - self.t0
        try:
            async with asyncio.timeout(self.total_timeout_s):
                response = await self.http.send(self.target.base_url, request)
                try:
                    http_status = response.status
                    rid = (response.head.header(_RID_BYTES) or b"").decode("latin-1")
                    if http_status != 200:  # an error body: keep its start for the report
                        status = f"http_{http_status}"
                        body = await response.read_all()
                        error = body[:ERROR_CHARS].decode("utf-8", "replace")
                        by_gateway = bool(rid) and not response.head.header(_ENDPOINT_BYTES)
                        code = answer_status(http_status, body, by_gateway)
                    else:
                        response.stream_to(tally.feed)
                        await response.finished()
                finally:
                    response.close()  # back to the pool if the whole response was read
        except TimeoutError as exc:
            status, error = "timeout", repr(exc)
        except UpstreamFailure as exc:
            status, error = "connect_error", repr(exc)
        return self._tallied(req, intended_s, sent, tally, status, http_status, rid, error,
                             code)

    def _tallied(self, req: PlannedRequest, intended_s: float, sent: float, tally: StreamTally,
                 status: str, http_status: int, rid: str, error: str, code: str
                 ) -> RequestResult:
        if http_status == 200:
            tally.finish()
            if status == "ok" and tally.error:
                status, error = "stream_error", tally.error.decode("utf-8", "replace")
        return self._result(req, intended_s, sent, tally.reads, tally.usage, status,
                            http_status, rid, error, code)

    def _result(self, req: PlannedRequest, intended_s: float, sent: float,
                reads: list[tuple[float, int]], usage: tuple[int, int] | None, status: str,
                http_status: int, rid: str, error: str, code: str) -> RequestResult:
        end = time.monotonic() - self.t0
        if status == "ok" and not reads and usage is None:
            status, error = "stream_error", "stream ended without tokens or usage"
        prog = self.progress
        prog.done += 1
        if status == "ok":
            prog.ok += 1
        return RequestResult(
            index=req.index, tenant=req.tenant, slo_class=req.slo_class, intended_s=intended_s,
            sent_s=sent, first_token_s=reads[0][0] if reads else None, end_s=end,
            reads=tuple(reads), prompt_tokens=usage[0] if usage else req.prompt_tokens,
            completion_tokens=usage[1] if usage else sum(n for _, n in reads), status=status,
            http_status=http_status, request_id=rid, usage_reported=usage is not None,
            error=error, client_request_id=(f"{self.target.request_id_prefix}{req.index}"
                                            if self.target.request_id_prefix else ""),
            code=code)

    async def _send(self, req: PlannedRequest, body: bytes, intended_s: float) -> RequestResult:
        assert self.session is not None
        tally = StreamTally(self.target.api, self.t0)
        status, http_status, rid, error, code = "ok", 0, "", "", ""
        self.progress.sent += 1
        sent = time.monotonic() - self.t0
        try:
            async with self.session.post(self.url, data=body,
                                         headers=self.request_headers(req)) as resp:
                http_status = resp.status
                rid = resp.headers.get(REQUEST_ID_HEADER, "")
                if http_status != 200:
                    status = f"http_{http_status}"
                    body = await resp.read()
                    error = body[:ERROR_CHARS].decode("utf-8", "replace")
                    by_gateway = bool(rid) and ENDPOINT_HEADER not in resp.headers
                    code = answer_status(http_status, body, by_gateway)
                else:
                    content = resp.content
                    while chunk := await content.readany():
                        tally.feed(chunk)
        except TimeoutError as exc:
            status, error = "timeout", repr(exc)
        except aiohttp.ClientConnectionError as exc:
            status, error = "connect_error", repr(exc)
        except aiohttp.ClientError as exc:
            status, error = "client_error", repr(exc)
        return self._tallied(req, intended_s, sent, tally, status, http_status, rid, error,
                             code)


def make_session(opts: ClientOptions) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=opts.max_connections, limit_per_host=0,
                                     ttl_dns_cache=300, enable_cleanup_closed=False)
    timeout = aiohttp.ClientTimeout(total=opts.request_timeout_s,
                                    sock_connect=opts.connect_timeout_s,
                                    sock_read=opts.read_timeout_s)
    # Auto-decompression and cookie handling add work per response and are never needed here.
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                 cookie_jar=aiohttp.DummyCookieJar())


async def run_plan(plan: Sequence[PlannedRequest], target: Target, *, t0: float,
                   concurrency: int | None = None, opts: ClientOptions = ClientOptions(),
                   progress: Progress | None = None,
                   session: aiohttp.ClientSession | None = None) -> list[RequestResult]:
    """Run `plan` (open loop on its schedule, or closed loop with `concurrency` in flight) and
    return one result per planned request, in plan order.

    `t0` is the monotonic instant of offset 0. The run is bounded: requests still outstanding
    `opts.grace_s` after the last one was due are cancelled and recorded as "cancelled".
    """
    raw = opts.transport == "raw" and target.base_url.startswith("http://") and session is None
    http = UpstreamClient(ClientSettings(
        connect_s=opts.connect_timeout_s, first_byte_s=opts.request_timeout_s,
        read_s=opts.read_timeout_s, max_connections=opts.max_connections)) if raw else None
    own = session is None and not raw
    sess = session or (None if raw else make_session(opts))
    client = Client(sess, target, t0, progress, opts.max_concurrency, http,
                    opts.request_timeout_s)
    client.progress.planned = len(plan)
    # Bodies (whole encoded requests on the raw transport) are built before the clock starts.
    bodies = [encode_body(r, target) for r in plan]
    if http is not None:
        bodies = [client.encoded(r, b) for r, b in zip(plan, bodies, strict=True)]
    try:
        with young_gc_only():
            if concurrency is None:
                return await open_loop(client.send, t0, plan, bodies, opts.grace_s)
            return await closed_loop(client.send, t0, plan, bodies, concurrency)
    finally:
        if http is not None:
            http.close()
        if own and sess is not None:
            await sess.close()
