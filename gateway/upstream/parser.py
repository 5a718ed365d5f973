"""Incremental HTTP/1.1 response parsing (pure, no I/O).

`ResponseParser.feed` takes one socket read and returns the body bytes it carried, already
de-chunked and joined, so the relay does one step per read however many chunks the engine
wrote. Only fragments that straddle two reads (a head, a chunk-size line, a chunk's CRLF) are
buffered; body data is never held back.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_HEAD_BYTES = 65536
MAX_LINE_BYTES = 1024  # a chunk-size line or a trailer line
_HEX_DIGITS = b"0123456789abcdefABCDEF"

# parser states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class MalformedResponse(ValueError):
    """The engine's bytes are not a valid HTTP/1.1 response."""


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """Status line and the headers the gateway acts on (lower-case names, raw values)."""

    status: int
    reason: str
    version: str  # "1.1" or "1.0"
    content_type: str  # media type without parameters, lower case; "" if absent
    content_length: int | None
    chunked: bool
    keep_alive: bool  # the connection may carry another request after this response
    headers: tuple[tuple[str, str], ...]


def parse_head(raw: bytes) -> ResponseHead:
    """Parse a response head (status line + header lines, without the final blank line)."""
    lines = raw.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise MalformedResponse(f"bad status line {lines[0][:80]!r}")
    headers = []
    content_type = ""
    lengths: set[bytes] = set()
    codings: list[bytes] = []
    connection = b""
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or b" " in name:
            raise MalformedResponse(f"bad header line {line[:80]!r}")
        lname = name.lower()
        value = value.strip(b" \t")
        if lname == b"content-type":
            content_type = value.partition(b";")[0].strip().lower().decode("latin-1")
        elif lname == b"content-length":
            lengths.update(v.strip() for v in value.split(b","))
        elif lname == b"transfer-encoding":
            codings.extend(v.strip().lower() for v in value.split(b","))
        elif lname == b"connection":
            connection += b"," + value.lower()
        headers.append((lname.decode("latin-1"), value.decode("latin-1")))
    status = int(code)
    chunked = bool(codings) and codings[-1] == b"chunked"
    content_length = None
    if lengths and not codings:
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise MalformedResponse(f"bad Content-Length {sorted(lengths)!r}")
        content_length = int(next(iter(lengths)))
    tokens = {t.strip() for t in connection.split(b",")}
    keep_alive = (b"close" not in tokens if version == b"HTTP/1.1" else b"keep-alive" in tokens)
    return ResponseHead(status=status, reason=reason.decode("latin-1"),
                        version=version[5:].decode(), content_type=content_type,
                        content_length=content_length, chunked=chunked,
                        keep_alive=keep_alive, headers=tuple(headers))


class ResponseParser:
    """One response, fed read by read.

    After each `feed`, `head` is set once the head is complete and `done` once the body is.
    A body with neither Content-Length nor chunked coding ends when the connection closes:
    call `feed_eof`. Bytes after the end of the response are kept in `extra` (a connection
    that has them must not be reused). Raises `MalformedResponse`.
    """

    __slots__ = ("_buf", "_left", "_no_body", "_state", "extra", "head")

    def __init__(self, *, no_body: bool = False):
        self._no_body = no_body  # the request was HEAD: the response has no body
        self._state = _HEAD
        self._buf = b""
        self._left = 0  # bytes left in the body (Content-Length) or in the current chunk
        self.head: ResponseHead | None = None
        self.extra = b""

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def until_close(self) -> bool:
        return self._state == _UNTIL_CLOSE

    def feed(self, data: bytes) -> bytes:
        """Consume one read; return the body bytes in it (b"" if none)."""
        state = self._state
        if state == _LENGTH and not self._buf:  # the common case: whole body reads
            left = self._left
            if len(data) < left:
                self._left = left - len(data)
                return data
            self._state = _DONE
            self.extra = data[left:]
            return data[:left] if len(data) > left else data
        if state == _UNTIL_CLOSE:
            return data
        if state == _DONE:
            self.extra += data
            return b""
        buf = self._buf + data if self._buf else data
        self._buf = b""
        if state == _HEAD:
            return self._feed_head(buf)
        return self._feed_chunked(buf)

    def feed_eof(self) -> None:
        """The connection closed. Ends a close-delimited body; anything else is incomplete."""
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
        elif self._state != _DONE:
            raise MalformedResponse("the connection closed before the response was complete")

    def _feed_head(self, buf: bytes) -> bytes:
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise MalformedResponse("response head too large")
                self._buf = buf
                return b""
            if end > MAX_HEAD_BYTES:
                raise MalformedResponse("response head too large")
            head = parse_head(buf[:end])
            buf = buf[end + 4:]
            if head.status >= 200 or head.status == 101:
                break
            # 1xx interim response (100 Continue, 103 Early Hints): the real one follows
        self.head = head
        if self._no_body or head.status in (204, 304) or head.status < 200:
            self._state = _DONE
            self.extra = buf
            return b""
        if head.chunked:
            self._state = _CHUNK_SIZE
            return self._feed_chunked(buf) if buf else b""
        if head.content_length is not None:
            self._state = _LENGTH
            self._left = head.content_length
            if head.content_length == 0:
                self._state = _DONE
                self.extra = buf
                return b""
            return self.feed(buf) if buf else b""
        self._state = _UNTIL_CLOSE
        return buf

    def _feed_chunked(self, buf: bytes) -> bytes:
        out: list[bytes] = []
        pos, end = 0, len(buf)
        state, left = self._state, self._left
        while pos < end:
            if state == _CHUNK_DATA:
                take = min(left, end - pos)
                out.append(buf[pos:pos + take] if take < end or pos else buf)
                pos += take
                left -= take
                if left == 0:
                    state = _CHUNK_CRLF
            elif state == _CHUNK_SIZE:
                eol = buf.find(b"\r\n", pos, pos + MAX_LINE_BYTES)
                if eol < 0:
                    if end - pos >= MAX_LINE_BYTES:
                        raise MalformedResponse("chunk-size line too long")
                    break
                size = buf[pos:eol].partition(b";")[0].rstrip(b" \t")
                if not size or size.translate(None, _HEX_DIGITS):
                    raise MalformedResponse(f"bad chunk size {buf[pos:eol][:40]!r}")
                left = int(size, 16)
                pos = eol + 2
                state = _CHUNK_DATA if left else _TRAILER
            elif state == _CHUNK_CRLF:
                if end - pos < 2:
                    if buf[pos:] != b"\r":
                        raise MalformedResponse("chunk data not followed by CRLF")
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise MalformedResponse("chunk data not followed by CRLF")
                pos += 2
                state = _CHUNK_SIZE
            elif state == _TRAILER:
                eol = buf.find(b"\r\n", pos, pos + MAX_LINE_BYTES)
                if eol < 0:
                    if end - pos >= MAX_LINE_BYTES:
                        raise MalformedResponse("trailer line too long")
                    break
                if eol == pos:
                    state = _DONE
                    pos += 2
                    self.extra = buf[pos:]
                    pos = end
                else:
                    pos = eol + 2
            else:  # pragma: no cover - _DONE is handled by the branch above
                break
        self._state, self._left = state, left
        if pos < end and state != _DONE:
            self._buf = buf[pos:]
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)
