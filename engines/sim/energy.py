"""The simulated energy counter and its ground truth: every joule lands on a request or idle.

The counter is what a hardware meter would read (cumulative joules per GPU, monotonic). The
ground truth is the simulator's own split of the same joules, in two views, so that an
apportioner fed by the counter can be checked against it:

- Shapley (`shapley_j`): each step's energy split by the Shapley value of the step's cost
  over the sequences in it (engines/sim/shapley.py); the reference the bill follows.
- residency (`energy_j` = static + prefill + decode): a step's static power shared equally
  by the sequences in it, its dynamic energy by the causal split of power.py.

Time with no step running goes to the idle account in both. Invariant, in each view: the sum
of all request energies plus the idle account equals the counter's growth (up to float
rounding).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engines.sim.perf import PREFILL


@dataclass(slots=True)
class RequestEnergy:
    """Joules charged to one request so far."""

    static_j: float = 0.0  # its share of idle/static power while resident
    prefill_j: float = 0.0  # dynamic energy of its prompt (and recomputation) work
    decode_j: float = 0.0  # dynamic energy of its generated tokens
    shapley_j: float = 0.0  # the sum of its Shapley shares of the steps it was in
    shapley_var_j2: float = 0.0  # variance of that sum where a share was sampled

    @property
    def energy_j(self) -> float:
        return self.static_j + self.prefill_j + self.decode_j


class EnergyLedger:
    """Cumulative counter over `gpus` identical TP ranks plus the per-request split."""

    def __init__(self, gpus: int, start_j: float = 0.0) -> None:
        self.gpus = gpus
        self.counter_j = start_j  # all GPUs together
        self.start_j = start_j
        self.idle_j = 0.0
        self.charged_j = 0.0  # running sum of everything charged to requests (residency)
        self.shapley_charged_j = 0.0  # ... in the Shapley view
        self.requests: dict[str, RequestEnergy] = {}

    def account(self, request_id: str) -> RequestEnergy:
        acct = self.requests.get(request_id)
        if acct is None:
            acct = self.requests[request_id] = RequestEnergy()
        return acct

    def forget(self, request_id: str) -> None:
        """Drop a finished request's account (its joules stay in `charged_j`)."""
        self.requests.pop(request_id, None)

    def accrue_idle(self, duration_s: float, power_w: float) -> None:
        """No request resident: the whole interval goes to the idle account."""
        if duration_s <= 0.0:
            return
        energy_j = power_w * duration_s
        self.idle_j += energy_j
        self.counter_j += energy_j

    def accrue(self, duration_s: float, static_w: float, residents: Sequence[str],
               dynamic: Iterable[tuple[str, str, float]],
               shapley: Sequence[tuple[float, float]] | None = None) -> None:
        """One interval: static power shared equally by `residents` (same residency time),
        each (request_id, phase, joules) of `dynamic` charged to its request. `shapley` is
        each resident's (Shapley share, its variance), summing to the interval's energy;
        without it (requests that do not share a batch) each resident's Shapley share is its
        residency share."""
        dynamic = list(dynamic)
        if duration_s < 0.0:
            raise ValueError(f"negative interval {duration_s}")
        static_j = static_w * duration_s
        total_j = 0.0
        if residents:
            share_j = static_j / len(residents)
            for rid in residents:
                self.account(rid).static_j += share_j
                total_j += share_j
        else:
            self.idle_j += static_j
        for rid, phase, energy_j in dynamic:
            acct = self.account(rid)
            if phase == PREFILL:
                acct.prefill_j += energy_j
            else:
                acct.decode_j += energy_j
            total_j += energy_j
        self.charged_j += total_j
        self.counter_j += total_j + (0.0 if residents else static_j)
        if not residents:
            return
        if shapley is None:
            own = dict.fromkeys(residents, static_j / len(residents))
            for rid, _, energy_j in dynamic:
                own[rid] = own.get(rid, 0.0) + energy_j
            shapley = [(own.pop(rid, 0.0), 0.0) for rid in residents]
        for rid, (share_j, var_j2) in zip(residents, shapley, strict=True):
            acct = self.account(rid)
            acct.shapley_j += share_j
            acct.shapley_var_j2 += var_j2
            self.shapley_charged_j += share_j

    def gpu_energy_j(self, extra_j: float = 0.0) -> list[float]:
        """Per-GPU cumulative joules (TP ranks do identical work, so an even split)."""
        per_gpu = (self.counter_j + extra_j) / self.gpus
        return [per_gpu] * self.gpus
