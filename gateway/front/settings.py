"""What the lean front is told at start: the edge's deadlines and caps, the routes it serves
itself, and where requests and handed-over connections go."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from wire.exchange import ServerExchange


class EdgeLimits:
    """The edge's deadlines and caps (listen.* in the config)."""

    __slots__ = ("body_min_bytes_per_s", "body_timeout_s", "header_timeout_s", "keepalive_s",
                 "max_connections")

    def __init__(self, *, header_timeout_s: float = 10.0, body_timeout_s: float = 30.0,
                 body_min_bytes_per_s: float = 65536.0, keepalive_s: float = 75.0,
                 max_connections: int = 4096):
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.body_min_bytes_per_s = body_min_bytes_per_s
        self.keepalive_s = keepalive_s
        self.max_connections = max_connections

    def body_deadline_s(self, content_length: int) -> float:
        """Seconds a body of this size may take after its head."""
        return self.body_timeout_s + content_length / self.body_min_bytes_per_s


class FrontSettings:
    __slots__ = ("after_records", "cancel_on_disconnect", "handoff", "holds_last", "limits",
                 "max_body_bytes", "on_reject", "routes", "serve")

    def __init__(self, serve: Callable[[ServerExchange], Awaitable[None]],
                 handoff: Callable[[], asyncio.Protocol], routes: Sequence[str],
                 max_body_bytes: int, cancel_on_disconnect: bool = True,
                 limits: EdgeLimits | None = None,
                 on_reject: Callable[[str], None] | None = None,
                 after_records: Callable[[Callable[[], None]], None] | None = None):
        self.serve = serve  # the proxy's `serve(exchange)` coroutine function
        # the proxy's `after_records`: an answer's last write waits for its record
        self.after_records = after_records or _at_once
        self.holds_last = after_records is not None
        self.handoff = handoff  # makes the aiohttp protocol that takes a handed-over connection
        self.routes = frozenset(r.encode() for r in routes)
        self.max_body_bytes = max_body_bytes
        self.cancel_on_disconnect = cancel_on_disconnect
        self.limits = limits or EdgeLimits()
        self.on_reject = on_reject  # counts connections the edge closed, by reason


def _at_once(callback: Callable[[], None]) -> None:
    callback()
