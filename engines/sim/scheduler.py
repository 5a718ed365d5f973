"""Continuous batching in the manner of vLLM's V1 scheduler, as a pure clock-injected core.

Each step: running requests first (one decode token, or the next chunk of a prompt), then
waiting requests while the token budget, the batch limit and the KV cache allow. When a
running request needs a KV block and none is free, the most recently admitted running
request is preempted (recompute: its KV is dropped and it re-enters the front of the
waiting queue). Steps run back to back while there is work; time with nothing resident is
charged to the idle account.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from engines.sim.catalog import KV_BLOCK_TOKENS, Deployment
from engines.sim.energy import EnergyLedger
from engines.sim.game import StepGame
from engines.sim.perf import DECODE, PREFILL, KernelProfile, SeqWork, step_cost
from engines.sim.power import StepEnergy, idle_power_w, step_energy
from engines.sim.shapley import shapley
from engines.sim.state import (
    ABORTED,
    FINISHED,
    RUNNING,
    WAITING,
    CoreRecords,
    DuplicateRequestError,
    Emission,
    IterationStat,
    RequestTruth,
    SimRequest,
    truth_of,
)

DEFAULT_TOKEN_BUDGET = 8192  # vLLM V1 max_num_batched_tokens for online serving
ITERATION_STATS_KEPT = 1000


def blocks_for(tokens: int) -> int:
    return -(-tokens // KV_BLOCK_TOKENS)


@dataclass(frozen=True, slots=True)
class _Step:
    start_s: float
    end_s: float
    seqs: tuple[tuple[SimRequest, int], ...]  # (request, tokens computed this step)
    work: tuple[SeqWork, ...]
    energy: StepEnergy


class BatchingCore(CoreRecords):
    """The continuous-batching engine (see module docstring)."""

    def __init__(self, deployment: Deployment, profile: KernelProfile, *, max_batch: int = 256,
                 token_budget: int = DEFAULT_TOKEN_BUDGET, start_s: float = 0.0,
                 ledger: EnergyLedger | None = None, seed: int = 0) -> None:
        self.deployment = deployment
        self.profile = profile
        self.max_batch = max_batch
        self.token_budget = token_budget
        self.total_blocks = deployment.kv_blocks
        self.free_blocks = self.total_blocks
        self.ledger = ledger or EnergyLedger(deployment.tp)
        self.now_s = start_s
        self.idle_w = idle_power_w(deployment)
        self.game = StepGame.of(deployment, profile)
        self.rng = np.random.default_rng(seed)  # the sampled Shapley shares of big batches
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.requests: dict[str, SimRequest] = {}
        self.iterations = 0
        self.completed = 0
        self._step: _Step | None = None
        self._outbox: list[Emission] = []
        self._finished: list[RequestTruth] = []
        self._iterations: deque[IterationStat] = deque(maxlen=ITERATION_STATS_KEPT)

    # -- inputs ---------------------------------------------------------------------------

    def submit(self, request_id: str, prompt_tokens: int, max_tokens: int, now_s: float) -> None:
        if request_id in self.requests:
            raise DuplicateRequestError(f"request id {request_id!r} is already in the engine")
        if prompt_tokens + max_tokens > self.total_blocks * KV_BLOCK_TOKENS:
            raise ValueError("request does not fit in the KV cache")
        self._run_until(now_s)
        req = SimRequest(request_id, max(1, prompt_tokens), max(0, max_tokens), now_s)
        self.requests[request_id] = req
        self.ledger.account(request_id)
        self.waiting.append(req)
        self._maybe_start()

    def cancel(self, request_id: str, now_s: float) -> None:
        self._run_until(now_s)
        req = self.requests.get(request_id)
        if req is None or req.status in (FINISHED, ABORTED):
            return
        in_step = self._step is not None and any(r is req for r, _ in self._step.seqs)
        if req.status == WAITING:
            self.waiting.remove(req)
        elif not in_step:
            self._release(req)
        # A request in the step in flight is released when that step ends.
        req.status = ABORTED
        req.finished_s = now_s
        if not in_step:
            self._retire(req)

    # -- time -----------------------------------------------------------------------------

    def advance(self, now_s: float) -> list[Emission]:
        self._run_until(now_s)
        out, self._outbox = self._outbox, []
        return out

    def next_wakeup_s(self) -> float | None:
        return None if self._step is None else self._step.end_s

    def counter_j(self, now_s: float) -> float:
        step = self._step
        if step is None:
            return self.ledger.counter_j + self.idle_w * max(0.0, now_s - self.now_s)
        elapsed = min(max(0.0, now_s - step.start_s), step.energy.duration_s)
        return self.ledger.counter_j + step.energy.power_w * elapsed

    def _run_until(self, now_s: float) -> None:
        if now_s < self.now_s:
            now_s = self.now_s  # callers' clocks may jitter backwards by a hair
        while True:
            step = self._step
            if step is None:
                self.ledger.accrue_idle(now_s - self.now_s, self.idle_w)
                self.now_s = now_s
                return
            if step.end_s > now_s:
                return
            self._finish_step(step)
            self.now_s = step.end_s
            self._step = None
            self._maybe_start()

    # -- scheduling -----------------------------------------------------------------------

    def _maybe_start(self) -> None:
        if self._step is not None or not (self.running or self.waiting):
            return
        seqs = self._schedule()
        if not seqs:
            return
        work = [_seq_work(req, n) for req, n in seqs]
        cost = step_cost(self.deployment, self.profile, work)
        energy = step_energy(self.deployment, self.profile, cost)
        self._step = _Step(self.now_s, self.now_s + cost.duration_s, tuple(seqs), tuple(work),
                           energy)

    def _schedule(self) -> list[tuple[SimRequest, int]]:
        budget = self.token_budget
        seqs: list[tuple[SimRequest, int]] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.seq_len - req.computed, budget)
            if not self._grow(req, req.computed + n):
                continue  # req itself was preempted, or a later request made room
            seqs.append((req, n))
            budget -= n
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_batch:
            req = self.waiting[0]
            n = min(req.seq_len - req.computed, budget)
            need = blocks_for(req.computed + n) - req.blocks
            if need > self.free_blocks:
                break
            self.waiting.popleft()
            self.free_blocks -= need
            req.blocks += need
            req.status = RUNNING
            self.running.append(req)
            seqs.append((req, n))
            budget -= n
        return seqs

    def _grow(self, req: SimRequest, tokens: int) -> bool:
        """Give `req` blocks for `tokens`, preempting from the back; False if req was preempted."""
        need = blocks_for(tokens) - req.blocks
        while need > self.free_blocks:
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return False
        self.free_blocks -= max(0, need)
        req.blocks += max(0, need)
        return True

    def _preempt(self, req: SimRequest) -> None:
        self.running.remove(req)
        self.free_blocks += req.blocks
        req.blocks = 0
        req.computed = 0
        req.preemptions += 1
        req.status = WAITING
        self.waiting.appendleft(req)

    def _release(self, req: SimRequest) -> None:
        if req in self.running:
            self.running.remove(req)
        self.free_blocks += req.blocks
        req.blocks = 0

    def _retire(self, req: SimRequest) -> None:
        self.requests.pop(req.request_id, None)
        self._finished.append(truth_of(req, self.ledger))
        self.ledger.forget(req.request_id)

    # -- step completion ------------------------------------------------------------------

    def _finish_step(self, step: _Step) -> None:
        residents = [req.request_id for req, _ in step.seqs]
        dynamic = [
            (req.request_id, w.phase, joules)
            for (req, _), w, joules in zip(step.seqs, step.work, step.energy.seq_dynamic_j,
                                           strict=True)
        ]
        e = step.energy
        split = shapley(self.game, self.game.players(step.work),
                        e.static_w * e.duration_s + math.fsum(e.seq_dynamic_j), self.rng)
        self.ledger.accrue(e.duration_s, e.static_w, residents, dynamic,
                           list(zip(split.shares_j, split.variance_j2, strict=True)))
        self.iterations += 1
        for req, n in step.seqs:
            if req.status == ABORTED:
                self._release(req)
                self._retire(req)
                continue
            req.computed += n
            if req.computed < req.seq_len:
                continue  # mid-prompt chunk: no token yet
            if req.max_tokens == 0:  # pooling: the prompt's pass is the whole request
                self._outbox.append(Emission(req.request_id, 0, step.end_s, True, True))
                self._complete(req, step.end_s)
                continue
            req.generated += 1
            first = req.first_token_s is None
            if first:
                req.first_token_s = step.end_s
            req.last_token_s = step.end_s
            done = req.generated >= req.max_tokens
            self._outbox.append(Emission(req.request_id, 1, step.end_s, done, first))
            if done:
                self._complete(req, step.end_s)
        self._iterations.append(IterationStat(
            self.iterations, step.end_s, step.energy.duration_s, len(self.running),
            len(self.waiting), self.completed, self.total_blocks,
            self.total_blocks - self.free_blocks, KV_BLOCK_TOKENS,
        ))

    def _complete(self, req: SimRequest, end_s: float) -> None:
        req.status = FINISHED
        req.finished_s = end_s
        self.completed += 1
        self._release(req)
        self._retire(req)

    # -- views ----------------------------------------------------------------------------

    def load(self) -> tuple[int, int, float]:
        used = self.total_blocks - self.free_blocks
        return len(self.running), len(self.waiting), used / self.total_blocks if self.total_blocks else 0.0


def _seq_work(req: SimRequest, n: int) -> SeqWork:
    # A one-token step on top of a complete cache after the first token is decode;
    # prompt chunks and recomputation after preemption are prefill.
    is_decode = n == 1 and req.generated > 0 and req.computed == req.seq_len - 1
    return SeqWork(n, req.computed, DECODE if is_decode else PREFILL)
