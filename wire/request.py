"""Encoding one HTTP/1.1 request (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a server listens, parsed once from its base URL."""

    host: str
    port: int
    tls: bool
    host_header: str  # "host" or "host:port", as the Host header carries it
    base_path: str  # path prefix of the base URL without a trailing "/", often ""

    @classmethod
    def from_url(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        default = 443 if tls else 80
        port = parts.port or default
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        return cls(host=host, port=port, tls=tls,
                   host_header=shown if port == default else f"{shown}:{port}",
                   base_path=parts.path.rstrip("/"))


def _check(text: str) -> None:
    if "\r" in text or "\n" in text or "\0" in text:
        raise ValueError(f"control character in header {text[:40]!r}")


def encode_request(method: str, target: str, host_header: str,
                   headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    """The request's bytes, head and body, ready for one `transport.write`.

    Host and Content-Length come from the arguments; `headers` are written in order after
    them. Header text is written back as the bytes it was read from (UTF-8 with surrogate
    escapes, as aiohttp decodes it); CR, LF and NUL are refused, so nothing can split the head.
    """
    parts = [f"{method} {target} HTTP/1.1\r\nHost: {host_header}\r\n"
             f"Content-Length: {len(body)}\r\n"]
    for name, value in headers:
        parts.append(f"{name}: {value}\r\n")
    parts.append("\r\n")
    head = "".join(parts)
    # one look at the whole head, not one per header: CR and LF only in the line breaks
    # written above (three, one per header, the blank line), and no NUL
    breaks = len(headers) + 4
    if head.count("\r") != breaks or head.count("\n") != breaks or "\0" in head:
        for text in (method, target, host_header, *(t for pair in headers for t in pair)):
            _check(text)
    return head.encode("utf-8", "surrogateescape") + body
