"""The NVML meter against a fake NVML that replays recorded counters, including a reset."""

from __future__ import annotations

import itertools

import pytest

from engines.meters.base import CounterUnsupportedError, MeterError
from engines.meters.nvml import NvmlMeter, load_pynvml


class FakeNVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """Same surface as nvidia-ml-py for the calls the meter makes; replays mJ per GPU."""

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_INVALID_ARGUMENT = 2

    def __init__(self, recorded: dict[int, list[int]], unsupported: frozenset[int] = frozenset()):
        self.recorded = recorded
        self.pos = dict.fromkeys(recorded, 0)
        self.unsupported = unsupported
        self.initialised = False

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index not in self.recorded:
            raise FakeNVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        if handle in self.unsupported:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        series = self.recorded[handle]
        i = min(self.pos[handle], len(series) - 1)
        self.pos[handle] += 1
        return series[i]


# mJ counters as a driver reports them; GPU 1 resets (driver reload) after the 3rd sample.
RECORDED = {
    0: [5_000_000, 5_300_000, 5_650_000, 5_900_000, 6_200_000],
    1: [9_000_000, 9_250_000, 9_500_000, 120_000, 400_000],
}


async def test_nvml_meter_sums_joules_and_survives_a_counter_reset() -> None:
    """After the reset, joules keep rising from the last value seen (nothing measured is lost)."""
    clock = iter(float(t) for t in range(100, 200))
    fake = FakeNvml(RECORDED)
    meter = NvmlMeter([0, 1], nvml=fake, clock=lambda: next(clock))
    readings = [await meter.read() for _ in range(4)]  # the constructor consumed sample 0
    gpu1 = [r.energy_j[1] for r in readings]
    assert gpu1 == [9250.0, 9500.0, 9500.0 + 120.0, 9500.0 + 400.0]
    totals = [r.total_j for r in readings]
    assert all(b > a for a, b in itertools.pairwise(totals))
    assert readings[-1].energy_j[0] == pytest.approx(6200.0)
    assert readings[-1].resets == 1
    assert readings[0].timestamp_s < readings[-1].timestamp_s
    await meter.close()
    assert not fake.initialised


def test_nvml_meter_unsupported_device_raises_a_clear_error() -> None:
    with pytest.raises(CounterUnsupportedError, match=r"GPU 1 has no total energy counter"):
        NvmlMeter([0, 1], nvml=FakeNvml(RECORDED, unsupported=frozenset({1})))


def test_nvml_meter_missing_gpu_is_an_error() -> None:
    with pytest.raises(MeterError, match="GPU 7 not found"):
        NvmlMeter([7], nvml=FakeNvml(RECORDED))


def test_real_code_path_imports_nvidia_ml_py() -> None:
    """The default NVML module is nvidia-ml-py's `pynvml`, exposing the energy call."""
    mod = load_pynvml()
    assert hasattr(mod, "nvmlDeviceGetTotalEnergyConsumption")
    assert issubclass(mod.NVMLError, Exception)
