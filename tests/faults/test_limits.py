"""Connection and request limits through the real gateway (lean front + aiohttp):
listen.keepalive_s on both paths, listen.max_connections, listen.max_inflight."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.faults.helpers import (
    body,
    completion_head,
    ep,
    error_of,
    post,
    read_response,
    wait_closed_by_peer,
)
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway import ADMIN_KEY, make_config, running_gateway

pytestmark = pytest.mark.timeout(90)
SLACK_S = 8.0


@contextlib.asynccontextmanager
async def _gateway(**listen: float) -> AsyncIterator[tuple[str, FaultEngine]]:
    async with fault_engine(FaultEngine()) as eng:
        config = make_config([ep(eng)], listen={"host": "127.0.0.1", "port": 0, **listen},
                             timeouts={"first_byte_s": 30})
        async with running_gateway(config) as gw:
            yield gw, eng


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.parametrize("route", ["front", "aiohttp"])
async def test_idle_keepalive_connections_close_after_keepalive_s(route: str) -> None:
    """After one served request, an idle kept-alive connection is closed by the gateway within
    keepalive_s (2 s) plus the sweep, on the front and on a connection aiohttp serves."""
    async with _gateway(keepalive_s=2, header_timeout_s=60) as (gw, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(gw))
        try:
            if route == "front":
                payload = b'{"model": "m", "prompt": "hi", "max_tokens": 2}'
                writer.write(completion_head(len(payload)) + payload)
            else:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, _, _ = await read_response(reader, 10, check_close=False)
            assert status == 200
            assert await wait_closed_by_peer(reader, 2 + SLACK_S)
        finally:
            writer.close()


async def test_past_max_connections_a_new_connection_gets_503_and_old_ones_are_served() -> None:
    """max_connections 20: 20 idle connections are held; the 21st gets JSON 503 overloaded with
    Retry-After and is closed; a request on one of the 20 is still served."""
    async with _gateway(max_connections=20, header_timeout_s=60, keepalive_s=60) as (gw, _):
        held = [await asyncio.open_connection("127.0.0.1", _port(gw)) for _ in range(20)]
        try:
            # every one of them accepted: each answers a request in turn (still 20 open)
            reader, writer = held[0]
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_response(reader, 10, check_close=False))[0] == 200
            await asyncio.sleep(0.3)
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(gw))
            try:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                status, headers, data, closed = await read_response(reader, 10)
            finally:
                writer.close()
            assert (status, error_of(data)["code"]) == (503, "overloaded"), data
            assert int(headers["retry-after"]) >= 1 and closed
            reader, writer = held[-1]
            payload = b'{"model": "m", "prompt": "hi", "max_tokens": 2}'
            writer.write(completion_head(len(payload)) + payload)
            status, _, data, _ = await read_response(reader, 10, check_close=False)
            assert status == 200 and b"tok" in data
        finally:
            for _, writer in held:
                writer.close()


async def test_past_max_inflight_a_request_gets_503_overloaded_with_retry_after() -> None:
    """max_inflight 3: three requests hang at the engine; the fourth gets JSON 503 overloaded
    with Retry-After at once; once they end, requests are served again."""
    async with _gateway(max_inflight=3) as (gw, eng), aiohttp.ClientSession() as s:
        hung = [asyncio.create_task(post(s, gw, body(), {"x-fault": "hang-head"}))
                for _ in range(3)]
        for _ in range(200):
            if eng.received["hang-head"] == 3:
                break
            await asyncio.sleep(0.05)
        assert eng.received["hang-head"] == 3
        status, raw, headers = await post(s, gw, body())
        assert (status, error_of(raw)["code"]) == (503, "overloaded"), raw
        assert int(headers["Retry-After"]) >= 1
        for task in hung:
            task.cancel()
        await asyncio.gather(*hung, return_exceptions=True)
        for _ in range(100):  # the gateway notices the clients gone
            status, raw, _ = await post(s, gw, body())
            if status == 200:
                break
            await asyncio.sleep(0.1)
        assert status == 200
        async with s.get(gw + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
            assert 'status="overloaded"' in await r.text()
