"""Attempt deadlines on one lazy timer behave as asyncio.timeout does."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.pipeline.deadline import Deadlines

pytestmark = pytest.mark.timeout(30)


async def _guarded(deadlines: Deadlines, delay_s: float, work_s: float) -> str:
    """Sleep `work_s` under a deadline of `delay_s`: "done" or "timeout"."""
    deadline = deadlines.arm(delay_s)
    try:
        await asyncio.sleep(work_s)
    except asyncio.CancelledError:
        if not deadline.expired():
            raise
        return "timeout"
    finally:
        deadline.disarm()
    return "done"


async def test_each_task_times_out_at_its_own_deadline_on_one_timer() -> None:
    deadlines = Deadlines()
    start = time.monotonic()
    # a later deadline armed first, then earlier ones: the timer is re-armed for them
    tasks = [asyncio.create_task(_guarded(deadlines, d, w))
             for d, w in ((0.4, 5.0), (0.1, 5.0), (5.0, 0.05), (0.2, 5.0))]
    results = await asyncio.gather(*tasks)
    assert results == ["timeout", "timeout", "done", "timeout"]
    assert 0.35 < time.monotonic() - start < 2.0
    assert not deadlines.entries  # every entry left with its attempt


async def test_a_deadline_that_is_not_reached_leaves_the_task_alone() -> None:
    deadlines = Deadlines()
    assert await _guarded(deadlines, 0.2, 0.0) == "done"
    await asyncio.sleep(0.3)  # the timer fires with nothing due and arms nothing
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    assert await _guarded(deadlines, 0.1, 0.3) == "timeout"  # reused after it went idle


async def test_another_cancellation_is_not_turned_into_a_timeout() -> None:
    deadlines = Deadlines()
    task = asyncio.create_task(_guarded(deadlines, 5.0, 5.0))
    await asyncio.sleep(0.05)
    task.cancel()  # the client went away: the cancellation must reach the caller
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not deadlines.entries


async def test_a_cancellation_racing_the_deadline_still_cancels() -> None:
    deadlines = Deadlines()

    async def raced() -> str:
        deadline = deadlines.arm(0.05)
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            # the deadline fired, and someone else cancelled too: theirs wins, as with
            # asyncio.timeout
            if not deadline.expired():
                raise
            return "timeout"
        finally:
            deadline.disarm()
        return "done"

    task = asyncio.create_task(raced())
    await asyncio.sleep(0.2)  # the deadline's cancel is delivered first...
    assert task.done() and task.result() == "timeout"

    task = asyncio.create_task(raced())
    await asyncio.sleep(0)  # armed, and waiting
    (deadline,) = deadlines.entries
    deadline.fire()  # the deadline fires...
    task.cancel()  # ...and a second cancel request arrives before the task runs again
    with pytest.raises(asyncio.CancelledError):
        await task
