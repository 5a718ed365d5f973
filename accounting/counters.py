"""An engine's energy counters across resets and gateway restarts, and the check that the
ledger charged what they counted (pure).

The ledger's cumulative energy of an engine is, over its GPUs, each raw counter plus an
offset: the energy that counter measured before its resets. A meter's own reset tracker keeps
its offsets in memory only, so a restarted gateway used to read the raw counters afresh, find
them below the ledger's boundary and re-base: the downtime was charged 0 J, at every restart
after the engine's first reset. Here the offsets, and the raw counters last seen, are kept
with the engine's ledger state (`CounterState`, written with every apportioner commit and at a
clean stop), and a restarted gateway continues the same series: the downtime is charged what
the counters grew by, and a counter that restarted meanwhile is a reset like one seen live.

A counter that restarted between two readings (live, or while no gateway ran) counted only
what it spent since its restart; what it spent from the earlier reading to the restart went
unread. That gap is bridged with an estimate, never left at 0 J silently: the engine's idle
power times the time between the readings, less what the restarted counters show (a floor:
an engine busy in the gap spent more; `gap_estimate_j`). The estimate joins the series (an
offset, stored with the others) so the ledger charges the gap, and it is counted in
`estimated_j`, which the energy check reports and alarms on.

The check: `metered_j` adds up the counters' growth reading by reading (over a restart, from
the stored raw counters to the first new ones) apart from the series the apportioner
interpolates and may re-base, and what the ledger apportioned plus what waits to be
apportioned must equal it (`unaccounted_j`).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from engines.meters.base import ResetTracker

log = logging.getLogger("wattgate.accounting")

STEP_WINDOW = 64  # readings over which the largest counter step is kept
DEFAULT_IDLE_W_PER_GPU = 80.0  # 60-120 W per GPU holding a CUDA context (docs/architecture.md, "Sources")


@dataclass(frozen=True, slots=True)
class CounterState:
    """An engine's counters as the apportioner last saw them, stored with its ledger state."""

    seen_s: float  # wall clock of the reading
    raw_j: tuple[float, ...]  # each GPU's counter as read
    offset_j: tuple[float, ...]  # added to each: what it measured before its resets
    resets: int
    metered_j: float | None  # the counters' growth since the check began (None: not begun)


def growth_j(before: Sequence[float], after: Sequence[float]) -> float:
    """What the counters grew by from one reading to the next. A counter below its earlier
    value restarted in between and has counted `after` since; what it spent before the
    restart is unknowable and not invented."""
    return math.fsum(a - b if a >= b else a for b, a in zip(before, after, strict=True))


def gap_estimate_j(floor_w: float | None, gap_s: float, reset_share: float,
                   counted_j: float) -> float:
    """The energy a counter reset hid, as a floor: `floor_w` (the engine's idle power) over
    the `gap_s` between the readings around it, for the `reset_share` of the engine's GPUs
    that restarted, less the `counted_j` those counters show since. 0 where no power is
    known."""
    if floor_w is None or gap_s <= 0.0:
        return 0.0
    return max(0.0, floor_w * reset_share * gap_s - counted_j)


def unaccounted_j(metered_j: float, apportioned_j: float, pending_j: float) -> float:
    """Counter growth that no interval holds and none will: metered minus apportioned minus
    what the counter shows past the ledger's boundary (carried forward). Zero but for float
    rounding while no joule is lost; positive by the joules lost."""
    return metered_j - apportioned_j - pending_j


def begin_check(counters: EngineCounters, apportioned_j: float | None, pending_j: float
                ) -> float:
    """The apportioned sum the check goes on from, for an engine whose apportioning starts
    here with `pending_j` joules shown past its boundary. Where the ledger's stored sum and
    this process's count of the counters continue one another they are kept; otherwise (a new
    engine, a ledger from before schema v6, a replica that found no stored counters) the check
    begins now: the joules already apportioned and pending count as metered."""
    if apportioned_j is not None and counters.metered_j is not None:
        return apportioned_j
    base_j = 0.0 if apportioned_j is None else apportioned_j
    counters.begin_check(base_j + pending_j)
    return base_j


class EngineCounters:
    """One engine's raw counters -> its cumulative energy in the ledger's series."""

    __slots__ = ("_resume", "_steps", "_tracker", "estimated_j", "gaps", "metered_j", "resumed",
                 "seen_s")

    def __init__(self, resume: CounterState | None = None):
        self._resume = resume
        self._tracker: ResetTracker | None = None
        self._steps: deque[float] = deque(maxlen=STEP_WINDOW)
        self.seen_s: float | None = None
        self.metered_j: float | None = None
        self.resumed = False  # the series continues one stored in the ledger
        self.estimated_j = 0.0  # joules of reset gaps bridged by an estimate (this process)
        self.gaps = 0  # counter resets whose gap was estimated, or could not be


    def update(self, time_s: float, raw_j: Sequence[float], *,
               floor_w: float | None = None) -> float | None:
        """The engine's cumulative joules at `time_s`; None for a reading at or before the
        last one (stale or repeated: the energy track ignores those too). `floor_w`: the
        engine's idle power, for the estimate of a reset's gap."""
        if self.seen_s is not None and time_s <= self.seen_s:
            return None
        tracker = self._tracker
        since = self.seen_s
        if tracker is None:
            tracker = self._tracker = self._start(raw_j)
            # Over a restart the counters grew from the raw values stored to these.
            before = self._resume.raw_j if self._resume and self.resumed else None
            since = self._resume.seen_s if self._resume and self.resumed else None
        else:
            before = tracker.last_raw_j
        values = math.fsum(tracker.update(raw_j))
        if before is not None:
            step = growth_j(before, raw_j)
            if since is not None:
                bridged = self._bridge(tracker, before, raw_j, time_s - since, floor_w)
                step += bridged
                values += bridged
            self._steps.append(step)
            if self.metered_j is not None:
                self.metered_j += step
        self.seen_s = time_s
        return values

    def _bridge(self, tracker: ResetTracker, before: Sequence[float], raw_j: Sequence[float],
                gap_s: float, floor_w: float | None) -> float:
        """Estimate what the counters that restarted since `before` spent unread, add it to
        their offsets and count it; returns the joules added."""
        reset = [i for i, (b, a) in enumerate(zip(before, raw_j, strict=True)) if a < b]
        if not reset:
            return 0.0
        counted_j = math.fsum(raw_j[i] for i in reset)
        est_j = gap_estimate_j(floor_w, gap_s, len(reset) / len(raw_j), counted_j)
        for i in reset:
            tracker.bridge(i, est_j / len(reset))
        self.estimated_j += est_j
        self.gaps += 1
        log.warning("energy counters of %d GPU(s) restarted within %.1f s unread: the energy "
                    "from the last reading to the restart is estimated at %.1f J (%s)",
                    len(reset), gap_s, est_j,
                    f"idle power {floor_w:.0f} W" if floor_w is not None
                    else "no idle power known: 0 J, the gap is unknown")
        return est_j

    def _resume_fits(self, raw_j: Sequence[float]) -> bool:
        return self._resume is not None and len(self._resume.raw_j) == len(raw_j)

    def _start(self, raw_j: Sequence[float]) -> ResetTracker:
        resume = self._resume
        if resume is None:
            return ResetTracker(len(raw_j))
        if not self._resume_fits(raw_j):
            log.warning("energy counters: %d stored for this engine, %d read now; the growth "
                        "over the gateway's downtime is unknown", len(resume.raw_j), len(raw_j))
            return ResetTracker(len(raw_j))
        self.metered_j = resume.metered_j
        self.resumed = True
        return ResetTracker.resumed(resume.raw_j, resume.offset_j, resume.resets)

    @property
    def resets(self) -> int:
        return 0 if self._tracker is None else self._tracker.resets

    @property
    def step_j(self) -> float:
        """The largest growth between two consecutive readings lately: how far apart a span's
        ends can be read, the check's tolerance."""
        return max(self._steps, default=0.0)

    def begin_check(self, metered_j: float) -> None:
        """Start counting the check from here, at `metered_j` (what the ledger accounts for
        now: apportioned plus pending), where no stored count continues."""
        self.metered_j = metered_j

    def state(self) -> CounterState | None:
        """What to store with the engine's ledger state (None before the first reading)."""
        tracker = self._tracker
        raw = None if tracker is None else tracker.last_raw_j
        if tracker is None or raw is None or self.seen_s is None:
            return None
        return CounterState(self.seen_s, raw, tracker.offset_j, tracker.resets, self.metered_j)
