"""The model meter: no hardware counter, energy estimated from token work. Always `estimated`.

Power is modelled as idle_power_w plus a fixed energy per prefill and per decode token. The
accounting service asks it for each interval's energy from that interval's work
(`interval_energy_j`), because token work is only known once requests finish; `read()` gives
the same model as a cumulative counter of what has been fed through `add_work`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from engines.meters.base import EnergyReading


@dataclass(frozen=True, slots=True)
class PowerModel:
    # per engine; 60-120 W per GPU holding a context (docs/architecture.md, "Sources")
    idle_power_w: float = 80.0
    prefill_j_per_token: float = 0.01
    decode_j_per_token: float = 0.15  # ~0.12 J/token at batch 64 on H100 (ML.ENERGY v3)


class ModelMeter:
    kind = "model"
    estimated = True

    def __init__(self, model: PowerModel, *, clock: Callable[[], float] = time.time):
        self.model = model
        self._clock = clock
        self._start_s = clock()
        self._work_j = 0.0

    def interval_energy_j(self, dt_s: float, prefill_tokens: float, decode_tokens: float) -> float:
        m = self.model
        return (m.idle_power_w * dt_s + m.prefill_j_per_token * prefill_tokens
                + m.decode_j_per_token * decode_tokens)

    def add_work(self, prefill_tokens: float, decode_tokens: float) -> None:
        self._work_j += self.interval_energy_j(0.0, prefill_tokens, decode_tokens)

    async def read(self) -> EnergyReading:
        now = self._clock()
        idle_j = self.model.idle_power_w * (now - self._start_s)
        return EnergyReading(timestamp_s=now, energy_j=(idle_j + self._work_j,), estimated=True,
                             idle_power_w=self.model.idle_power_w)

    async def close(self) -> None:
        return None
