"""Test harness: `async def` tests run on a fresh uvloop event loop (no plugin needed).

The loop is closed with the warnings it raises recorded, not raised: uvloop's close warns of
each transport left open (a ResourceWarning) and only then closes it, from a callback that
cannot raise, so with warnings as errors (pyproject's `filterwarnings`) a transport left open
was never closed and the close waited on it forever. Recorded, they are raised after the
close: a test that leaves a connection open fails with the warning; one that failed already
keeps its own error, with a note naming what it left open."""

from __future__ import annotations

import asyncio
import faulthandler
import inspect
import os
import sys
import threading
import warnings
from collections.abc import Coroutine
from typing import Any

import pytest
import uvloop

# pytest-timeout's signal fails one test and the run goes on, but a signal cannot end a wait
# inside C code (a loop polling a socket nobody closes); past BACKSTOP x the test's timeout
# the run ends with every thread's stack, rather than waiting for CI's own limit.
BACKSTOP = 3


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    marker = item.get_closest_marker("timeout")
    given = item.config.getoption("timeout", default=None)
    timeout = float(marker.args[0]) if marker and marker.args else float(
        given if given is not None else item.config.getini("timeout") or 0)
    timer = None
    if timeout > 0:
        timer = threading.Timer(BACKSTOP * timeout, _end_run, (item, BACKSTOP * timeout))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


def _end_run(item: pytest.Item, after_s: float) -> None:
    """Print every thread's stack where the run's log shows it, and end the run."""
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    sys.stderr.write(f"\n{item.nodeid} still running after {after_s:g} s "
                     f"({BACKSTOP}x its timeout): ending the run\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(all_threads=True)
    os._exit(1)


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
