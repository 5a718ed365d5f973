"""Whether a TCP port can be listened on, asked before a command starts anything.

Every command that listens (`wattgate serve`, `wattgate sim`, `wattgate sim fleet`, the demo)
refuses a taken port the same way: one line naming the address and the way out, exit status 1,
and nothing started (no child process, no ledger file, no other engine).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable


def listen_problem(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on now (the OS's reason), None when it can. Port 0
    (any free port) always can. Binds with SO_REUSEADDR, as the servers do, so a port left in
    TIME_WAIT by a previous run counts as free."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def taken_message(addresses: Iterable[tuple[str, int]]) -> str | None:
    """The one-line refusal for the first address that cannot be listened on, or None."""
    for host, port in addresses:
        problem = listen_problem(host, port)
        if problem is not None:
            return (f"cannot listen on {host}:{port}: {problem.lower()}; "
                    "pick another port (0 for a free one)")
    return None
