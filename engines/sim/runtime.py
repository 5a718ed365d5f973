"""The async shell around a pure engine core: one driver task per engine, one channel per request.

Engine time is the monotonic clock scaled by `time_scale` since the engine started:
engine_s = (monotonic() - start) x time_scale (uvloop's loop.time() has only 1 ms
resolution, too coarse for engine timestamps). The driver sleeps until the core's next
event (a step's end, a fixed-timing token), advances the core to the current engine time
and wakes the requests that got tokens. No request sleeps per token.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

from engines.sim.energy import EnergyLedger
from engines.sim.engine_metrics import ServingStats
from engines.sim.state import (
    DuplicateRequestError,
    Emission,
    EngineCore,
    IterationStat,
    RequestTruth,
)

FINISHED_KEPT = 100_000  # ground-truth records kept for /sim/requests (oldest dropped first)
ITERATIONS_KEPT = 1000  # trtllm iteration stats waiting to be read


class Channel:
    """Tokens of one request waiting to be written by its handler."""

    __slots__ = ("arrived_s", "done", "event", "first_write_s", "generated", "last_token_s",
                 "last_write_s", "pending", "prompt_tokens", "received_s")

    def __init__(self, arrived_s: float, prompt_tokens: int) -> None:
        self.arrived_s = arrived_s
        self.received_s = arrived_s  # set earlier by the HTTP handler (before body parsing)
        self.prompt_tokens = prompt_tokens
        self.pending = 0
        self.generated = 0
        self.done = False
        self.last_token_s: float | None = None
        # Engine times at which token events were actually written to the socket (streams):
        # the scheduler's emission times plus event-loop lag, what a client really sees.
        self.first_write_s: float | None = None
        self.last_write_s: float | None = None
        self.event = asyncio.Event()

    def note_write(self, now_s: float) -> None:
        if self.first_write_s is None:
            self.first_write_s = now_s
        self.last_write_s = now_s


class SimRuntime:
    """Drives one EngineCore in real (scaled) time; see module docstring."""

    def __init__(self, core: EngineCore, time_scale: float = 1.0,
                 clock: Callable[[], float] | None = None) -> None:
        self.core = core
        self.time_scale = time_scale
        self._clock = clock or time.monotonic
        self._start = self._clock() - core.now_s / time_scale
        self.start_unix_s = time.time() - core.now_s / time_scale
        self.channels: dict[str, Channel] = {}
        self.finished: OrderedDict[str, RequestTruth] = OrderedDict()
        self.written: OrderedDict[str, Channel] = OrderedDict()  # for wire timing
        self.iterations: list[IterationStat] = []
        self.stats = ServingStats()
        self.served = 0
        self.aborted = 0
        self._kick = asyncio.Event()

    def engine_now(self) -> float:
        return (self._clock() - self._start) * self.time_scale

    def wall_delay_s(self, engine_s: float) -> float:
        """Wall-clock seconds from now until the engine clock reads `engine_s` (>= 0)."""
        return max(0.0, (engine_s - self.engine_now()) / self.time_scale)

    # -- requests -------------------------------------------------------------------------

    def submit(self, request_id: str, prompt_tokens: int, max_tokens: int) -> Channel:
        if request_id in self.channels:
            raise DuplicateRequestError(f"request id {request_id!r} is already in flight")
        now_s = self.engine_now()
        self.core.submit(request_id, prompt_tokens, max_tokens, now_s)
        channel = self.channels[request_id] = Channel(now_s, prompt_tokens)
        self.written[request_id] = channel
        while len(self.written) > FINISHED_KEPT:
            self.written.popitem(last=False)
        self._kick.set()
        return channel

    def cancel(self, request_id: str) -> None:
        if self.channels.pop(request_id, None) is None:
            return
        self.core.cancel(request_id, self.engine_now())
        self.aborted += 1
        self._collect()
        self._kick.set()

    # -- driving --------------------------------------------------------------------------

    def sync(self) -> None:
        """Bring the core up to now and hand out what it produced (safe from any handler)."""
        self._deliver(self.core.advance(self.engine_now()))
        self._kick.set()

    async def run(self) -> None:
        """The driver loop; runs until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            self._kick.clear()
            self._deliver(self.core.advance(self.engine_now()))
            wake = self.core.next_wakeup_s()
            timer = None
            if wake is not None:
                timer = loop.call_later(self.wall_delay_s(wake), self._kick.set)
            try:
                await self._kick.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    def _deliver(self, emissions: list[Emission]) -> None:
        channels = self.channels
        for em in emissions:
            ch = channels.get(em.request_id)
            if ch is None:
                continue
            self.stats.observe(em, ch.arrived_s, ch.prompt_tokens, ch.last_token_s)
            ch.pending += em.tokens
            ch.generated += em.tokens
            ch.last_token_s = em.time_s
            if em.done:
                ch.done = True
                del channels[em.request_id]
                self.served += 1
            ch.event.set()
        self._collect()

    def _collect(self) -> None:
        for truth in self.core.take_finished():
            self.finished[truth.request_id] = truth
            self.finished.move_to_end(truth.request_id)
        while len(self.finished) > FINISHED_KEPT:
            self.finished.popitem(last=False)
        self.iterations.extend(self.core.take_iterations())
        if len(self.iterations) > ITERATIONS_KEPT:
            del self.iterations[: len(self.iterations) - ITERATIONS_KEPT]

    # -- views ----------------------------------------------------------------------------

    def take_iterations(self) -> list[IterationStat]:
        self.sync()
        out, self.iterations = self.iterations, []
        return out

    def truth(self, request_id: str) -> RequestTruth | None:
        self.sync()
        found = self.finished.get(request_id)
        if found is not None:
            return found
        for live in self.core.live_truth():
            if live.request_id == request_id:
                return live
        return None

    def all_truth(self) -> list[RequestTruth]:
        self.sync()
        return [*self.finished.values(), *self.core.live_truth()]

    def wire_timing(self, truth: RequestTruth) -> dict[str, float | None]:
        """TTFT/TPOT as a client sees them: from the HTTP request's arrival at the engine to
        the times token events were written to the socket (streams), engine seconds."""
        ch = self.written.get(truth.request_id)
        if ch is None or ch.first_write_s is None or ch.last_write_s is None:
            return {"wire_ttft_s": None, "wire_tpot_s": None}
        tokens = truth.completion_tokens
        tpot = (ch.last_write_s - ch.first_write_s) / (tokens - 1) if tokens > 1 else None
        return {"wire_ttft_s": ch.first_write_s - ch.received_s, "wire_tpot_s": tpot}

    @property
    def ledger(self) -> EnergyLedger:
        return self.core.ledger
