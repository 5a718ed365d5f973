"""The load client's one transport against engines that misbehave (tests/support/fault_engine.py,
a real HTTP server), answer without a stream, or speak TLS: each way an answer goes wrong ends
in its own status with the reads before it kept, a whole JSON answer's usage is read, and
https goes through the same client as http."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from loadgen.client import ClientOptions, Target, run_plan
from loadgen.results import RequestResult
from loadgen.workload import PlannedRequest
from tests.support.fault_engine import FaultEngine, fault_engine

pytestmark = pytest.mark.timeout(30)

USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def one_request(max_tokens: int = 6) -> list[PlannedRequest]:
    return [PlannedRequest(index=0, intended_s=0.0, tenant="t", api_key="", slo_class="s",
                           prompt="hello there", prompt_tokens=2, max_tokens=max_tokens)]


async def run_one(url: str, opts: ClientOptions | None = None) -> RequestResult:
    [result] = await run_plan(one_request(), Target(url, "m", api="completions"),
                              t0=time.monotonic(), opts=opts or ClientOptions())
    return result


def tokens_read(r: RequestResult) -> int:
    return sum(n for _, n in r.reads)


async def test_a_stream_cut_off_mid_answer_is_a_stream_error_with_the_tokens_before_it() -> None:
    async with fault_engine(FaultEngine(default="truncate", hang_after=2)) as eng:
        r = await run_one(eng.url)
    assert (r.status, r.http_status, r.outcome) == ("stream_error", 200, "failed")
    assert tokens_read(r) == 2 and not r.usage_reported
    assert "closed the connection mid-response" in r.error


async def test_a_connection_reset_before_any_answer_is_a_connect_error() -> None:
    async with fault_engine(FaultEngine(default="reset")) as eng:
        r = await run_one(eng.url)
    assert (r.status, r.http_status, r.outcome) == ("connect_error", 0, "failed")
    assert r.reads == ()


async def test_a_stream_gone_silent_times_out_after_the_read_timeout() -> None:
    async with fault_engine(FaultEngine(default="hang-mid", hang_after=2)) as eng:
        t = time.monotonic()
        r = await run_one(eng.url, ClientOptions(read_timeout_s=0.3))
        waited_s = time.monotonic() - t
    assert (r.status, r.http_status) == ("timeout", 200)
    assert tokens_read(r) == 2
    assert waited_s >= 0.3


async def test_an_engine_that_never_answers_times_out_without_a_status() -> None:
    async with fault_engine(FaultEngine(default="hang-head")) as eng:
        r = await run_one(eng.url, ClientOptions(request_timeout_s=0.3))
    assert (r.status, r.http_status, r.first_token_s) == ("timeout", 0, None)


async def test_an_engine_error_keeps_the_start_of_its_body_and_its_status() -> None:
    async with fault_engine(FaultEngine(default="500-text")) as eng:
        r = await run_one(eng.url)
    assert (r.status, r.http_status, r.code) == ("http_500", 500, "upstream_http_500")
    assert "CUDA out of memory" in r.error


async def whole_answer(request: web.Request) -> web.Response:
    """An engine that ignores `stream` and answers in one JSON body."""
    return web.json_response({"object": "text_completion", "usage": USAGE,
                              "choices": [{"index": 0, "text": "a b c"}]})


async def streamed_answer(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(3):
        await resp.write(b'data: {"choices":[{"index":0,"text":"tok "}]}\n\n')
    await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": USAGE}) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


@asynccontextmanager
async def serving(handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                  ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def test_a_whole_json_answer_counts_as_served_with_its_usage() -> None:
    async with serving(whole_answer) as port:
        r = await run_one(f"http://127.0.0.1:{port}")
    assert (r.status, r.usage_reported) == ("ok", True)
    assert (r.prompt_tokens, r.completion_tokens, r.reads) == (5, 3, ())


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a test certificate")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True,
                   timeout=20)
    return cert, key


async def test_https_streams_are_timed_through_the_same_client(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = self_signed(tmp_path)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client's default context trusts it
    async with serving(streamed_answer, server) as port:
        r = await run_one(f"https://127.0.0.1:{port}")
    assert (r.status, r.http_status, r.usage_reported) == ("ok", 200, True)
    assert tokens_read(r) == 3 and r.first_token_s is not None


async def test_https_refuses_a_certificate_it_does_not_trust(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    async with serving(streamed_answer, server) as port:
        r = await run_one(f"https://127.0.0.1:{port}")
    assert (r.status, r.http_status) == ("connect_error", 0)
    assert "SSLCertVerificationError" in r.error
