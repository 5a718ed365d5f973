"""A stand-in for nvidia-ml-py (`pynvml`) for `bench.gpu_energy --dry-run` on machines without
a GPU. Its one GPU draws 60 W, and 300 W in every other 3 s block of the wall clock; the energy
counter (mJ) is the exact integral of that, updated every 20 ms as a real counter steps.
Every process that imports it reads the same counter, since it is a function of the wall clock.
Instant power (`nvmlDeviceGetFieldValues`) is not supported, as on some drivers.
"""

from __future__ import annotations

import math
import time
from typing import Any

IDLE_W = 60.0
BUSY_W = 300.0
BLOCK_S = 3.0
UPDATE_S = 0.02

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_FI_DEV_POWER_INSTANT = 186


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"fake NVML error {value}")
        self.value = value


def _energy_j(t: float) -> float:
    t = math.floor(t / UPDATE_S) * UPDATE_S
    blocks = math.floor(t / BLOCK_S)
    busy_blocks = blocks // 2  # blocks 1, 3, 5 ... are busy
    into = t - blocks * BLOCK_S
    busy_s = busy_blocks * BLOCK_S + (into if blocks % 2 == 1 else 0.0)
    return IDLE_W * t + (BUSY_W - IDLE_W) * busy_s


def _power_w(t: float) -> float:
    return BUSY_W if math.floor(t / BLOCK_S) % 2 == 1 else IDLE_W


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return 1


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if index != 0:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return 0


def nvmlDeviceGetTotalEnergyConsumption(handle: Any) -> int:
    return int(_energy_j(time.time()) * 1000.0)


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    return int(_power_w(time.time()) * 1000.0)


def nvmlDeviceGetFieldValues(handle: Any, fields: Any) -> Any:
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetName(handle: Any) -> str:
    return "fake GPU (dry run)"


def nvmlSystemGetDriverVersion() -> str:
    return "0.0 (fake)"


def nvmlDeviceGetEnforcedPowerLimit(handle: Any) -> int:
    return 700_000
