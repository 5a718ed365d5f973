"""Test harness: `async def` tests run on a fresh uvloop event loop (no plugin needed)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import uvloop


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs: dict[str, Any] = {name: pyfuncitem.funcargs[name] for name in names}
    uvloop.run(pyfuncitem.obj(**kwargs))
    return True
