"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.postgres import postgres_server


@pytest.fixture(scope="module")
def pg() -> Iterator[str]:
    """A throwaway PostgreSQL server on 127.0.0.1 for the module's tests: its DSN."""
    with postgres_server() as dsn:
        yield dsn
