"""Attempt deadlines: `asyncio.timeout`'s behaviour for many tasks on one lazy loop timer.

`asyncio.timeout` costs several microseconds per use on Python 3.11 (three
`get_running_loop` calls, each a getpid system call, a context object, a timer armed and
cancelled). An attempt needs only "cancel this task at this time, and tell that cancellation
apart from any other". Deadlines
here are entries in a set; one timer is armed at the earliest of them and re-armed when it
fires. An attempt's deadline is its request's arrival plus the same total budget, so a new one
is almost never earlier than the armed one: arming and disarming touch no timer.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

# A timer may fire up to this early (libuv counts milliseconds); a deadline this close is due.
_RESOLUTION_S = 1e-3


class Deadline:
    """One task's deadline. On `CancelledError` the caller asks `expired()` (True: raise
    `TimeoutError` instead); it calls `disarm()` in `finally`."""

    __slots__ = ("_cancelling", "_fired", "_owner", "task", "when")

    def __init__(self, owner: Deadlines, task: asyncio.Task[Any], when: float):
        self._owner = owner
        self.task = task
        self.when = when
        self._fired = False
        # cancellations already requested when it was armed (asyncio.timeout's rule: only one
        # beyond these is ours to turn into a timeout)
        self._cancelling = task.cancelling()

    def fire(self) -> None:
        self._fired = True
        self.task.cancel()

    def expired(self) -> bool:
        """True when this deadline caused the cancellation and no other one is pending;
        False: the caller re-raises the cancellation."""
        if not self._fired:
            return False
        self._fired = False  # its cancel request is withdrawn once
        return self.task.uncancel() <= self._cancelling

    def disarm(self) -> None:
        """The attempt ended: the entry goes; a cancel request it made that nobody consumed
        (the attempt finished between the timer and the task's next step) is withdrawn."""
        self._owner.entries.discard(self)
        if self._fired:
            self._fired = False
            self.task.uncancel()


class Deadlines:
    """The deadlines of one process's attempts, on one loop timer."""

    __slots__ = ("_armed_at", "_handle", "_loop", "entries")

    def __init__(self) -> None:
        self.entries: set[Deadline] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = math.inf

    def arm(self, delay_s: float) -> Deadline:
        """A deadline `delay_s` from now for the running task."""
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if task is None:  # first use, or another loop: asking each time is a getpid call
            loop = self._running_loop()
            task = asyncio.current_task(loop)
        assert loop is not None and task is not None
        deadline = Deadline(self, task, loop.time() + delay_s)
        self.entries.add(deadline)
        if deadline.when < self._armed_at:
            self._arm(loop, deadline.when)
        return deadline

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._handle is not None:
                self._handle.cancel()
            self._loop, self._handle, self._armed_at = loop, None, math.inf
        return loop

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = when
        self._handle = loop.call_at(when, self._fire)

    def _fire(self) -> None:
        """Cancel every task past its deadline; re-arm at the earliest one left."""
        self._handle, self._armed_at = None, math.inf
        loop = self._loop
        assert loop is not None
        due = loop.time() + _RESOLUTION_S
        earliest = math.inf
        for deadline in list(self.entries):
            if deadline.when <= due:
                self.entries.discard(deadline)
                deadline.fire()
            elif deadline.when < earliest:
                earliest = deadline.when
        if earliest < math.inf:
            self._arm(loop, earliest)
