"""The accounting child's CPU priority against the gateway it serves, on a core they share.

The child runs in the idle scheduling class while it keeps up: the kernel then hands the core
to the gateway the moment one of its requests wakes it. In the normal class, even at nice
+10, an EEVDF kernel (Linux 6.6 on) first lets the running child finish its protected time
slice, and the gateway's p99 at c=1 grew by 2-3 ms with accounting against 0.2-0.5 ms in the
idle class (docs/performance.md). Where the core has no idle time, the idle class gets almost
none and records would pile up, so a child that falls behind (`lag`) returns to the normal
class, at its nice value, until it has caught up.

Leaving the idle class needs CAP_SYS_NICE or an RLIMIT_NICE that allows the nice value
(`ulimit -e 10` for nice +10). Where neither is granted the child would be stuck there, so it
stays in the normal class instead (`may_leave_idle`, tried on a thread of its own first).

The child stays in the gateway's session: the kernel's autogroup (one scheduling group per
session) would otherwise put the two in separate groups, each with an equal share of the core
whatever the class or nice value inside it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("wattgate.accounting")

CAUGHT_UP_S = 0.5  # back to the idle class once records are written within this


def _threads() -> list[int]:
    try:
        return [int(t.name) for t in Path("/proc/self/task").iterdir()]
    except OSError:
        return [0]


def may_leave_idle() -> bool:
    """Whether this process may return a thread from the idle class to the normal one at its
    nice value: tried on a short-lived thread, which may be left in the idle class."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    result: list[bool] = []
    tids: list[int] = []

    def probe() -> None:
        tid = threading.get_native_id()
        tids.append(tid)
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            result.append(False)
        else:
            result.append(True)

    thread = threading.Thread(target=probe, name="wattgate-priority-probe")
    thread.start()
    thread.join()
    # The thread's task outlives join() briefly: wait for it to go, so that no thread of this
    # process is left in the idle class when this returns
    deadline = time.monotonic() + 1.0
    while tids and Path(f"/proc/self/task/{tids[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    return result == [True]


class Background:
    """Switches every thread of this process between the idle and the normal class."""

    def __init__(self, enabled: bool, *, behind_s: float):
        """`behind_s`: how long past a flush period the oldest record not yet written may
        wait before the process leaves the idle class (`accounting.behind_s`)."""
        self.enabled = enabled
        self.behind_s = behind_s
        # below behind_s, so a steady lag between the two does not switch at every report
        self.caught_up_s = min(CAUGHT_UP_S, behind_s / 2)
        self.idle = False
        self.switches = 0

    def start(self) -> None:
        if not self.enabled:
            return
        if not may_leave_idle():
            log.info("the accounting child stays in the normal scheduling class: it could not "
                     "leave the idle class when behind (needs CAP_SYS_NICE or RLIMIT_NICE)")
            self.enabled = False
            return
        self._set(True)

    def lag(self, lag_s: float) -> None:
        """How long the oldest record not yet written has waited past a flush period."""
        if not self.enabled:
            return
        if self.idle and lag_s > self.behind_s:
            log.warning("accounting child %.1f s behind its gateway: leaving the idle "
                        "scheduling class until it catches up", lag_s)
            self._set(False)
        elif not self.idle and lag_s < self.caught_up_s:
            self._set(True)

    def _set(self, idle: bool) -> None:
        if not self._set_all(os.SCHED_IDLE if idle else os.SCHED_OTHER):
            # Some thread refused: every thread back to the normal class, and no more tries
            self._set_all(os.SCHED_OTHER)
            self.enabled = False
            self.idle = False
            return
        self.idle = idle
        self.switches += 1

    @staticmethod
    def _set_all(policy: int) -> bool:
        """Every thread to `policy` (threads started later inherit it); False if one refused
        (each of the others is set all the same)."""
        ok = True
        for tid in _threads():
            try:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            except OSError as exc:
                if not Path(f"/proc/self/task/{tid}").exists():
                    continue  # a thread that just ended
                log.warning("cannot set the accounting child's scheduling class: %s", exc)
                ok = False
        return ok
