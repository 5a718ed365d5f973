"""The simulated engine's /sim/* routes: its energy counter, each request's ground-truth
energy (Shapley and residency views) and timing, and the engine's totals; and the state the
server's handlers share."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import orjson
from aiohttp import web

from engines.sim.catalog import Deployment
from engines.sim.config import SimConfig
from engines.sim.power import idle_power_w
from engines.sim.protocol import ApiError
from engines.sim.runtime import SimRuntime


@dataclass(slots=True)
class SimState:
    cfg: SimConfig
    deployment: Deployment
    runtime: SimRuntime
    rng: random.Random
    created: int
    # Subtracted from the counter /sim/energy publishes: POST /sim/reset-counter restarts it
    # at 0, as a driver reload or GPU reset restarts NVML's (the engine's energy goes on)
    counter_base_j: float = 0.0


STATE = web.AppKey("sim_state", SimState)


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


async def sim_energy(request: web.Request) -> web.Response:
    st = request.app[STATE]
    rt = st.runtime
    rt.sync()
    now_s = rt.engine_now()
    total_j = rt.core.counter_j(now_s) - st.counter_base_j
    gpus = st.deployment.tp
    return _json({
        "timestamp_s": time.time(),
        "engine_time_s": now_s,
        "gpus": [{"index": i, "energy_j": total_j / gpus} for i in range(gpus)],
        "idle_power_w": idle_power_w(st.deployment),
        "idle_power_w_per_gpu": st.deployment.gpu.idle_w,
        "time_scale": rt.time_scale,
    })


async def sim_reset_counter(request: web.Request) -> web.Response:
    """Restart the published energy counter at 0 (a simulated GPU reset); the energy spent
    so far stays in /sim/stats' `counter_j`."""
    st = request.app[STATE]
    rt = st.runtime
    rt.sync()
    st.counter_base_j = rt.core.counter_j(rt.engine_now())
    return _json({"counter_base_j": st.counter_base_j})


async def sim_request(request: web.Request) -> web.Response:
    st = request.app[STATE]
    truth = st.runtime.truth(request.match_info["request_id"])
    if truth is None:
        return web.Response(body=ApiError(404, "unknown request id", "NotFoundError").body(),
                            status=404, content_type="application/json")
    return _json({**truth.to_json(), **st.runtime.wire_timing(truth)})


async def sim_requests(request: web.Request) -> web.Response:
    st = request.app[STATE]
    return _json({"requests": [t.to_json() for t in st.runtime.all_truth()]})


async def sim_stats(request: web.Request) -> web.Response:
    st = request.app[STATE]
    rt = st.runtime
    rt.sync()
    ledger = rt.ledger
    running, waiting, kv = rt.core.load()
    now_s = rt.engine_now()
    return _json({
        "engine_time_s": now_s,
        "engine_start_unix_s": rt.start_unix_s,
        "time_scale": rt.time_scale,
        "idle_energy_j": ledger.idle_j,
        "requests_energy_j": ledger.charged_j,
        "requests_shapley_energy_j": ledger.shapley_charged_j,
        "counter_committed_j": ledger.counter_j - ledger.start_j,
        "counter_j": rt.core.counter_j(now_s),
        "requests_served": rt.served,
        "requests_aborted": rt.aborted,
        "running": running,
        "waiting": waiting,
        "kv_cache_usage": kv,
        "gpu": st.deployment.gpu.key,
        "model": st.deployment.model.key,
        "precision": st.deployment.precision.key,
        "tp": st.deployment.tp,
        "dialect": st.cfg.dialect,
        "kv_cache_tokens": st.deployment.kv_tokens,
    })


def add_truth_routes(app: web.Application) -> None:
    app.router.add_get("/sim/energy", sim_energy)
    app.router.add_get("/sim/requests", sim_requests)
    app.router.add_get("/sim/requests/{request_id}", sim_request)
    app.router.add_get("/sim/stats", sim_stats)
    app.router.add_post("/sim/reset-counter", sim_reset_counter)
