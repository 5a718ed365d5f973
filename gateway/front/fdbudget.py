"""How many client connections one gateway process can hold before it runs out of file
descriptors, so the connection cap (listen.max_connections) answers 503 before accept fails.

Past the descriptor limit (RLIMIT_NOFILE) accept fails with EMFILE: the event loop closes the
connection unanswered (the client sees EOF or a reset) and everything else that needs a
descriptor fails too: the upstream connection of a request, the ledger, the accounting
child's probe and respawn. The budget leaves room for all of them:

    free = nofile - RESERVED_FDS - 2 x endpoints      (health checks and load scrapes)
    each client connection takes 1, and each request in flight 1 more to its engine
    (at most listen.max_inflight at once):
    max_connections = free // 2                        where that is <= max_inflight
                    = free - max_inflight              otherwise
    and at most DEFAULT_CAP when derived (not set in the config).

RESERVED_FDS covers the listening socket, the ledger, the journal and its spill, the
accounting child's socket and pipes, the log files, the interpreter's own files and the
transient descriptor of a connection being refused.
"""

from __future__ import annotations

import resource

RESERVED_FDS = 64
DEFAULT_CAP = 4096  # the derived value never exceeds this, however high the limit


def nofile_limit() -> int:
    """This process's soft RLIMIT_NOFILE (a large number where it is unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_budget(nofile: int, max_inflight: int, endpoints: int) -> int:
    """Client connections that fit in `nofile` descriptors (at least 1)."""
    free = nofile - RESERVED_FDS - 2 * endpoints
    conns = free // 2 if free <= 2 * max_inflight else free - max_inflight
    return max(1, conns)


def max_connections(configured: int, nofile: int, max_inflight: int, endpoints: int
                    ) -> tuple[int, str | None]:
    """The cap to enforce and a warning when the configured one does not fit. `configured`
    0: derived from the limit."""
    budget = connection_budget(nofile, max_inflight, endpoints)
    if configured <= 0:
        return min(budget, DEFAULT_CAP), None
    if configured > budget:
        return budget, (f"listen.max_connections {configured} does not fit the file-descriptor "
                        f"limit {nofile} (ulimit -n): {budget} used instead; raise the limit "
                        f"to take more")
    return configured, None
