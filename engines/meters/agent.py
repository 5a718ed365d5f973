"""`wattgate agent`: a small HTTP service exposing one node's GPU energy counters as JSON.

Runs on each GPU node (a Kubernetes DaemonSet) so gateways elsewhere can meter engines they
do not share a host with. GET /v1/energy -> {"timestamp_s", "gpus": [{"index", "energy_j"}]},
the same document the simulated engine serves, read by the `agent` meter kind.
It binds 127.0.0.1 unless `--host` says otherwise. With a key (`--api-key`, or the
WATTGATE_AGENT_API_KEY environment variable, which keeps it out of `ps`), /v1/energy and
/metrics answer only `Authorization: Bearer <key>` (else 401, a JSON error); /health
(liveness) and /ready (the counters can be read: 200 or 503, no numbers) stay open.
`--fake-replay FILE` serves recorded counters instead of NVML: JSON lines
{"t_s": seconds since start, "gpus": [{"index", "energy_j"}]}, linearly interpolated in time
and held at the last line, for tests and demos on machines without GPUs.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import hmac
import ipaddress
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
import orjson
from aiohttp import web

from engines.meters.base import MeterError
from engines.meters.nvml import NvmlMeter

Source = Callable[[], tuple[float, list[tuple[int, float]]]]
KEY_ENV = "WATTGATE_AGENT_API_KEY"
OPEN_PATHS = frozenset({"/health", "/ready"})  # probes: no key, no numbers
_UNAUTHORIZED = orjson.dumps({"error": {
    "message": "this agent needs its API key: Authorization: Bearer <key>",
    "type": "authentication_error", "param": None, "code": "invalid_api_key"}})


class ReplaySource:
    """Recorded counters replayed against elapsed time (monotonic clock)."""

    def __init__(self, points: Sequence[tuple[float, dict[int, float]]], *,
                 wall: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic):
        if not points:
            raise ValueError("replay needs at least one recorded reading")
        self._t = [p[0] for p in points]
        self._gpus = [p[1] for p in points]
        self._wall = wall
        self._mono = mono
        self._start = mono()

    @classmethod
    def from_file(cls, path: Path, **clocks: Callable[[], float]) -> ReplaySource:
        points = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
                gpus = {int(g["index"]): float(g["energy_j"]) for g in doc["gpus"]}
                points.append((float(doc["t_s"]), gpus))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{n}: bad replay line: {exc!r}") from None
        return cls(sorted(points, key=lambda p: p[0]), **clocks)

    def __call__(self) -> tuple[float, list[tuple[int, float]]]:
        elapsed = self._mono() - self._start
        i = bisect.bisect_right(self._t, elapsed)
        if i == 0:
            cur = self._gpus[0]
        elif i >= len(self._t):
            cur = self._gpus[-1]
        else:
            t0, t1 = self._t[i - 1], self._t[i]
            a, b = self._gpus[i - 1], self._gpus[i]
            f = (elapsed - t0) / (t1 - t0) if t1 > t0 else 1.0
            # A drop between two points is a recorded reset: hold, then step at the next point.
            cur = {g: (a[g] + f * (b[g] - a[g]) if b[g] >= a[g] else a[g]) for g in b}
        return self._wall(), sorted(cur.items())


def nvml_source(gpus: Sequence[int] | None) -> Source:
    import pynvml

    pynvml.nvmlInit()
    indices = list(gpus) if gpus else list(range(pynvml.nvmlDeviceGetCount()))
    meter = NvmlMeter(indices, nvml=pynvml)
    # Raw (unoffset) counters would reset with the driver; publish the monotonic series.

    def read() -> tuple[float, list[tuple[int, float]]]:
        r = meter.read_sync()
        return r.timestamp_s, list(zip(indices, r.energy_j, strict=True))

    return read


def _key_guard(api_key: str) -> Callable[..., Any]:
    """Middleware: every path but the probes needs `Authorization: Bearer <api_key>`."""
    want = hashlib.sha256(f"Bearer {api_key}".encode()).digest()

    @web.middleware
    async def guard(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if request.path not in OPEN_PATHS:
            got = hashlib.sha256(request.headers.get("Authorization", "").encode()).digest()
            if not hmac.compare_digest(got, want):
                return web.Response(status=401, body=_UNAUTHORIZED,
                                    content_type="application/json",
                                    headers={"WWW-Authenticate": "Bearer"})
        response: web.StreamResponse = await handler(request)
        return response

    return guard


def build_agent_app(source: Source, api_key: str = "") -> web.Application:
    """The agent's routes over `source`; with `api_key`, all but the probes need it."""
    # An NVML read blocks: ~10-100 us per GPU on bare metal, 2.4 ms median and 16 ms p99 per
    # call in a sandboxed H200 (bench/results/gpu_energy.md). Reads run in a worker thread so
    # health checks and other scrapes are not held up, and one at a time: the meter's reset
    # tracker must see its counters in the order they were read.
    lock = asyncio.Lock()

    async def read() -> tuple[float, list[tuple[int, float]]]:
        async with lock:
            return await asyncio.to_thread(source)

    async def energy(_: web.Request) -> web.Response:
        try:
            ts, gpus = await read()
        except MeterError as exc:
            return web.json_response({"error": str(exc)}, status=503, dumps=_dumps)
        doc: dict[str, Any] = {"timestamp_s": ts,
                               "gpus": [{"index": i, "energy_j": e} for i, e in gpus]}
        return web.Response(body=orjson.dumps(doc), content_type="application/json")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def ready(_: web.Request) -> web.Response:
        try:
            await read()
        except MeterError:
            return web.Response(status=503, text="energy counters unavailable")
        return web.Response(text="ok")

    async def metrics(_: web.Request) -> web.Response:
        """Prometheus text: each GPU's cumulative energy counter, for the ServiceMonitor."""
        try:
            gpus = (await read())[1]
        except MeterError:
            return web.Response(status=503, text="# energy counters unavailable\n")
        return web.Response(text=prometheus_text(gpus),
                            content_type="text/plain", charset="utf-8")

    app = web.Application(middlewares=[_key_guard(api_key)] if api_key else [])
    app.router.add_get("/v1/energy", energy)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    return app


def prometheus_text(gpus: Sequence[tuple[int, float]]) -> str:
    lines = ["# HELP wattgate_agent_gpu_energy_joules_total GPU energy counter (monotonic)",
             "# TYPE wattgate_agent_gpu_energy_joules_total counter"]
    lines += [f'wattgate_agent_gpu_energy_joules_total{{gpu="{i}"}} {e!r}' for i, e in gpus]
    return "\n".join(lines) + "\n"


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@click.command("agent")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Listen address; 0.0.0.0 serves other hosts (then set a key).")
@click.option("--port", type=int, default=9400, show_default=True)
@click.option("--api-key", envvar=KEY_ENV, default="", show_envvar=True,
              help="Require `Authorization: Bearer <key>` on /v1/energy and /metrics "
                   "(prefer the environment variable: an argument shows in `ps`).")
@click.option("--gpus", default="", help="comma-separated GPU indices (default: all)")
@click.option("--fake-replay", "fake_replay", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), default=None, help="serve recorded counters instead of NVML")
def agent(host: str, port: int, api_key: str, gpus: str, fake_replay: Path | None) -> None:
    """Serve this node's GPU energy counters as JSON at GET /v1/energy."""
    indices = [int(g) for g in gpus.split(",") if g.strip()] or None
    try:
        source: Source = (ReplaySource.from_file(fake_replay) if fake_replay
                          else nvml_source(indices))
    except (MeterError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    import uvloop

    if not api_key and not _loopback(host):
        click.echo(f"wattgate agent: serving {host}:{port} without a key: anyone who reaches "
                   f"it reads the counters (set {KEY_ENV})", err=True)
    uvloop.install()
    web.run_app(build_agent_app(source, api_key), host=host, port=port, print=None)
