"""The load client: sends a plan on an absolute schedule and records each request's timeline.

Timing rules (REFERENCE.md, "coordinated omission"):
- One monotonic clock (`time.monotonic`, system-wide on Linux, so worker processes share it).
- Absolute schedule: request i is due at t0 + intended_s; the dispatcher sleeps until that
  instant (re-checking, never early) rather than sleeping a gap, so lateness never accumulates.
- Per request: intended, sent, one timestamp per read with the token-bearing SSE events that read
  completed (work per read, not per event), end, usage tokens, status, gateway request id.

One shared `aiohttp.ClientSession` per process with a bounded connector; aiohttp sets TCP_NODELAY
on every connection it makes (BaseProtocol.connection_made), which keeps the last small write of
a keep-alive stream from waiting for a delayed ACK.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from loadgen import rawhttp
from loadgen.workload import PlannedRequest

REQUEST_ID_HEADER = "x-wattgate-request-id"
_RID_BYTES = REQUEST_ID_HEADER.encode()
SPIN_S = 0.0015  # below this, wait by yielding to the loop instead of arming a timer
PRECISION_HEADER = "x-wattgate-precision"

# Token-bearing events carry a non-empty "content" (chat) or "text" (completions) string. The
# patterns cannot occur inside a JSON string value, where quotes are escaped.
_PATTERNS: dict[str, tuple[bytes, ...]] = {
    "chat": (b'"content":"', b'"content": "'),
    "completions": (b'"text":"', b'"text": "'),
}
_EMPTY: dict[str, tuple[bytes, ...]] = {
    "chat": (b'"content":""', b'"content": ""'),
    "completions": (b'"text":""', b'"text": ""'),
}


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
    # "raw": loadgen.rawhttp (http:// only, ~5x less CPU per request); "aiohttp": the session.
    transport: str = "raw"


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One request's timeline; times are seconds from the run's t0 on the monotonic clock."""

    index: int
    tenant: str
    slo_class: str
    intended_s: float
    sent_s: float
    first_token_s: float | None
    end_s: float
    reads: tuple[tuple[float, int], ...]  # (time, token-bearing events completed by that read)
    prompt_tokens: int
    completion_tokens: int
    status: str  # "ok", "http_<code>", "connect_error", "timeout", "stream_error", "cancelled"
    http_status: int
    request_id: str
    usage_reported: bool = True
    error: str = ""
    client_request_id: str = ""  # the x-request-id this client sent, if any

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def lag_s(self) -> float:
        return self.sent_s - self.intended_s


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


def _usage(block: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from the SSE line holding a usage object."""
    idx = block.rfind(b'"usage":{')
    if idx < 0:
        idx = block.rfind(b'"usage": {')
    if idx < 0:
        return None
    start = block.rfind(b"data:", 0, idx)
    end = block.find(b"\n", idx)
    line = block[start + 5: end if end >= 0 else len(block)]
    try:
        usage = orjson.loads(line)["usage"]
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


@dataclass(slots=True)
class Progress:
    """Live counters the progress reporter reads (I/O shell state, not a result)."""

    planned: int = 0
    sent: int = 0
    done: int = 0
    ok: int = 0
    start_s: float = field(default_factory=time.monotonic)


class Client:
    """Sends requests of a plan on one shared session; see `run_plan`."""

    def __init__(self, session: aiohttp.ClientSession | None, target: Target, t0: float,
                 progress: Progress | None = None, max_concurrency: int | None = None,
                 pool: rawhttp.Pool | None = None, total_timeout_s: float = 600.0):
        self.session = session
        self.pool = pool
        self.total_timeout_s = total_timeout_s
        self.target = target
        self.t0 = t0
        self.url = target.url
        self.progress = progress or Progress()
        self._pat = _PATTERNS[target.api]
        self._empty = _EMPTY[target.api]
        self._headers: dict[tuple[str, str, tuple[tuple[str, str], ...]], dict[str, str]] = {}
        self._sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    def headers_for(self, req: PlannedRequest) -> dict[str, str]:
        key = (req.api_key, req.tenant, req.headers)
        h = self._headers.get(key)
        if h is None:
            h = self._headers[key] = _headers(req, self.target)
        return h

    async def send(self, req: PlannedRequest, body: bytes, intended_s: float) -> RequestResult:
        """Send one request; `body` is the JSON body (aiohttp) or the whole wire request (raw)."""
        send = self._send if self.pool is None else self._send_raw
        if self._sem is None:
            return await send(req, body, intended_s)
        # A request waiting here for a slot is late: "sent" is taken after the wait, so only
        # latency from intended arrival (and the schedule lag) shows the wait.
        async with self._sem:
            return await send(req, body, intended_s)

    def wire(self, req: PlannedRequest, body: bytes) -> bytes:
        assert self.pool is not None
        path = "/v1/chat/completions" if self.target.api == "chat" else "/v1/completions"
        return rawhttp.request_bytes(self.pool, path, self.request_headers(req), body)

    def request_headers(self, req: PlannedRequest) -> dict[str, str]:
        h = self.headers_for(req)
        if self.target.request_id_prefix:
            h = {**h, "x-request-id": f"{self.target.request_id_prefix}{req.index}"}
        return h

    async def _send_raw(self, req: PlannedRequest, wire: bytes, intended_s: float
                        ) -> RequestResult:
        assert self.pool is not None
        t0 = self.t0
        mono = time.monotonic
        pat0, pat1 = self._pat
        emp0, emp1 = self._empty
        reads: list[tuple[float, int]] = []
        state: dict[str, Any] = {"carry": b"", "usage": None, "err": b"", "stream_error": False,
                                 "conn": None}

        def sink(chunk: bytes) -> None:
            now = mono() - t0
            if state["conn"].status != 200:  # an error body: keep its start for the report
                state["err"] = (state["err"] + chunk)[:300]
                return
            carry = state["carry"]
            buf = carry + chunk if carry else chunk
            cut = buf.rfind(b"\n")
            if cut < 0:
                state["carry"] = buf
                return
            done, state["carry"] = buf[: cut + 1], buf[cut + 1:]
            n = done.count(pat0) + done.count(pat1) - done.count(emp0) - done.count(emp1)
            if n > 0:
                reads.append((now, n))
            if b'"usage"' in done:
                state["usage"] = _usage(done) or state["usage"]
            if b'"error":' in done:
                state["stream_error"] = True
                state["err"] = done[-300:]

        status, http_status, rid, error = "ok", 0, "", ""
        self.progress.sent += 1
        sent = mono() - t0
        pool = self.pool
        try:
            conn = await pool.acquire()
        except (OSError, TimeoutError) as exc:
            return self._result(req, intended_s, sent, reads, None, "connect_error", 0, "",
                                repr(exc))
        reusable = False
        state["conn"] = conn
        loop = asyncio.get_running_loop()
        fut = conn.request(wire, sink, _RID_BYTES)
        timer = loop.call_at(loop.time() + self.total_timeout_s, _expire, fut)
        try:
            await fut
            reusable = True
            http_status, rid = conn.status, conn.request_id
            if http_status != 200:
                status = f"http_{http_status}"
                error = state["err"].decode("utf-8", "replace")
            elif state["stream_error"]:
                status, error = "stream_error", state["err"].decode("utf-8", "replace")
        except TimeoutError as exc:
            status, error = "timeout", repr(exc)
        except rawhttp.HttpError as exc:
            status, error = "connect_error", repr(exc)
        finally:
            timer.cancel()
            pool.release(conn, reusable)
        if http_status == 200 and not reads:
            # Non-streamed or tokenless bodies end in the carry (no trailing newline).
            tail = state["carry"]
            if b'"usage"' in tail:
                state["usage"] = _usage(tail + b"\n") or state["usage"]
        return self._result(req, intended_s, sent, reads, state["usage"], status, http_status,
                            rid, error)

    def _result(self, req: PlannedRequest, intended_s: float, sent: float,
                reads: list[tuple[float, int]], usage: tuple[int, int] | None, status: str,
                http_status: int, rid: str, error: str) -> RequestResult:
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
                                            if self.target.request_id_prefix else ""))

    async def _send(self, req: PlannedRequest, body: bytes, intended_s: float) -> RequestResult:
        assert self.session is not None
        t0 = self.t0
        mono = time.monotonic
        pat0, pat1 = self._pat
        emp0, emp1 = self._empty
        reads: list[tuple[float, int]] = []
        usage: tuple[int, int] | None = None
        status, http_status, rid, error = "ok", 0, "", ""
        self.progress.sent += 1
        sent = mono() - t0
        try:
            async with self.session.post(self.url, data=body,
                                         headers=self.request_headers(req)) as resp:
                http_status = resp.status
                rid = resp.headers.get(REQUEST_ID_HEADER, "")
                if http_status != 200:
                    status = f"http_{http_status}"
                    error = (await resp.read())[:300].decode("utf-8", "replace")
                else:
                    content = resp.content
                    carry = b""
                    while True:
                        chunk = await content.readany()
                        if not chunk:
                            break
                        now = mono() - t0
                        buf = carry + chunk if carry else chunk
                        cut = buf.rfind(b"\n")
                        if cut < 0:
                            carry = buf
                            continue
                        done, carry = buf[: cut + 1], buf[cut + 1:]
                        n = (done.count(pat0) + done.count(pat1)
                             - done.count(emp0) - done.count(emp1))
                        if n > 0:
                            reads.append((now, n))
                        if b'"usage"' in done:
                            usage = _usage(done) or usage
                        if b'"error":' in done:
                            status = "stream_error"
                            error = done[-300:].decode("utf-8", "replace")
        except TimeoutError as exc:
            status, error = "timeout", repr(exc)
        except aiohttp.ClientConnectionError as exc:
            status, error = "connect_error", repr(exc)
        except aiohttp.ClientError as exc:
            status, error = "client_error", repr(exc)
        return self._result(req, intended_s, sent, reads, usage, status, http_status, rid, error)


def make_session(opts: ClientOptions) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=opts.max_connections, limit_per_host=0,
                                     ttl_dns_cache=300, enable_cleanup_closed=False)
    timeout = aiohttp.ClientTimeout(total=opts.request_timeout_s,
                                    sock_connect=opts.connect_timeout_s,
                                    sock_read=opts.read_timeout_s)
    # Auto-decompression and cookie handling add work per response and are never needed here.
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                 cookie_jar=aiohttp.DummyCookieJar())


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError("request exceeded its total timeout"))


async def _sleep_until(deadline: float) -> None:
    """Sleep until the monotonic instant `deadline`; never returns early.

    The loop's timers have millisecond granularity, so the last `SPIN_S` is spent yielding to
    the loop (other requests keep being served) rather than in a timer that may wake ~1 ms late.
    """
    while True:
        delay = deadline - time.monotonic()
        if delay <= 0:
            return
        await asyncio.sleep(delay - SPIN_S if delay > SPIN_S else 0)


def _cancelled(req: PlannedRequest, intended_s: float, now_s: float) -> RequestResult:
    return RequestResult(req.index, req.tenant, req.slo_class, intended_s, now_s, None, now_s, (),
                         req.prompt_tokens, 0, "cancelled", 0, "", False, "run deadline passed")


@contextlib.contextmanager
def young_gc_only() -> Iterator[None]:
    """Only young-generation collections while the schedule runs.

    A full collection walks every tracked object (the plan, the bodies, the results so far)
    and stops the loop for tens of milliseconds, which shows up as schedule lag. The heap at the
    start is frozen out of collection (O(1); no collection now, which could itself take longer
    than the caller's lead time before t0) and full collections wait for the end of the run,
    which is bounded in count and time; young collections (sub-millisecond) keep running.
    """
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(threshold[0], threshold[1], 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


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
    pool = (rawhttp.Pool(target.base_url, opts.max_connections, opts.connect_timeout_s)
            if raw else None)
    own = session is None and not raw
    sess = session or (None if raw else make_session(opts))
    client = Client(sess, target, t0, progress, opts.max_concurrency, pool,
                    opts.request_timeout_s)
    client.progress.planned = len(plan)
    # Bodies (whole wire requests on the raw transport) are built before the clock starts.
    bodies = [encode_body(r, target) for r in plan]
    if pool is not None:
        bodies = [client.wire(r, b) for r, b in zip(plan, bodies, strict=True)]
    try:
        with young_gc_only():
            if concurrency is None:
                return await _open_loop(client, plan, bodies, opts)
            return await _closed_loop(client, plan, bodies, concurrency, opts)
    finally:
        if pool is not None:
            pool.close()
        if own and sess is not None:
            await sess.close()


async def _open_loop(client: Client, plan: Sequence[PlannedRequest], bodies: list[bytes],
                     opts: ClientOptions) -> list[RequestResult]:
    loop = asyncio.get_running_loop()
    t0 = client.t0
    tasks: list[asyncio.Task[RequestResult]] = []
    # Completion is counted as it happens (one C-level callback per task), so the end of the
    # schedule costs nothing: waiting on all tasks at once would first walk every one of them
    # (milliseconds for thousands), delaying the last sends and the reads still arriving.
    outstanding = 0
    dispatched = False
    finished = asyncio.Event()

    def on_done(_: object) -> None:
        nonlocal outstanding
        outstanding -= 1
        if dispatched and outstanding == 0:
            finished.set()

    for req, body in zip(plan, bodies, strict=True):
        due = t0 + req.intended_s
        if time.monotonic() < due:
            await _sleep_until(due)
        task = loop.create_task(client.send(req, body, req.intended_s))
        task.add_done_callback(on_done)
        outstanding += 1
        tasks.append(task)
    dispatched = True
    if outstanding == 0:
        finished.set()
    last_due = t0 + (plan[-1].intended_s if plan else 0.0)
    return await _collect(plan, tasks, finished, last_due + opts.grace_s, t0)


async def _closed_loop(client: Client, plan: Sequence[PlannedRequest], bodies: list[bytes],
                       concurrency: int, opts: ClientOptions) -> list[RequestResult]:
    results: dict[int, RequestResult] = {}
    it = iter(zip(plan, bodies, strict=True))
    t0 = client.t0

    async def slot() -> None:
        for req, body in it:
            # Closed loop: a request is intended the moment its slot frees up.
            results[req.index] = await client.send(req, body, time.monotonic() - t0)

    # Bounded in count by the plan and in time by each request's own total timeout.
    await asyncio.gather(*(slot() for _ in range(concurrency)))
    now = time.monotonic() - t0
    return [results.get(r.index) or _cancelled(r, now, now) for r in plan]


async def _collect(plan: Sequence[PlannedRequest], tasks: list[asyncio.Task[RequestResult]],
                   finished: asyncio.Event, deadline: float, t0: float) -> list[RequestResult]:
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            await finished.wait()
    except TimeoutError:
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
    now = time.monotonic() - t0
    out = []
    for req, task in zip(plan, tasks, strict=True):
        if task.cancelled():
            out.append(_cancelled(req, req.intended_s, now))
        else:
            out.append(task.result())
    return out


async def progress_reporter(progress: Progress, write: Callable[[str], None],
                            interval_s: float = 0.5) -> None:
    """Write one status line every `interval_s` until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        p = progress
        elapsed = time.monotonic() - p.start_s
        width = 30
        frac = p.done / p.planned if p.planned else 0.0
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        write(f"\r[{bar}] {p.done}/{p.planned} done, {p.sent - p.done} in flight, "
              f"{p.done - p.ok} errors, {elapsed:5.1f}s")
