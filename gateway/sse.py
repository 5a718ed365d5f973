"""Incremental scanning of an upstream OpenAI-style SSE stream (pure, no I/O).

The relay hands each upstream read to `SseScanner.feed`, which returns the bytes to relay now
(only whole events, so the usage chunk can be cut out cleanly) and how many of them carry
tokens. Work is a few C-level byte searches per read; JSON is parsed only for the rare event
that carries `usage`. Events are relayed byte for byte, never re-serialised.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# A token event, as `vllm bench serve` counts it: any event whose `choices` list is non-empty,
# whatever its text ("" for a special token, or for a token that ends inside a multi-byte UTF-8
# character; the chat role chunk and a bare finish_reason chunk count too). The usage-only
# chunk (`"choices": []`) does not.
_TOKEN_RE = re.compile(rb'"choices":\s*\[\s*[^\s\]]')
_USAGE_RE = re.compile(rb'"usage":\s*\{')
_EMPTY_CHOICES_RE = re.compile(rb'"choices":\s*\[\s*\]')
# a choice that ends: its `finish_reason` is a string ("stop", "length", ...), not null
_FINISH_RE = re.compile(rb'"finish_reason":\s*"')


def _split_point(buf: bytes) -> int:
    """Index just past the last complete event (blank line), or 0 if none is complete."""
    lf = buf.rfind(b"\n\n")
    crlf = buf.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


class SseScanner:
    """Splits an SSE byte stream into whole events and notes token events and usage.

    strip_usage: drop the usage-only chunk (``"choices": []`` with ``usage``) from the relayed
    bytes, for clients that did not ask for it.
    """

    __slots__ = ("_buf", "choices", "done", "error", "final_usage", "finishes", "role_events",
                 "strip_usage", "usage")

    def __init__(self, *, strip_usage: bool, choices: int = 1):
        """`choices`: the request's `n`, the choices whose finish_reason ends the answer."""
        self._buf = b""
        self.strip_usage = strip_usage
        self.usage: dict[str, Any] | None = None
        self.done = False  # saw `data: [DONE]`
        self.final_usage = False  # saw the usage-only chunk (`"choices": []`) that ends a stream
        self.error = False  # saw an error event
        self.choices = choices
        self.finishes = 0  # token events seen with a non-null finish_reason
        self.role_events = 0  # chat role chunks (token events by the count, with no token)

    def feed(self, data: bytes) -> tuple[bytes, int]:
        """Consume one read; return (complete events to relay, token-bearing events in them)."""
        if not self._buf and data.endswith(b"\n\n"):
            complete = data  # the usual case: a read ends on an event boundary
        else:
            buf = self._buf + data if self._buf else data
            cut = _split_point(buf)
            if cut == 0:
                self._buf = buf
                return b"", 0
            complete, self._buf = buf[:cut], buf[cut:]
        if b'"usage"' in complete:
            complete = self._take_usage(complete)
        if b"[DONE]" in complete:
            self.done = True
        if b'{"error"' in complete:
            self.error = True
        if b'"role"' in complete:
            self.role_events += complete.count(b'"role"')
        if self.finishes < self.choices and b'"finish_reason":' in complete:
            found = complete.count(b'"finish_reason":"')
            if not found and b'"finish_reason": ' in complete:
                found = len(_FINISH_RE.findall(complete))
            self.finishes += found
        return complete, _count_tokens(complete)

    @property
    def finished(self) -> bool:
        """Every choice's token event with a non-null finish_reason was seen."""
        return self.finishes >= self.choices

    @property
    def complete(self) -> bool:
        """The relayed events hold the end of the answer: the token event that carries a
        `finish_reason` of every choice (the last token the client gets; a client may stop
        reading there),
        the final usage chunk it asked for, or `[DONE]`."""
        return self.finished or self.done or (self.final_usage and not self.strip_usage)

    def _take_usage(self, complete: bytes) -> bytes:
        """Read the usage of each event that has one; cut usage-only events when stripping.

        Only the events holding `"usage"` are looked at; the bytes around them are kept whole.
        """
        # whole events end on a blank line; the last one tells the stream's line ending (a
        # test of the tail, not a scan of a read that may hold a whole coalesced stream)
        sep = b"\r\n\r\n" if complete.endswith(b"\r\n\r\n") else b"\n\n"
        parts: list[bytes] = []
        pos = 0
        while (i := complete.find(b'"usage"', pos)) >= 0:
            start = complete.rfind(sep, pos, i)
            start = pos if start < 0 else start + len(sep)
            end = complete.find(sep, i)
            end = len(complete) if end < 0 else end + len(sep)
            event = complete[start:end]
            parts.append(complete[pos:start])
            pos = end
            payload = _data_of(event)
            if payload is not None and (b'"usage":{' in payload or _USAGE_RE.search(payload)):
                parsed = _loads(payload)
                usage = parsed.get("usage") if parsed else None
                if isinstance(usage, dict):
                    self.usage = usage
                if b'"choices":[]' in payload or _EMPTY_CHOICES_RE.search(payload):
                    self.final_usage = True
                    if self.strip_usage:
                        continue
            parts.append(event)
        if pos == 0:
            return complete
        parts.append(complete[pos:])
        return b"".join(parts)

    def pending(self) -> bytes:
        """Bytes of an incomplete trailing event (relayed as is when the stream ends)."""
        return self._buf


# Compact JSON (vLLM, trtllm-serve, the simulator): one C-level byte count per read. Other
# spacing falls back to the regex.
def _count_tokens(chunk: bytes) -> int:
    """Token events in whole events `chunk` (one `choices` key per event)."""
    found = chunk.count(b'"choices":[{')
    if found or b'"choices": ' not in chunk:
        return found
    return len(_TOKEN_RE.findall(chunk))


def _data_of(event: bytes) -> bytes | None:
    """The `data:` payload of one event (multi-line data joined), or None."""
    if event.startswith(b"data:") and event.count(b"\n") <= 2:
        return event[5:].strip()
    lines = [ln for ln in event.splitlines() if ln.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(ln[5:].lstrip(b" ") for ln in lines)


def _loads(payload: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def json_object(body: bytes) -> dict[str, Any] | None:
    """A non-streamed response body as a JSON object; None when it is not one (an SSE
    stream, garbage, a JSON value of another kind)."""
    return _loads(body)


def usage_of_body(body: bytes) -> dict[str, Any] | None:
    """The `usage` object of a non-streamed JSON response, if any."""
    parsed = _loads(body)
    usage = parsed.get("usage") if parsed else None
    return usage if isinstance(usage, dict) else None
