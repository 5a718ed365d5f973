"""NVML meter: `nvmlDeviceGetTotalEnergyConsumption`, millijoules since the driver loaded.

Never integrate `nvmlDeviceGetPowerUsage` for energy: on Ampere and newer it is a 1 s average.
The counter steps every 100 ms on an H200 (driver 580, bench/results/gpu_energy.md), so windows
shorter than that can read 0; the apportioner works on >= 1 s intervals for that reason. The
NVML module is injected so tests can replay recorded counters through a fake with the same
surface as nvidia-ml-py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from engines.meters.base import CounterUnsupportedError, EnergyReading, MeterError, ResetTracker


def load_pynvml() -> Any:
    """The real binding (package nvidia-ml-py, module pynvml)."""
    import pynvml

    return pynvml


class NvmlMeter:
    kind = "nvml"
    estimated = False

    def __init__(self, gpus: Sequence[int], *, nvml: Any = None,
                 clock: Callable[[], float] = time.time):
        self._nvml = load_pynvml() if nvml is None else nvml
        self._clock = clock
        self.gpus = tuple(gpus)
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise MeterError(f"nvml: cannot initialise NVML: {exc}") from None
        self._handles = [self._handle(i) for i in self.gpus]
        self._tracker = ResetTracker(len(self.gpus))
        for gpu, handle in zip(self.gpus, self._handles, strict=True):
            self._read_mj(gpu, handle)  # fail at start, not on the first poll

    def _handle(self, index: int) -> Any:
        try:
            return self._nvml.nvmlDeviceGetHandleByIndex(index)
        except self._nvml.NVMLError as exc:
            raise MeterError(f"nvml: GPU {index} not found: {exc}") from None

    def _read_mj(self, gpu: int, handle: Any) -> float:
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except self._nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                raise CounterUnsupportedError(
                    f"nvml: GPU {gpu} has no total energy counter (needs Volta or newer; "
                    "MIG instances and GH200 GPU scope do not expose one); "
                    "use the dcgm or model meter instead") from None
            raise MeterError(f"nvml: reading GPU {gpu} failed: {exc}") from None

    def read_sync(self) -> EnergyReading:
        pairs = zip(self.gpus, self._handles, strict=True)
        raw_j = [self._read_mj(g, h) / 1000.0 for g, h in pairs]
        ts = self._clock()
        return EnergyReading(timestamp_s=ts, energy_j=self._tracker.update(raw_j),
                             resets=self._tracker.resets)

    async def read(self) -> EnergyReading:
        # NVML calls block for up to a few hundred microseconds: keep them off the loop.
        return await asyncio.to_thread(self.read_sync)

    async def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass  # shutting down a library that is already gone is not worth an error
