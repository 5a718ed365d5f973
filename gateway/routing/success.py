"""Each engine's recent success, and routing weighted by it (pure, the clock passed in).

An engine that fails fast (a 429, a 500, a garbage stream, all in a millisecond) looks idle to
every load-based policy, so `least_load` would send it nearly everything. Before the policy
chooses, each candidate stays in the running with probability equal to its recent success
ratio (never below `floor`), so a failing engine gets about `floor` of the traffic whatever
the policy, and an engine that recovers is still tried and earns its share back.

Recent success ratio: successes and failures are counted with exponential decay, each outcome
weighing exp(-age / tau) with tau = window_s / 3 (an outcome `window_s` old weighs 5 %), plus
a tenth of a pseudo-success: ratio = (ok + 0.1) / (ok + failed + 0.1). A busy engine's one
failure weighs against its many recent successes (about 1000 at 100 requests/s: 0.999); an
engine that fails everything drops to the floor within a few failures (0.09 after one, 0.05
after two), not the ~1/n of a whole pseudo-success (n failures, then at the floor only after
1/floor of them, sending it sqrt(2N) of the first N requests). With no recent failure the
ratio is exactly 1 and routing is untouched (no random draw); left alone, a failed engine's
ratio climbs back to 1 as its failures decay, and at the floor it is still tried, so its
successes once it recovers earn its share back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WINDOW_TO_TAU = 3.0  # an outcome window_s old weighs exp(-3), 5 %
_FORGOTTEN = 0.05  # decayed failure weight below which the engine counts as failure-free
PRIOR_OK = 0.1  # pseudo-successes: an engine with no history is at 1, one failure takes it far


@dataclass(slots=True)
class SuccessWindow:
    """Decayed success and failure counts of one engine (state: `record` writes, `ratio` reads)."""

    ok: float = 0.0
    failed: float = 0.0
    at_s: float = 0.0  # monotonic time the counts were last decayed to

    def _decay(self, now_s: float, tau_s: float) -> None:
        if now_s > self.at_s:
            keep = math.exp(-(now_s - self.at_s) / tau_s)
            self.ok *= keep
            self.failed *= keep
            if self.failed < _FORGOTTEN:
                self.failed = 0.0
            self.at_s = now_s

    def record(self, ok: bool, now_s: float, tau_s: float) -> None:
        """One outcome of a real request at `now_s`. Successes count while failure-free too,
        so one failure of a busy engine weighs against its recent successes, not against none."""
        self._decay(now_s, tau_s)
        if ok:
            self.ok += 1.0
        else:
            self.failed += 1.0

    def ratio(self, now_s: float, tau_s: float) -> float:
        """Recent successes over recent outcomes, in (0, 1]; 1 when no failure is recent."""
        if not self.failed:
            return 1.0
        self._decay(now_s, tau_s)
        return (self.ok + PRIOR_OK) / (self.ok + self.failed + PRIOR_OK)

    def failure_percent(self, now_s: float, tau_s: float, volume: float) -> float:
        """Recent failures as a percentage of recent outcomes (decayed, no prior), or 0 while
        those outcomes weigh less than `volume` requests (too few to judge)."""
        self._decay(now_s, tau_s)
        seen = self.ok + self.failed
        return 100.0 * self.failed / seen if seen >= volume else 0.0


def admitted(ratios: Sequence[float], draw: Callable[[], float], floor: float) -> list[int]:
    """Indices of the candidates that stay in the running: each with probability
    max(ratio, floor), one `draw()` in [0, 1) per candidate below 1. When none stays, those
    with the best ratio (a request is never refused for this)."""
    kept = [i for i, r in enumerate(ratios) if r >= 1.0 or draw() < max(r, floor)]
    if kept:
        return kept
    best = max(ratios)
    return [i for i, r in enumerate(ratios) if r == best]
