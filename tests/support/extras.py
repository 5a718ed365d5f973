"""What a test does when an optional component (vLLM, GuideLLM, httpx, PostgreSQL, Chromium,
promtool) is absent: skip with a one-line reason, or fail where the run requires the extras.

`make test` on a fresh clone installs none of them, so there they skip. `.ci/run` runs that
`make test` first, then installs the extras and runs their suites with
`WATTGATE_REQUIRE_EXTRAS=1`, where a missing one fails instead: CI never skips them silently.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType
from typing import NoReturn

import pytest

REQUIRE_ENV = "WATTGATE_REQUIRE_EXTRAS"


def extras_required() -> bool:
    """The run must have every optional component (`WATTGATE_REQUIRE_EXTRAS=1`)."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes")


def missing(reason: str, *, module_level: bool = False) -> NoReturn:
    """Skip for `reason`, or fail where the extras are required."""
    if extras_required():
        pytest.fail(f"{REQUIRE_ENV}=1 and {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def require_module(name: str, hint: str) -> ModuleType:
    """Import an optional module for a whole test module, or skip (fail) it with `hint`."""
    if importlib.util.find_spec(name) is None:
        missing(f"{name} is not installed; {hint}", module_level=True)
    return importlib.import_module(name)
