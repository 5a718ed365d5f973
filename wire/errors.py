"""What can go wrong between the client and a server (for the gateway: an engine), as a caller
needs to tell it apart."""

from __future__ import annotations


class UpstreamFailure(Exception):
    """Base of the upstream client's errors."""


class UpstreamConnectError(UpstreamFailure):
    """The connection could not be opened (refused, unreachable, connect timeout)."""


class UpstreamClosedError(UpstreamFailure):
    """The engine closed or reset the connection before the response was complete."""


class UpstreamStaleConnection(UpstreamClosedError):
    """A pooled connection turned out closed before any response byte: safe to retry fresh."""


class UpstreamProtocolError(UpstreamFailure):
    """The engine's bytes are not valid HTTP/1.1."""


class UpstreamReadTimeout(UpstreamFailure, TimeoutError):
    """The engine went silent for longer than the per-read timeout."""


class UpstreamHeadTimeout(UpstreamFailure, TimeoutError):
    """No response head within the first-byte timeout."""
