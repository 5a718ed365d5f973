"""dcgm-exporter meter: `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (mJ counter) per `gpu` label.

dcgm-exporter samples at 1 Hz by default, so its counter lags up to a second; the
apportioner's carried-forward residual absorbs that lag. The exporter gives no sample time,
so the reading is stamped when the scrape completes.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence

import aiohttp

from engines.meters.base import EnergyReading, MeterError, ResetTracker, pick_gpus
from engines.meters.httpjson import fetch

METRIC = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
_GPU_LABEL = re.compile(r'(?:^|[{,])\s*gpu="(\d+)"')


def parse_dcgm(text: str) -> dict[int, float]:
    """{gpu index: joules} from dcgm-exporter's Prometheus text."""
    out: dict[int, float] = {}
    for line in text.splitlines():
        if not line.startswith(METRIC) or line[len(METRIC):len(METRIC) + 1] not in ("{", " "):
            continue
        close = line.rfind("}")
        labels = line[len(METRIC):close + 1] if close >= 0 else ""
        match = _GPU_LABEL.search(labels)
        if match is None:
            raise MeterError(f"dcgm: sample without a gpu label: {line[:100]!r}")
        fields = line[close + 1:].split() if close >= 0 else line[len(METRIC):].split()
        try:
            value_mj = float(fields[0])
        except (IndexError, ValueError):
            raise MeterError(f"dcgm: bad sample value: {line[:100]!r}") from None
        if not math.isnan(value_mj):
            out[int(match.group(1))] = value_mj / 1000.0
    return out


class DcgmMeter:
    kind = "dcgm"
    estimated = False

    def __init__(self, url: str, gpus: Sequence[int], *,
                 session: aiohttp.ClientSession | None = None, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.time):
        self.url = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
        self.gpus = tuple(gpus)
        self._session = session
        self._own_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock
        self._tracker = ResetTracker(len(self.gpus))

    async def read(self) -> EnergyReading:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        text = (await fetch(self._session, self.url, self._timeout, "dcgm")).decode(
            "utf-8", "replace")
        raw = pick_gpus(parse_dcgm(text), self.gpus, "dcgm")
        return EnergyReading(timestamp_s=self._clock(), energy_j=self._tracker.update(raw),
                             resets=self._tracker.resets)

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None
