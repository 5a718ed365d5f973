"""dcgm, agent, sim and model meters against real local HTTP servers and recorded counters."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from engines.meters.agent import ReplaySource, build_agent_app
from engines.meters.base import MeterError
from engines.meters.dcgm import DcgmMeter, parse_dcgm
from engines.meters.httpjson import HttpJsonMeter
from engines.meters.model import ModelMeter, PowerModel
from engines.meters.registry import MeterSpec, make_meter
from tests.support.fake_engine import serving

DCGM_TEXT = """# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-a",Hostname="n1"} 1500000
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-b",Hostname="n1"} 2500000
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a"} 300.5
"""


def test_dcgm_text_gives_joules_per_gpu_label() -> None:
    assert parse_dcgm(DCGM_TEXT) == {0: 1500.0, 1: 2500.0}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_dcgm_meter_scrapes_exporter_and_sums_gpus() -> None:
    values = iter([DCGM_TEXT, DCGM_TEXT.replace("1500000", "1800000")])

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=next(values))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with TestServer(app, host="127.0.0.1") as server:
        meter = DcgmMeter(str(server.make_url("/")), [0, 1])
        first = await meter.read()
        second = await meter.read()
        await meter.close()
    assert first.total_j == 4000.0
    assert second.total_j - first.total_j == pytest.approx(300.0)


async def test_agent_replays_recorded_counters_in_time_with_reset(tmp_path: Path) -> None:
    """The agent interpolates a replay file by elapsed time; the meter hides the reset."""
    replay = tmp_path / "replay.jsonl"
    lines = [{"t_s": 0, "gpus": [{"index": 0, "energy_j": 1000.0}]},
             {"t_s": 10, "gpus": [{"index": 0, "energy_j": 3000.0}]},
             {"t_s": 11, "gpus": [{"index": 0, "energy_j": 50.0}]},
             {"t_s": 20, "gpus": [{"index": 0, "energy_j": 950.0}]}]
    replay.write_text("\n".join(json.dumps(x) for x in lines))
    mono = Clock()
    src = ReplaySource.from_file(replay, mono=mono, wall=lambda: 1e9 + mono.t)
    async with TestServer(build_agent_app(src), host="127.0.0.1") as server:
        meter = HttpJsonMeter("agent", str(server.make_url("/")), "/v1/energy", [0])
        got = []
        for t in (0.0, 5.0, 10.0, 11.0, 15.5):
            mono.t = t
            got.append(await meter.read())
        await meter.close()
    assert [r.energy_j[0] for r in got] == pytest.approx([1000, 2000, 3000, 3050, 3500])
    assert got[-1].timestamp_s == pytest.approx(1e9 + 15.5)
    assert got[-1].resets == 1


async def test_sim_meter_reads_energy_document_and_idle_power() -> None:
    async def energy(_: web.Request) -> web.Response:
        return web.json_response({"timestamp_s": 123.5, "idle_power_w": 75.0, "time_scale": 1.0,
                                  "gpus": [{"index": 0, "energy_j": 10.0},
                                           {"index": 1, "energy_j": 20.0}]})

    app = web.Application()
    app.router.add_get("/sim/energy", energy)
    async with TestServer(app, host="127.0.0.1") as server:
        meter = make_meter(MeterSpec(kind="sim", url=str(server.make_url("/"))))
        reading = await meter.read()
        await meter.close()
    assert reading.total_j == 30.0
    assert reading.timestamp_s == 123.5
    assert reading.idle_power_w == 75.0


async def test_http_meter_reports_missing_gpu_and_bad_status() -> None:
    async def energy(_: web.Request) -> web.Response:
        return web.json_response({"gpus": [{"index": 0, "energy_j": 1.0}]})

    app = web.Application()
    app.router.add_get("/v1/energy", energy)
    async with TestServer(app, host="127.0.0.1") as server:
        meter = HttpJsonMeter("agent", str(server.make_url("/")), "/v1/energy", [3])
        with pytest.raises(MeterError, match="GPU 3"):
            await meter.read()
        bad = HttpJsonMeter("agent", str(server.make_url("/")), "/nope", None)
        with pytest.raises(MeterError, match="HTTP 404"):
            await bad.read()
        await meter.close()
        await bad.close()


async def test_model_meter_is_estimated_and_follows_token_work() -> None:
    clock = Clock()
    meter = ModelMeter(PowerModel(idle_power_w=100.0, prefill_j_per_token=0.01,
                                  decode_j_per_token=0.2), clock=clock)
    assert meter.interval_energy_j(1.0, 1000, 50) == pytest.approx(100 + 10 + 10)
    clock.t = 2.0
    meter.add_work(0, 10)
    reading = await meter.read()
    assert reading.estimated
    assert reading.total_j == pytest.approx(200 + 2)


async def test_agent_metrics_expose_each_gpu_counter_in_prometheus_text() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from engines.meters.agent import build_agent_app

    app = build_agent_app(lambda: (1.0, [(0, 12.5), (1, 3.0)]))
    async with serving(app) as port, aiohttp.ClientSession() as s, \
            s.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {s.labels["gpu"]: s.value for s in fams["wattgate_agent_gpu_energy_joules"].samples}
    assert samples == {"0": 12.5, "1": 3.0}


async def test_agent_reads_counters_off_the_loop_and_one_at_a_time() -> None:
    """A slow counter read (NVML in a sandbox: milliseconds) holds up neither /health nor the
    loop, and concurrent scrapes never read at once (the reset tracker needs reads in order)."""
    state = {"running": 0, "most": 0, "reads": 0}
    guard = threading.Lock()

    def slow_source() -> tuple[float, list[tuple[int, float]]]:
        with guard:
            state["running"] += 1
            state["most"] = max(state["most"], state["running"])
        time.sleep(0.2)
        with guard:
            state["running"] -= 1
            state["reads"] += 1
            return float(state["reads"]), [(0, 10.0 * state["reads"])]

    async with serving(build_agent_app(slow_source)) as port, aiohttp.ClientSession() as s:
        base = f"http://127.0.0.1:{port}"

        async def energy() -> float:
            async with s.get(f"{base}/v1/energy") as r:
                assert r.status == 200
                return float((await r.json())["gpus"][0]["energy_j"])

        gaps: list[float] = []

        async def ticker() -> None:  # the loop the agent serves on (this one) keeps turning
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        scrapes = [asyncio.create_task(energy()) for _ in range(4)]
        await asyncio.sleep(0.05)
        async with s.get(f"{base}/health") as r:  # answered while reads are in progress
            assert r.status == 200
        values = await asyncio.gather(*scrapes)
        tick.cancel()
    assert max(gaps) < 0.15, max(gaps)  # a read on the loop would stop it for 0.2 s
    assert state["most"] == 1 and state["reads"] == 4
    assert sorted(values) == [10.0, 20.0, 30.0, 40.0]
