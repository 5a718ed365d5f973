"""The accounting child's CPU priority against the gateway it serves, on a core they share.

The child runs in the idle scheduling class while it keeps up: the kernel then hands the core
to the gateway the moment one of its requests wakes it (a niced process in the normal class
may first run out its time slice, which on an EEVDF kernel is milliseconds: that was the
gateway's p99 at c=1 with accounting). Where the gateway leaves the core no idle time, the
idle class would get almost none and the records would pile up, so a child that falls behind
(`behind`) returns to the normal class, at its nice value, until it has caught up.

The child stays in the gateway's session: the kernel's autogroup (one scheduling group per
session) would otherwise put the two in separate groups, each with an equal share of the core
whatever the nice value or class inside it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("wattgate.accounting")

BEHIND_S = 2.0  # records unwritten this long past a flush period: the normal class
CAUGHT_UP_S = 0.5  # and back to the idle class once they are written within this


def _threads() -> list[int]:
    try:
        return [int(t.name) for t in Path("/proc/self/task").iterdir()]
    except OSError:
        return [0]


class Background:
    """Switches every thread of this process between the idle and the normal class."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and hasattr(os, "SCHED_IDLE")
        self.idle = False
        self.switches = 0

    def start(self) -> None:
        if self.enabled:
            self._set(True)

    def lag(self, lag_s: float) -> None:
        """How long the oldest record not yet written has waited past a flush period."""
        if not self.enabled:
            return
        if self.idle and lag_s > BEHIND_S:
            log.warning("accounting child %.1f s behind its gateway: leaving the idle "
                        "scheduling class until it catches up", lag_s)
            self._set(False)
        elif not self.idle and lag_s < CAUGHT_UP_S:
            self._set(True)

    def _set(self, idle: bool) -> None:
        policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
        for tid in _threads():  # threads started later inherit the class
            try:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            except OSError as exc:  # a thread that just ended; or a kernel without the class
                if tid == 0 or not Path(f"/proc/self/task/{tid}").exists():
                    continue
                log.warning("cannot set the accounting child's scheduling class: %s", exc)
                self.enabled = False
                return
        self.idle = idle
        self.switches += 1
