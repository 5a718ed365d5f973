"""A lean HTTP/1.1 keep-alive client for the gateway -> engine hot path.

Built on `asyncio.Protocol` (uvloop) with a small incremental response parser: one
`transport.write` per request, body handed over once per socket read, one lazy timer per
response. The health checker and scraper keep using aiohttp; they are off the hot path.
"""

from gateway.upstream.client import ClientSettings, UpstreamClient, UpstreamResponse
from gateway.upstream.errors import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamFailure,
    UpstreamHeadTimeout,
    UpstreamProtocolError,
    UpstreamReadTimeout,
    UpstreamStaleConnection,
)

__all__ = [
    "ClientSettings",
    "UpstreamClient",
    "UpstreamClosedError",
    "UpstreamConnectError",
    "UpstreamFailure",
    "UpstreamHeadTimeout",
    "UpstreamProtocolError",
    "UpstreamReadTimeout",
    "UpstreamResponse",
    "UpstreamStaleConnection",
]
