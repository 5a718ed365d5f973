"""A gateway process's background threads yield the core to its event loop.

The ledger writer, the request journal and the access log run on threads of the serving
process. Where a thread shares a core with the event loop (a pinned or a busy host), the
scheduler gives both equal turns, so a request that wakes the loop while a thread is
committing a batch waits for the thread's turn to end (milliseconds: it tripled the p99 at
c=1 with accounting on). Linux keeps a nice value per thread: each background thread raises
its own at start, and the loop's requests go first.
"""

from __future__ import annotations

import contextlib
import os
import threading

BACKGROUND_NICE = 10  # added to a background thread's nice value


def lower_this_thread(nice: int = BACKGROUND_NICE) -> None:
    """Raise the calling thread's nice value by `nice` (only this thread's, on Linux; a
    platform without per-thread priorities, or a refusal, leaves it as it is)."""
    with contextlib.suppress(OSError, AttributeError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
