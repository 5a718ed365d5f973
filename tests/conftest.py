"""Test harness: `async def` tests run on a fresh uvloop event loop (no plugin needed).

The loop is closed with the warnings it raises recorded, not raised: uvloop's close warns of
each transport left open (a ResourceWarning) and only then closes it, from a callback that
cannot raise, so with warnings as errors (pyproject's `filterwarnings`) a transport left open
was never closed and the close waited on it forever. Recorded, they are raised after the
close: a test that leaves a connection open fails with the warning; one that failed already
keeps its own error, with a note naming what it left open."""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import Coroutine
from typing import Any

import pytest
import uvloop


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs: dict[str, Any] = {name: pyfuncitem.funcargs[name] for name in names}
    run_on_uvloop(pyfuncitem.obj(**kwargs))
    return True


def run_on_uvloop(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` on a fresh uvloop loop and close the loop, whatever the coroutine left."""
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    try:
        result = runner.run(coro)
    except BaseException as exc:
        for caught in _close(runner):
            exc.add_note(f"and left open: {caught.message}")
        raise
    for caught in _close(runner):
        warnings.warn_explicit(caught.message, caught.category, caught.filename, caught.lineno)
    return result


def _close(runner: asyncio.Runner) -> list[warnings.WarningMessage]:
    """Close the runner and its loop; the warnings the close raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner.close()
    return caught
