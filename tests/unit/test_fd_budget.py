"""The connection cap from the file-descriptor limit (gateway/front/fdbudget.py): derived
when unset, never above what the limit holds, an explicit value above it lowered with a
warning that names both."""

from __future__ import annotations

import resource

from gateway.front.fdbudget import (
    DEFAULT_CAP,
    RESERVED_FDS,
    connection_budget,
    max_connections,
    nofile_limit,
)


def test_the_budget_leaves_room_for_each_connections_engine_side_and_the_reserve() -> None:
    assert connection_budget(256, 1024, 1) == 95  # (256 - 64 - 2) // 2
    assert connection_budget(1024, 1024, 1) == 479
    assert connection_budget(1024, 1024, 10) == 470
    # past 2 x max_inflight only max_inflight connections can hold an engine connection
    assert connection_budget(65536, 1024, 1) == 65536 - RESERVED_FDS - 2 - 1024
    assert connection_budget(40, 1024, 1) == 1  # never 0: the one that gets its 503
    for nofile in (128, 256, 1000, 1024, 4096, 10_000, 65536):
        for inflight in (1, 64, 1024):
            conns = connection_budget(nofile, inflight, 3)
            fds = conns + min(conns, inflight) + RESERVED_FDS + 2 * 3
            assert fds <= nofile or conns == 1, (nofile, inflight, conns)


def test_derived_when_unset_and_an_explicit_value_above_the_limit_is_lowered() -> None:
    assert max_connections(0, 256, 1024, 1) == (95, None)
    assert max_connections(0, 1 << 20, 1024, 1) == (DEFAULT_CAP, None)
    assert max_connections(50, 256, 1024, 1) == (50, None)
    cap, warning = max_connections(4096, 1024, 1024, 1)
    assert cap == 479 and warning is not None
    assert "4096" in warning and "1024" in warning and "479" in warning


def test_the_limit_read_is_this_processs_soft_limit() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert nofile_limit() == (soft if soft != resource.RLIM_INFINITY else 1 << 20)
