"""Ending a background task: the one way the processes stop what they started."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel `task` (None: nothing to do) and wait until it has ended, so that what it holds
    is released before the caller goes on; its CancelledError is the expected end, not an
    error."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
