"""Parsing an HTTP/1.1 request head for a lean server (pure; the gateway's front and the load
generator's self-test engine use it).

It accepts only the plain, common shape of a request: `POST` to one of the given routes with a
`Content-Length` body within the limit (or `GET` to one of the given GET routes, with no body
unless one is declared), HTTP/1.1, no `Transfer-Encoding`, `Expect` or `Upgrade`, well-formed
header lines. Anything else is `HANDOFF`: the caller passes the connection to a complete
server (the gateway: aiohttp), which answers it fully (including its errors), or answers it as
not served (the self-test engine), so this parser never has to be complete; it only has to be
sure.

The faults it answers itself, as a `Refusal` (status and a bounded reason), because no
server should take them: a bare LF in the head (a request-smuggling vector; waiting for a
CRLF CRLF that never comes would hold the client to the head deadline), a request line longer
than MAX_HEAD_BYTES (414) and a head longer than that (431); and, by `shape_refusal` (which
the aiohttp side asks too), a request line with no HTTP version (HTTP/0.9: 400), a version
other than 1.0 and 1.1 (505) and a transfer coding other than `chunked` alone (501: a server
must not serve a body whose coding it does not undo).
"""

from __future__ import annotations

from typing import Final

MAX_HEAD_BYTES: Final = 16 * 1024

_TOKEN_CHARS = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_REFUSED = frozenset((b"transfer-encoding", b"expect", b"upgrade"))


class Handoff:
    """The request is not the lean server's to serve: a complete server takes the
    connection."""


HANDOFF: Final = Handoff()


class Refusal:
    """The head is not HTTP any server should take: answer `status` and close."""

    __slots__ = ("reason", "status")

    def __init__(self, status: int, reason: str):
        self.status = status
        self.reason = reason  # bounded: a metric label


BARE_LF: Final = Refusal(400, "bad_request")
URI_TOO_LONG: Final = Refusal(414, "uri_too_long")
HEAD_TOO_LARGE: Final = Refusal(431, "head_too_large")
NO_VERSION: Final = Refusal(400, "bad_request")
VERSION_NOT_SUPPORTED: Final = Refusal(505, "http_version_not_supported")
CODING_NOT_IMPLEMENTED: Final = Refusal(501, "transfer_coding_not_implemented")


def shape_refusal(version: tuple[int, int] | None, transfer_encoding: bytes | None
                  ) -> Refusal | None:
    """A request's HTTP `version` (None: its request line named none) and its
    `Transfer-Encoding` value: the Refusal they earn, or None."""
    if version is None:
        return NO_VERSION
    if version not in ((1, 1), (1, 0)):
        return VERSION_NOT_SUPPORTED
    if transfer_encoding is not None and transfer_encoding.strip(b" \t").lower() != b"chunked":
        return CODING_NOT_IMPLEMENTED
    return None


def _version_of(request_line: list[bytes]) -> tuple[int, int] | None:
    """The HTTP version a request line names; None for none (`GET /`); (0, 0) for one that
    is not HTTP/<digit>.<digit> (aiohttp answers that as malformed)."""
    if len(request_line) == 2:
        return None
    v = request_line[-1]
    if len(v) == 8 and v.startswith(b"HTTP/") and v[5:6].isdigit() and v[6:7] == b"." \
            and v[7:8].isdigit():
        return int(v[5:6]), int(v[7:8])
    return (1, 1)  # malformed: not this check's to answer


class RequestHead:
    __slots__ = ("body_start", "content_length", "headers", "keep_alive", "method", "path",
                 "raw_headers")

    def __init__(self, method: bytes, path: str, headers: dict[bytes, bytes],
                 raw_headers: list[tuple[bytes, bytes]], content_length: int,
                 keep_alive: bool, body_start: int):
        self.method = method  # b"POST" or b"GET"
        self.path = path
        self.headers = headers  # lower-case name -> value
        self.raw_headers = raw_headers
        self.content_length = content_length
        self.keep_alive = keep_alive
        self.body_start = body_start


def parse_head(buf: bytes | bytearray, routes: frozenset[bytes], max_body_bytes: int,
               get_routes: frozenset[bytes] = frozenset()) -> RequestHead | Handoff | Refusal | None:
    """The head at the start of `buf`: None while it is incomplete, HANDOFF if not ours, a
    Refusal if no server should take it. `routes` are served for POST, `get_routes` for
    GET."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        # Only a head split over reads gets here, so the whole-head fast path scans no more.
        # Every LF seen so far is inside the head: each must end a CRLF.
        if buf.count(b"\n") != buf.count(b"\r\n"):
            return BARE_LF
        return _oversized(buf) if len(buf) > MAX_HEAD_BYTES else None
    if end > MAX_HEAD_BYTES:
        return _oversized(buf)
    head = bytes(buf[:end])
    lines = head.split(b"\r\n")
    if head.count(b"\n") != len(lines) - 1:
        return BARE_LF
    # a CR not part of a line break, or a NUL, is malformed: aiohttp says so
    if head.count(b"\r") != len(lines) - 1 or b"\x00" in head:
        return HANDOFF
    request_line = lines[0].split(b" ")
    method = request_line[0]
    if (len(request_line) != 3 or request_line[2] != b"HTTP/1.1"
            or (request_line[1] not in routes if method == b"POST"
                else method != b"GET" or request_line[1] not in get_routes)):
        if 2 <= len(request_line) <= 3:
            te = next((ln.partition(b":")[2] for ln in lines[1:]
                       if ln[:18].lower() == b"transfer-encoding:"), None)
            refusal = shape_refusal(_version_of(request_line), te)
            if refusal is not None:
                return refusal
        return HANDOFF
    headers: dict[bytes, bytes] = {}
    raw: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name.translate(None, _TOKEN_CHARS):
            return HANDOFF  # not a header line, or a name that is not an HTTP token
        value = value.strip(b" \t")
        lname = name.lower()
        if lname in headers:
            if lname == b"content-length" or lname == b"host":
                return HANDOFF
            headers[lname] += b", " + value
        else:
            headers[lname] = value
        raw.append((name, value))
    te = headers.get(b"transfer-encoding")
    if te is not None and (refusal := shape_refusal((1, 1), te)) is not None:
        return refusal
    length = headers.get(b"content-length")
    if length is None and method == b"GET":
        length = b"0"
    if (length is None or not length.isdigit() or len(length) > 15
            or not _REFUSED.isdisjoint(headers)):
        return HANDOFF
    content_length = int(length)
    if content_length > max_body_bytes:
        return HANDOFF
    connection = headers.get(b"connection")
    keep_alive = connection is None or b"close" not in connection.lower()
    return RequestHead(method, request_line[1].decode(), headers, raw, content_length,
                       keep_alive, end + 4)


def _oversized(buf: bytes | bytearray) -> Refusal:
    """414 when the request line alone is past the limit, else 431."""
    return URI_TOO_LONG if buf.find(b"\r\n", 0, MAX_HEAD_BYTES) < 0 else HEAD_TOO_LARGE
