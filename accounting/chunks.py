"""Long off-path passes in slices, with the event loop served between two slices."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

T = TypeVar("T")


async def in_chunks(items: Sequence[T], size: int) -> AsyncIterator[Sequence[T]]:
    """`items` in slices of `size`, yielding to the event loop between two slices (not before
    the first), so requests keep flowing while a burst of accounting work is processed."""
    for i in range(0, len(items), size):
        if i:
            await asyncio.sleep(0)
        yield items[i:i + size]
