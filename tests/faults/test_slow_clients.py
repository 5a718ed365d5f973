"""Slow-client attacks against a `wattgate serve` process: slowloris heads, trickled bodies,
never-ending chunked bodies. Each attacker gets 408 `request_timeout` (or 413) as JSON and is
closed by the stated deadline, and a normal request succeeds while the attack runs."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.faults.helpers import (
    body,
    completion_head,
    ep,
    error_of,
    gateway_process,
    post,
    read_response,
    write_config,
)
from tests.support.procs import free_port, running

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 65536
SLACK_S = 8.0  # a busy 2-core machine: generous, never part of what is checked
ATTACKERS = 20


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One fault engine process and one gateway process for the whole module."""
    tmp = tmp_path_factory.mktemp("slow")
    port = free_port()
    engine_url = f"http://127.0.0.1:{port}"
    engine_cmd = [sys.executable, "-m", "tests.support.fault_engine", "--port", str(port)]
    config, gw_port = write_config(
        tmp, [ep(engine_url)], max_body_bytes=MAX_BODY_BYTES,
        listen={"header_timeout_s": HEADER_TIMEOUT_S, "body_timeout_s": BODY_TIMEOUT_S,
                "body_min_bytes_per_s": 65536})
    with running(engine_cmd, engine_url + "/health"), \
            gateway_process(config, gw_port, tmp / "gateway.log") as url:
        yield url


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def _trickle(writer: asyncio.StreamWriter, data: bytes, every_s: float) -> None:
    """Write `data` one byte at a time, forever (cycling), until the peer closes."""
    try:
        i = 0
        while True:
            writer.write(data[i % len(data):i % len(data) + 1])
            await writer.drain()
            i += 1
            await asyncio.sleep(every_s)
    except (ConnectionError, RuntimeError):
        return


async def _attack(port: int, prefix: bytes, trickled: bytes, every_s: float
                  ) -> tuple[float, int, dict[str, str], bytes, bool]:
    """Connect, send `prefix` at once, then trickle `trickled` byte by byte; returns (seconds
    from connect to the response, status, headers, body, closed after it)."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(prefix)
    task = asyncio.create_task(_trickle(writer, trickled, every_s)) if trickled else None
    try:
        status, headers, data, closed = await read_response(
            reader, HEADER_TIMEOUT_S + BODY_TIMEOUT_S + SLACK_S)
        took = time.monotonic() - started
    finally:
        if task is not None:
            task.cancel()
        writer.close()
    return took, status, headers, data, closed


async def _under_attack(gateway: str, attacks: list[asyncio.Task[tuple[float, int,
                                                                       dict[str, str], bytes,
                                                                       bool]]]
                        ) -> list[tuple[float, int, dict[str, str], bytes, bool]]:
    """While the attacks run, a normal request is served; then the attacks' outcomes."""
    await asyncio.sleep(0.5)
    async with aiohttp.ClientSession() as s:
        status, raw, _ = await post(s, gateway, body(), timeout_s=10)
    assert status == 200 and b"tok" in raw, raw
    assert not all(t.done() for t in attacks), "the attack ended before the normal request"
    return await asyncio.gather(*attacks)


def _check_timeouts(results: list[tuple[float, int, dict[str, str], bytes, bool]],
                    deadline_s: float, code: str = "request_timeout", status: int = 408) -> None:
    for took, got, headers, data, closed in results:
        assert got == status, (got, data)
        assert error_of(data)["code"] == code
        assert headers.get("content-type", "").startswith("application/json")
        assert closed, "the connection stayed open after the timeout answer"
        assert took <= deadline_s + SLACK_S, took
        assert took >= min(deadline_s, 1.0) - 0.2, took  # not cut before its deadline


HEADS = {
    # the lean front's own route: the head never completes (one more header line each time)
    "front": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", b"X-Pad: aaaaaaaa\r\n"),
    # a route aiohttp serves: the front hands the connection over while the head trickles
    "aiohttp": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n", b"X-Pad: aaaaaaaa\r\n"),
    # a head trickled from its very first byte
    "first-byte": (b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: a\r\n" * 99),
    # nothing at all after connecting
    "silent": (b"", b""),
}


@pytest.mark.parametrize("head", list(HEADS))
async def test_slowloris_heads_get_408_at_header_timeout_and_are_closed(gateway: str,
                                                                        head: str) -> None:
    """20 connections trickle a head one byte every 0.2 s (or send nothing): each gets JSON 408
    request_timeout about header_timeout_s after connecting, however many bytes it sent, and is
    closed; a normal request is served meanwhile."""
    prefix, trickled = HEADS[head]
    attacks = [asyncio.create_task(_attack(_port(gateway), prefix, trickled, 0.2))
               for _ in range(ATTACKERS)]
    _check_timeouts(await _under_attack(gateway, attacks), HEADER_TIMEOUT_S)


async def test_a_head_after_a_response_gets_the_same_header_timeout(gateway: str) -> None:
    """On a kept-alive connection, the next head is trickled after a served response: 408 about
    header_timeout_s after that response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(gateway))
    try:
        payload = b'{"model": "m", "prompt": "hi", "max_tokens": 2}'
        writer.write(completion_head(len(payload)) + payload)
        status, _, _, _ = await read_response(reader, 10 + SLACK_S, check_close=False)
        assert status == 200
        served = time.monotonic()
        task = asyncio.create_task(_trickle(writer, HEADS["front"][0] + b"X-Pad: a\r\n" * 99,
                                            0.2))
        status, _, data, closed = await read_response(reader, HEADER_TIMEOUT_S + 2 * SLACK_S)
        task.cancel()
        assert (status, error_of(data)["code"], closed) == (408, "request_timeout", True)
        assert time.monotonic() - served <= HEADER_TIMEOUT_S + SLACK_S
    finally:
        writer.close()


async def test_trickled_body_gets_408_at_body_deadline(gateway: str) -> None:
    """A whole head promising 1,000 bytes, then one byte every 0.2 s: JSON 408 request_timeout
    about body_timeout_s + 1000/body_min_bytes_per_s after the head, then closed."""
    payload = b'{"model": "m", "prompt": "' + b"p" * 960
    attacks = [asyncio.create_task(_attack(_port(gateway), completion_head(1000), payload, 0.2))
               for _ in range(ATTACKERS)]
    _check_timeouts(await _under_attack(gateway, attacks), BODY_TIMEOUT_S + 1000 / 65536)


async def test_never_ending_slow_chunked_body_is_cut_at_the_body_deadline(gateway: str) -> None:
    """A chunked body (served by aiohttp behind the front) that sends a 1-byte chunk every
    0.2 s forever: JSON 408 request_timeout about body_timeout_s after the head, closed."""
    chunks = b'1\r\n{\r\n' + b"1\r\np\r\n" * 50
    attacks = [asyncio.create_task(_attack(_port(gateway), completion_head(None, chunked=True),
                                           chunks, 0.04))
               for _ in range(ATTACKERS)]
    _check_timeouts(await _under_attack(gateway, attacks), BODY_TIMEOUT_S)


async def test_never_ending_fast_chunked_body_is_cut_at_max_body_bytes(gateway: str) -> None:
    """A chunked body sent as fast as the gateway reads it, without end: JSON 413
    request_too_large once max_body_bytes have come (the client stops at 16 MiB at most)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(gateway))
    chunk = b"2000\r\n" + b"p" * 0x2000 + b"\r\n"

    async def flood() -> None:
        try:
            writer.write(completion_head(None, chunked=True) + b'1\r\n{\r\n')
            for _ in range(16 * 1024 * 1024 // len(chunk)):
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, RuntimeError):
            return

    task = asyncio.create_task(flood())
    try:
        status, headers, data, _ = await read_response(reader, BODY_TIMEOUT_S + 2 * SLACK_S)
        assert (status, error_of(data)["code"]) == (413, "request_too_large"), data
        assert headers.get("content-type", "").startswith("application/json")
    finally:
        task.cancel()
        writer.close()
    async with aiohttp.ClientSession() as s:
        status, _, _ = await post(s, gateway, body())
    assert status == 200


def test_gateway_log_of_the_attacks_holds_no_prompt_text(gateway: str,
                                                               tmp_path_factory: pytest.TempPathFactory
                                                               ) -> None:
    """Whatever the attacks above sent (padding, partial prompts), the gateway's log holds none
    of it (this module's gateway logs to a file of its own)."""
    logs = list(Path(tmp_path_factory.getbasetemp()).glob("slow*/gateway.log"))
    assert logs
    text = logs[0].read_text(errors="replace")
    assert "X-Pad" not in text and "ppppppppppp" not in text
