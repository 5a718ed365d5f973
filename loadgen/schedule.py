"""The schedule a load client keeps: requests sent at their due instants (open loop) or as
slots free up (closed loop), a bounded end, and no full garbage collection while it runs.

Absolute schedule: request i is due at t0 + intended_s; the dispatcher sleeps until that
instant (re-checking, never early) rather than sleeping a gap, so lateness never accumulates.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any

from loadgen.results import Progress, RequestResult
from loadgen.workload import PlannedRequest

SPIN_S = 0.0015  # below this, wait by yielding to the loop instead of arming a timer
# sends one request: (planned request, its encoded bytes, intended offset) -> its result
Send = Callable[[PlannedRequest, bytes, float], Coroutine[Any, Any, RequestResult]]


async def sleep_until(deadline: float) -> None:
    """Sleep until the monotonic instant `deadline`; never returns early.

    The loop's timers have millisecond granularity, so the last `SPIN_S` is spent yielding to
    the loop (other requests keep being served) rather than in a timer that may wake ~1 ms late.
    """
    while True:
        delay = deadline - time.monotonic()
        if delay <= 0:
            return
        await asyncio.sleep(delay - SPIN_S if delay > SPIN_S else 0)


def _cancelled(req: PlannedRequest, intended_s: float, now_s: float) -> RequestResult:
    return RequestResult(req.index, req.tenant, req.slo_class, intended_s, now_s, None, now_s, (),
                         req.prompt_tokens, 0, "cancelled", 0, "", False, "run deadline passed")


@contextlib.contextmanager
def young_gc_only() -> Iterator[None]:
    """Only young-generation collections while the schedule runs.

    A full collection walks every tracked object (the plan, the encoded requests, the results
    so far) and stops the loop for tens of milliseconds, which shows up as schedule lag. The heap
    at the start is frozen out of collection (O(1); no collection now, which could itself take
    longer than the caller's lead time before t0) and full collections wait for the end of the
    run, which is bounded in count and time; young collections (sub-millisecond) keep running.
    """
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(threshold[0], threshold[1], 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


async def open_loop(send: Send, t0: float, plan: Sequence[PlannedRequest], requests: list[bytes],
                    grace_s: float) -> list[RequestResult]:
    """Each request sent at its due instant; those still out `grace_s` after the last one was
    due are cancelled and recorded as "cancelled"."""
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[RequestResult]] = []
    # Completion is counted as it happens (one C-level callback per task), so the end of the
    # schedule costs nothing: waiting on all tasks at once would first walk every one of them
    # (milliseconds for thousands), delaying the last sends and the reads still arriving.
    outstanding = 0
    dispatched = False
    finished = asyncio.Event()

    def on_done(_: object) -> None:
        nonlocal outstanding
        outstanding -= 1
        if dispatched and outstanding == 0:
            finished.set()

    for req, request in zip(plan, requests, strict=True):
        due = t0 + req.intended_s
        if time.monotonic() < due:
            await sleep_until(due)
        task = loop.create_task(send(req, request, req.intended_s))
        task.add_done_callback(on_done)
        outstanding += 1
        tasks.append(task)
    dispatched = True
    if outstanding == 0:
        finished.set()
    last_due = t0 + (plan[-1].intended_s if plan else 0.0)
    return await _collect(plan, tasks, finished, last_due + grace_s, t0)


async def closed_loop(send: Send, t0: float, plan: Sequence[PlannedRequest],
                      requests: list[bytes], concurrency: int) -> list[RequestResult]:
    """`concurrency` requests in flight, each sent as soon as a slot frees up."""
    results: dict[int, RequestResult] = {}
    it = iter(zip(plan, requests, strict=True))

    async def slot() -> None:
        for req, request in it:
            # Closed loop: a request is intended the moment its slot frees up.
            results[req.index] = await send(req, request, time.monotonic() - t0)

    # Bounded in count by the plan and in time by each request's own total timeout.
    await asyncio.gather(*(slot() for _ in range(concurrency)))
    now = time.monotonic() - t0
    return [results.get(r.index) or _cancelled(r, now, now) for r in plan]


async def _collect(plan: Sequence[PlannedRequest], tasks: list[asyncio.Task[RequestResult]],
                   finished: asyncio.Event, deadline: float, t0: float) -> list[RequestResult]:
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            await finished.wait()
    except TimeoutError:
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
    now = time.monotonic() - t0
    out = []
    for req, task in zip(plan, tasks, strict=True):
        if task.cancelled():
            out.append(_cancelled(req, req.intended_s, now))
        else:
            out.append(task.result())
    return out


async def progress_reporter(progress: Progress, write: Callable[[str], None],
                            interval_s: float = 0.5) -> None:
    """Write one status line every `interval_s` until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        p = progress
        elapsed = time.monotonic() - p.start_s
        width = 30
        frac = p.done / p.planned if p.planned else 0.0
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        write(f"\r[{bar}] {p.done}/{p.planned} done, {p.sent - p.done} in flight, "
              f"{p.done - p.ok} errors, {elapsed:5.1f}s")
