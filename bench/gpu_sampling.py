"""GPU 0 for `bench.gpu_energy`: the matmul load, the 20 Hz NVML sampler, nvidia-smi's counter."""

from __future__ import annotations

import bisect
import itertools
import math
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def rel(a: float, b: float) -> float:
    """(a - b) / b, 0 when both are 0."""
    return (a - b) / b if b else (0.0 if a == 0 else math.inf)


# ---- the load ---------------------------------------------------------------------------------

class Load:
    """bf16 8192^3 matrix products on GPU 0 (PyTorch), or sleep in a dry run."""

    N = 8192

    def __init__(self, dry: bool):
        self.dry = dry
        self.products = 0
        self._lock = threading.Lock()
        if not dry:
            import torch

            self._torch = torch
            torch.manual_seed(0)
            self._a = torch.randn(self.N, self.N, dtype=torch.bfloat16, device="cuda")
            self._b = torch.randn(self.N, self.N, dtype=torch.bfloat16, device="cuda")
            torch.cuda.synchronize()

    def run_for(self, seconds: float) -> float:
        """Busy for `seconds`; returns the wall time it took (whole batches of 10 products)."""
        t0 = time.monotonic()
        if self.dry:
            time.sleep(seconds)
            return time.monotonic() - t0
        torch = self._torch
        torch.cuda.set_device(0)  # this thread's CUDA context (the load also runs on a thread)
        while time.monotonic() - t0 < seconds:
            for _ in range(10):
                torch.matmul(self._a, self._b)
            torch.cuda.synchronize()
            with self._lock:
                self.products += 10
        return time.monotonic() - t0

    @property
    def tflop(self) -> float:
        return self.products * 2 * self.N**3 / 1e12

    def pattern(self, on_s: float, off_s: float, stop: threading.Event,
                windows: list[tuple[float, float]]) -> None:
        """On/off until `stop`; appends each busy window (wall clock) to `windows`."""
        while not stop.is_set():
            start = time.time()
            self.run_for(on_s)
            windows.append((start, time.time()))
            stop.wait(off_s)


# ---- NVML sampling ----------------------------------------------------------------------------

@dataclass
class Samples:
    t: list[float] = field(default_factory=list)
    counter_j: list[float] = field(default_factory=list)
    avg_w: list[float] = field(default_factory=list)  # nvmlDeviceGetPowerUsage (1 s average)
    inst_w: list[float | None] = field(default_factory=list)  # NVML_FI_DEV_POWER_INSTANT

    def energy_at(self, t: float) -> float:
        """The counter linearly interpolated at wall time `t` (inside the sampled span)."""
        i = bisect.bisect_left(self.t, t)
        if i <= 0 or i >= len(self.t):
            raise ValueError(f"{t} is outside the sampled span {self.t[0]}..{self.t[-1]}")
        t0, t1 = self.t[i - 1], self.t[i]
        e0, e1 = self.counter_j[i - 1], self.counter_j[i]
        return e0 + (e1 - e0) * (t - t0) / (t1 - t0)

    def integrate(self, series: list[Any], t0: float, t1: float) -> float | None:
        """Trapezoid integral of a power series (W) over [t0, t1], None if any point is missing."""
        pts = [(t, w) for t, w in zip(self.t, series, strict=True) if t0 <= t <= t1]
        if len(pts) < 2 or any(w is None for _, w in pts):
            return None
        return math.fsum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in itertools.pairwise(pts))


class Sampler(threading.Thread):
    """Reads GPU 0's counter and power every `period_s` on its own thread, wall-clock stamped."""

    def __init__(self, nvml: Any, period_s: float = 0.05):
        super().__init__(daemon=True)
        self.nvml = nvml
        self.handle = nvml.nvmlDeviceGetHandleByIndex(0)
        self.period_s = period_s
        self.samples = Samples()
        self.instant_supported = True
        self._halt = threading.Event()

    def _instant_w(self) -> float | None:
        if not self.instant_supported:
            return None
        try:
            [fv] = self.nvml.nvmlDeviceGetFieldValues(self.handle, [self.nvml.NVML_FI_DEV_POWER_INSTANT])
            if fv.nvmlReturn != self.nvml.NVML_SUCCESS:
                raise self.nvml.NVMLError(fv.nvmlReturn)
            return float(fv.value.uiVal) / 1000.0
        except (self.nvml.NVMLError, AttributeError, ValueError):
            self.instant_supported = False
            return None

    def read(self) -> None:
        s = self.samples
        mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        s.t.append(time.time())
        s.counter_j.append(mj / 1000.0)
        s.avg_w.append(self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0)
        s.inst_w.append(self._instant_w())

    def run(self) -> None:
        next_t = time.monotonic()
        while not self._halt.is_set():
            self.read()
            next_t += self.period_s
            self._halt.wait(max(0.0, next_t - time.monotonic()))

    def stop(self) -> None:
        self._halt.set()
        self.join()


# ---- nvidia-smi -------------------------------------------------------------------------------

UNITS_J = {"mJ": 1e-3, "J": 1.0, "kJ": 1e3}


def parse_smi_csv(text: str) -> float:
    """Joules from `nvidia-smi --query-gpu=total_energy_consumption --format=csv` output, whose
    header names the unit, e.g. 'total_energy_consumption [mJ]' then '123456789'."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) < 2 or "[" not in lines[0]:
        raise ValueError(f"unexpected nvidia-smi output: {text!r}")
    unit = lines[0].split("[", 1)[1].split("]", 1)[0].strip()
    if unit not in UNITS_J:
        raise ValueError(f"unknown unit {unit!r} in {lines[0]!r}")
    value = lines[1].split()[0]
    return float(value) * UNITS_J[unit]


def smi_energy_j() -> tuple[float, float]:
    """(wall time at the midpoint of the call, joules) from nvidia-smi for GPU 0."""
    t0 = time.time()
    out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=total_energy_consumption",
                          "--format=csv"], capture_output=True, text=True, timeout=30, check=True)
    t1 = time.time()
    return (t0 + t1) / 2, parse_smi_csv(out.stdout)
