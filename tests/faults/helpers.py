"""Shared pieces of the fault suite: configs, a gateway process, raw sockets, the access log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.support.fault_engine import FaultEngine
from tests.support.gateway import ADMIN_KEY, KEY_A, raw_config
from tests.support.procs import free_port
from tests.support.replicas import gateway_set, members

AUTH = {"Authorization": f"Bearer {KEY_A}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def ep(engine: FaultEngine | str, name: str = "e1", precision: str = "bf16") -> dict[str, Any]:
    url = engine if isinstance(engine, str) else engine.url
    return {"name": name, "url": url, "precision": precision, "kind": "vllm"}


def body(stream: bool = False, max_tokens: int = 4, prompt: str = "hello") -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": stream}


async def post(s: aiohttp.ClientSession, url: str, data: Any,
               headers: dict[str, str] | None = None, path: str = "/v1/completions",
               timeout_s: float = 30.0) -> tuple[int, bytes, dict[str, str]]:
    raw = data if isinstance(data, bytes) else orjson.dumps(data)
    hdrs = {"Content-Type": "application/json", **AUTH, **(headers or {})}
    async with s.post(url + path, data=raw, headers=hdrs,
                      timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
        return r.status, await r.read(), dict(r.headers)


def error_of(raw: bytes) -> dict[str, Any]:
    """The `error` object of an OpenAI-style JSON error body (fails if the body is not one)."""
    err = orjson.loads(raw)["error"]
    assert isinstance(err, dict) and err["code"] and err["message"] and err["type"], raw
    return err


def sse_events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e.strip()]


async def endpoints(s: aiohttp.ClientSession, gw: str) -> dict[str, dict[str, Any]]:
    async with s.get(gw + "/admin/v1/endpoints", headers=ADMIN) as r:
        assert r.status == 200
        rows = (await r.json(loads=orjson.loads))["endpoints"]
    return {row["name"]: row for row in rows}


def is_ejected(row: dict[str, Any]) -> bool:
    return bool(row.get("ejected_until"))


async def metrics_text(s: aiohttp.ClientSession, gw: str) -> str:
    """The gateway's /metrics page; behind a front, every replica's, one after another (a
    counter's samples are then summed over the replicas, as `sum` does in Prometheus)."""
    pages = []
    for url in members(gw):
        async with s.get(url + "/metrics") as r:
            pages.append(await r.text())
    return "\n".join(pages)


async def wait_for(check: Callable[[], Any], timeout_s: float = 20.0, what: str = "") -> Any:
    """Poll `check` (sync, or returning an awaitable) until truthy; bounded."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        await asyncio.sleep(0.05)


def access_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def access_log_of(path: Path, n: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """The access log once it holds at least `n` lines (its writer is a thread)."""
    await wait_for(lambda: len(access_lines(path)) >= n, timeout_s, f"{n} access log lines")
    return access_lines(path)


# --- raw HTTP over sockets ---------------------------------------------------------------------

async def read_response(reader: asyncio.StreamReader, timeout_s: float, *,
                        check_close: bool = True) -> tuple[int, dict[str, str], bytes, bool]:
    """Read one response head and its Content-Length body. Returns (status, lowercased
    headers, body, closed) where `closed` says the server closed the connection after it
    (EOF within 3 s; not looked for when `check_close` is false)."""
    async with asyncio.timeout(timeout_s):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        data = await reader.readexactly(int(headers.get("content-length", "0")))
    closed = False
    if not check_close:
        return status, headers, data, closed
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(3.0):
            closed = (await reader.read(1)) == b""
    return status, headers, data, closed


async def wait_closed_by_peer(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """True once the server closes (EOF or reset) within `timeout_s`, reading anything sent."""
    try:
        async with asyncio.timeout(timeout_s):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


def completion_head(length: int | None, host: str = "127.0.0.1", chunked: bool = False,
                    path: str = "/v1/completions") -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Authorization: Bearer {KEY_A}",
             "Content-Type: application/json"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# --- the gateway as a process ------------------------------------------------------------------

def write_config(tmp_path: Path, endpoints: Sequence[dict[str, Any]], **extra: Any
                 ) -> tuple[Path, int]:
    """A gateway config file (JSON is YAML) listening on a free port; returns (path, port)."""
    port = free_port()
    raw = raw_config(endpoints, **extra)
    raw["listen"] = {"host": "127.0.0.1", "port": port, **raw.get("listen", {}),
                     **extra.get("listen", {})}
    raw["listen"]["port"] = port
    path = tmp_path / "gateway.yaml"
    path.write_bytes(orjson.dumps(raw))
    return path, port


@contextlib.contextmanager
def gateway_process(config: Path, port: int, log: Path, nofile: int | None = None
                    ) -> Iterator[str]:
    """`wattgate serve` on `port`, stdout/stderr to `log`; `nofile` caps RLIMIT_NOFILE (soft
    and hard) of that process alone. Always stopped. With WATTGATE_TEST_REPLICAS, replicas
    behind a front on `port` (tests/support/replicas.py)."""
    with gateway_set(config, port, log, nofile=nofile) as gw:
        yield gw.url
