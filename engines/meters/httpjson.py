"""Meters that read a JSON energy document over HTTP: the simulated engine and wattgate's agent.

Both serve {"timestamp_s": wall clock, "gpus": [{"index": 0, "energy_j": ...}], ...};
the simulator adds "idle_power_w" (the engine's idle draw) which the service may use as the
engine's idle power.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from engines.meters.base import EnergyReading, MeterError, ResetTracker, pick_gpus


def parse_energy_doc(body: bytes, source: str) -> tuple[float | None, dict[int, float],
                                                         float | None]:
    """(timestamp_s, {gpu index: joules}, idle_power_w per wall-clock second)."""
    try:
        doc: Any = orjson.loads(body)
        gpus = {int(g["index"]): float(g["energy_j"]) for g in doc["gpus"]}
        ts = doc.get("timestamp_s")
        idle = doc.get("idle_power_w")
        # A simulator running faster than the wall clock draws idle power per simulated
        # second; per wall-clock second (the grid's time) that is time_scale times more.
        scale = float(doc.get("time_scale", 1.0))
        return (None if ts is None else float(ts), gpus,
                None if idle is None else float(idle) * scale)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MeterError(f"{source}: bad energy document: {exc!r}") from None



async def fetch(session: aiohttp.ClientSession, url: str, client_timeout: aiohttp.ClientTimeout,
                kind: str, headers: Mapping[str, str] | None = None) -> bytes:
    """GET `url`; any failure or non-200 answer is a MeterError naming the meter kind (and
    not the headers: they may carry a key)."""
    try:
        async with session.get(url, timeout=client_timeout, headers=headers) as resp:
            if resp.status != 200:
                raise MeterError(f"{kind}: GET {url} -> HTTP {resp.status}")
            return await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise MeterError(f"{kind}: GET {url} failed: {exc!r}") from None

class HttpJsonMeter:
    """GET `url + path`; the document's own timestamp is used when present."""

    estimated = False

    def __init__(self, kind: str, url: str, path: str, gpus: Sequence[int] | None, *,
                 session: aiohttp.ClientSession | None = None, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.time,
                 headers: Mapping[str, str] | None = None):
        """`headers`: sent with every read (the agent's key); never logged."""
        self.kind = kind
        self._headers = dict(headers or {})
        self.url = url.rstrip("/") + path
        self.gpus = None if gpus is None else tuple(gpus)
        self._session = session
        self._own_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock
        self._tracker: ResetTracker | None = None

    async def read(self) -> EnergyReading:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        body = await fetch(self._session, self.url, self._timeout, self.kind, self._headers)
        ts, by_index, idle_w = parse_energy_doc(body, self.kind)
        gpus = self.gpus if self.gpus is not None else tuple(sorted(by_index))
        raw = pick_gpus(by_index, gpus, self.kind)
        if self._tracker is None:
            self.gpus = gpus
            self._tracker = ResetTracker(len(gpus))
        return EnergyReading(timestamp_s=self._clock() if ts is None else ts,
                             energy_j=self._tracker.update(raw), resets=self._tracker.resets,
                             idle_power_w=idle_w)

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None
