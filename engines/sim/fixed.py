"""Fixed-timing engine: first token exactly `ttft_s` after arrival, then one every `itl_s`.

Used by gateway tests that check measured TTFT/TPOT against known delays. Requests do not
interact; energy still follows the ledger's rules: idle power x time shared by resident
requests, and a constant dynamic power per resident request (the deployment's batch-1
decode power), capped so that the board never exceeds TDP.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from engines.sim.catalog import KV_BLOCK_TOKENS, Deployment
from engines.sim.energy import EnergyLedger
from engines.sim.perf import DECODE, PREFILL, KernelProfile, SeqWork, step_cost
from engines.sim.power import idle_power_w, step_energy
from engines.sim.state import (
    ABORTED,
    FINISHED,
    RUNNING,
    CoreRecords,
    DuplicateRequestError,
    Emission,
    IterationStat,
    RequestTruth,
    SimRequest,
    truth_of,
)


class FixedTimingCore(CoreRecords):
    """Deterministic per-request timing (see module docstring)."""

    def __init__(self, deployment: Deployment, profile: KernelProfile, *, ttft_s: float,
                 itl_s: float, start_s: float = 0.0, ledger: EnergyLedger | None = None) -> None:
        if ttft_s < 0 or itl_s < 0:
            raise ValueError("fixed TTFT and ITL must be >= 0")
        self.deployment = deployment
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.ledger = ledger or EnergyLedger(deployment.tp)
        self.now_s = start_s
        self.idle_w = idle_power_w(deployment)
        one = step_energy(deployment, profile, step_cost(deployment, profile, [SeqWork(1, 512, DECODE)]))
        self.per_request_dynamic_w = one.dynamic_w
        self.max_dynamic_w = (deployment.gpu.tdp_w - deployment.gpu.idle_w) * deployment.tp
        self.requests: dict[str, SimRequest] = {}
        self._due: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._outbox: list[Emission] = []
        self._finished: list[RequestTruth] = []
        self._iterations: deque[IterationStat] = deque(maxlen=1000)
        self.iterations = 0
        self.completed = 0

    def submit(self, request_id: str, prompt_tokens: int, max_tokens: int, now_s: float) -> None:
        if request_id in self.requests:
            raise DuplicateRequestError(f"request id {request_id!r} is already in the engine")
        self._run_until(now_s)
        req = SimRequest(request_id, max(1, prompt_tokens), max(0, max_tokens), now_s, RUNNING)
        req.computed = req.prompt_tokens
        self.requests[request_id] = req
        self.ledger.account(request_id)
        heapq.heappush(self._due, (now_s + self.ttft_s, next(self._seq), request_id))

    def cancel(self, request_id: str, now_s: float) -> None:
        self._run_until(now_s)
        req = self.requests.get(request_id)
        if req is None:
            return
        req.status = ABORTED
        req.finished_s = now_s
        self._retire(req)

    def advance(self, now_s: float) -> list[Emission]:
        self._run_until(now_s)
        out, self._outbox = self._outbox, []
        return out

    def next_wakeup_s(self) -> float | None:
        while self._due and self._due[0][2] not in self.requests:
            heapq.heappop(self._due)  # cancelled
        return self._due[0][0] if self._due else None

    def counter_j(self, now_s: float) -> float:
        return self.ledger.counter_j + self._power_w() * max(0.0, now_s - self.now_s)

    def _power_w(self) -> float:
        n = len(self.requests)
        return self.idle_w + min(self.per_request_dynamic_w * n, self.max_dynamic_w)

    def _accrue(self, until_s: float) -> None:
        duration_s = until_s - self.now_s
        if duration_s <= 0.0:
            return
        residents = list(self.requests)
        if not residents:
            self.ledger.accrue_idle(duration_s, self.idle_w)
        else:
            dyn_w = min(self.per_request_dynamic_w * len(residents), self.max_dynamic_w)
            each_j = dyn_w * duration_s / len(residents)
            dynamic = [
                (rid, DECODE if self.requests[rid].generated else PREFILL, each_j)
                for rid in residents
            ]
            self.ledger.accrue(duration_s, self.idle_w, residents, dynamic)
        self.now_s = until_s

    def _run_until(self, now_s: float) -> None:
        while (due := self.next_wakeup_s()) is not None and due <= now_s:
            _, _, rid = heapq.heappop(self._due)
            self._accrue(max(due, self.now_s))
            self._emit(self.requests[rid])
        self._accrue(max(now_s, self.now_s))

    def _emit(self, req: SimRequest) -> None:
        t = self.now_s
        if req.max_tokens == 0:  # pooling: done `ttft_s` after arrival, no token
            done = first = True
            self._outbox.append(Emission(req.request_id, 0, t, done, first))
        else:
            req.generated += 1
            first = req.first_token_s is None
            if first:
                req.first_token_s = t
            req.last_token_s = t
            done = req.generated >= req.max_tokens
            self._outbox.append(Emission(req.request_id, 1, t, done, first))
        self.iterations += 1
        if done:
            req.status = FINISHED
            req.finished_s = t
            self.completed += 1
            self._retire(req)
        else:
            heapq.heappush(self._due, (t + self.itl_s, next(self._seq), req.request_id))
        blocks = self.deployment.kv_blocks
        self._iterations.append(IterationStat(self.iterations, t, 0.0, len(self.requests), 0,
                                              self.completed, blocks, 0, KV_BLOCK_TOKENS))

    def _retire(self, req: SimRequest) -> None:
        self.requests.pop(req.request_id, None)
        self._finished.append(truth_of(req, self.ledger))
        self.ledger.forget(req.request_id)

    def load(self) -> tuple[int, int, float]:
        return len(self.requests), 0, 0.0
