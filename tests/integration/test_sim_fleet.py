"""`wattgate sim fleet`: several engines in one process; hundreds of concurrent streams."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from engines.adapters.trtllm import TrtllmAdapter
from engines.adapters.vllm import VllmAdapter
from tests.support.procs import free_port, running, wait_http, wattgate_cmd


def wait_lines(log: Path, count: int, timeout_s: float = 20.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = [x for x in log.read_text().splitlines() if x.startswith("ready ")]
        if len(lines) >= count:
            return lines
        time.sleep(0.05)
    raise TimeoutError(f"fewer than {count} ready lines in {log.read_text()!r}")


@pytest.mark.timeout(60)
async def test_fleet_prints_one_ready_line_per_engine_serves_both_and_stops_on_sigterm(
        tmp_path: Path) -> None:
    p1, p2 = free_port(), free_port()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "defaults: {gpu: h100, model: llama-3.1-8b, served_model_name: llama-3.1-8b}\n"
        "engines:\n"
        f"  - {{name: a-bf16, precision: bf16, dialect: vllm, port: {p1}}}\n"
        f"  - {{name: b-trt, precision: fp8, dialect: trtllm, port: {p2}}}\n"
    )
    log = tmp_path / "fleet.log"
    with running(wattgate_cmd("sim", "fleet", str(fleet)), log=log) as proc:
        lines = wait_lines(log, 2)
        assert lines == [f"ready a-bf16 http://127.0.0.1:{p1}", f"ready b-trt http://127.0.0.1:{p2}"]
        wait_http(f"http://127.0.0.1:{p2}/health", proc=proc)
        async with aiohttp.ClientSession() as s:
            for port in (p1, p2):
                body = {"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 2}
                async with s.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                    assert r.status == 200
                    assert orjson.loads(await r.read())["usage"]["completion_tokens"] == 2
            async with s.get(f"http://127.0.0.1:{p1}/metrics") as r:
                VllmAdapter().parse_load(await r.read())
            async with s.get(f"http://127.0.0.1:{p2}/metrics") as r:
                TrtllmAdapter().parse_load(await r.read())
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0


def test_fleet_with_a_bad_entry_exits_nonzero_naming_the_field(tmp_path: Path) -> None:
    fleet = tmp_path / "bad.yaml"
    fleet.write_text("engines:\n  - {gpu: a100, model: llama-3.1-8b, precision: fp8, port: 1}\n")
    log = tmp_path / "bad.log"
    with running(wattgate_cmd("sim", "fleet", str(fleet)), log=log) as proc:
        assert proc.wait(20) != 0
    assert "engines[0]" in log.read_text() and "FP8" in log.read_text()


@pytest.mark.timeout(60)
async def test_one_engine_serves_hundreds_of_concurrent_streams() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = wattgate_cmd("sim", "--gpu", "h100", "--model", "llama-3.1-8b", "--precision", "fp8",
                       "--port", str(port), "--max-batch", "512")
    streams, tokens = 300, 40
    with running(cmd, f"{url}/health"):
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as s:

            async def one(i: int) -> int:
                body = {"model": "llama-3.1-8b", "prompt": "a b c d", "max_tokens": tokens,
                        "stream": True}
                got = 0
                async with s.post(f"{url}/v1/completions", json=body,
                                  headers={"x-request-id": f"c{i}"}) as r:
                    async for line in r.content:
                        # one token per event; some events carry "" (split character)
                        if line.startswith(b"data: {") and orjson.loads(line[6:])["choices"]:
                            got += 1
                return got

            t0 = time.monotonic()
            counts = await asyncio.gather(*(one(i) for i in range(streams)))
            wall = time.monotonic() - t0
            async with s.get(f"{url}/sim/stats") as r:
                stats = orjson.loads(await r.read())
    assert counts == [tokens] * streams
    assert stats["requests_served"] >= streams
    print(f"{streams} streams x {tokens} tokens in {wall:.2f} s")
    assert wall < 20.0
