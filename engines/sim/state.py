"""Plain data shared by the simulated engine cores and the server around them."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from engines.sim.energy import EnergyLedger


class DuplicateRequestError(ValueError):
    """A request id that is still in the engine was submitted again."""


WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"
ABORTED = "aborted"


@dataclass(slots=True)
class SimRequest:
    """Mutable engine-side state of one request (owned by exactly one core)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrived_s: float
    status: str = WAITING
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0
    blocks: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished_s: float | None = None
    preemptions: int = 0

    @property
    def seq_len(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass(frozen=True, slots=True)
class Emission:
    """`tokens` new tokens of a request at engine time `time_s`; `done` when it is over."""

    request_id: str
    tokens: int
    time_s: float
    done: bool
    first: bool


@dataclass(frozen=True, slots=True)
class IterationStat:
    """One engine iteration, as trtllm-serve reports it."""

    iteration: int
    end_s: float
    latency_s: float
    active: int
    queued: int
    completed: int
    max_blocks: int
    used_blocks: int
    tokens_per_block: int


@dataclass(frozen=True, slots=True)
class RequestTruth:
    """Ground truth of one request: tokens, energy split and engine-clock timing."""

    request_id: str
    status: str
    prompt_tokens: int
    completion_tokens: int
    energy_j: float
    prefill_energy_j: float
    decode_energy_j: float
    static_energy_j: float
    arrived_s: float
    first_token_s: float | None
    finished_s: float | None
    preemptions: int
    shapley_energy_j: float = 0.0  # the Shapley view (energy_j is the residency view)
    shapley_stderr_j: float = 0.0  # standard error of shapley_energy_j (0 where exact)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrived_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_token_s is None or self.finished_s is None or self.completion_tokens < 2:
            return None
        return (self.finished_s - self.first_token_s) / (self.completion_tokens - 1)

    def to_json(self) -> dict[str, object]:
        return {
            "request_id": self.request_id,
            "status": self.status,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "energy_j": self.energy_j,
            "truth_residency_j": self.energy_j,
            "truth_shapley_j": self.shapley_energy_j,
            "truth_shapley_stderr_j": self.shapley_stderr_j,
            "prefill_energy_j": self.prefill_energy_j,
            "decode_energy_j": self.decode_energy_j,
            "static_energy_j": self.static_energy_j,
            "arrived": self.arrived_s,
            "first_token": self.first_token_s,
            "finished": self.finished_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "preemptions": self.preemptions,
        }


def truth_of(req: SimRequest, ledger: EnergyLedger) -> RequestTruth:
    acct = ledger.account(req.request_id)
    return RequestTruth(
        req.request_id, req.status, req.prompt_tokens, req.generated, acct.energy_j,
        acct.prefill_j, acct.decode_j, acct.static_j, req.arrived_s, req.first_token_s,
        req.finished_s, req.preemptions, acct.shapley_j, math.sqrt(acct.shapley_var_j2),
    )


class CoreRecords:
    """What both engine cores keep for the runtime: finished truths and iteration stats."""

    requests: dict[str, SimRequest]
    ledger: EnergyLedger
    _finished: list[RequestTruth]
    _iterations: deque[IterationStat]

    def take_finished(self) -> list[RequestTruth]:
        out, self._finished = self._finished, []
        return out

    def live_truth(self) -> list[RequestTruth]:
        return [truth_of(req, self.ledger) for req in self.requests.values()]

    def take_iterations(self) -> list[IterationStat]:
        out = list(self._iterations)
        self._iterations.clear()
        return out


class EngineCore(Protocol):
    """A pure, clock-injected engine: the server feeds it engine-clock times."""

    ledger: EnergyLedger
    now_s: float

    def submit(self, request_id: str, prompt_tokens: int, max_tokens: int, now_s: float) -> None:
        """Queue a request arriving at `now_s` (engine clock, >= every time seen so far).
        `max_tokens` 0 is a pooling request (embeddings): its prompt's pass and nothing more;
        it ends with one Emission of 0 tokens (done and first)."""
        ...

    def cancel(self, request_id: str, now_s: float) -> None:
        """Stop a request (client gone); the joules it already used stay charged to it."""
        ...

    def advance(self, now_s: float) -> list[Emission]:
        """Run the engine up to `now_s`; return the tokens produced since the last call."""
        ...

    def next_wakeup_s(self) -> float | None:
        """Engine time of the next thing that will happen, or None when idle."""
        ...

    def counter_j(self, now_s: float) -> float:
        """Cumulative joules (all GPUs) at `now_s`, including the part of a step in flight."""
        ...

    def load(self) -> tuple[int, int, float]:
        """(running, waiting, KV-cache usage fraction)."""
        ...

    def take_finished(self) -> list[RequestTruth]:
        """Ground truth of requests finished or aborted since the last call."""
        ...

    def live_truth(self) -> list[RequestTruth]:
        """Ground truth so far of requests still in the engine."""
        ...

    def take_iterations(self) -> list[IterationStat]:
        """Iteration stats recorded since the last call."""
        ...
