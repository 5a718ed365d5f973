"""core.tasks.cancel_and_wait: the task has ended when it returns, its cleanup has run."""

from __future__ import annotations

import asyncio

import pytest

from core.tasks import cancel_and_wait


async def test_the_task_has_run_its_cleanup_when_cancel_and_wait_returns() -> None:
    cleaned: list[str] = []

    async def holder() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits
            cleaned.append("released")

    task = asyncio.get_running_loop().create_task(holder())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled() and cleaned == ["released"]


async def test_none_and_a_finished_task_are_nothing_to_do() -> None:
    await cancel_and_wait(None)
    done = asyncio.get_running_loop().create_task(asyncio.sleep(0))
    await done
    await cancel_and_wait(done)
    assert done.done() and not done.cancelled()


async def test_a_task_that_fails_while_stopping_raises_its_error() -> None:
    async def broken() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("cleanup failed")

    task = asyncio.get_running_loop().create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)
