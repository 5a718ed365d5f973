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

# A non-empty string value for a field that carries generated text (completions `text`, chat
# `content`/`reasoning_content`, tool-call `arguments`). An empty string does not count, so the
# chat role chunk and a bare finish_reason chunk are not token-bearing.
_TOKEN_RE = re.compile(rb'"(?:text|content|reasoning_content|arguments)":\s*"(?!")')
_USAGE_RE = re.compile(rb'"usage":\s*\{')
_EMPTY_CHOICES_RE = re.compile(rb'"choices":\s*\[\s*\]')


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

    __slots__ = ("_buf", "done", "error", "strip_usage", "usage")

    def __init__(self, *, strip_usage: bool):
        self._buf = b""
        self.strip_usage = strip_usage
        self.usage: dict[str, Any] | None = None
        self.done = False  # saw `data: [DONE]`
        self.error = False  # saw an error event

    def feed(self, data: bytes) -> tuple[bytes, int]:
        """Consume one read; return (complete events to relay, token-bearing events in them)."""
        buf = self._buf + data if self._buf else data
        cut = _split_point(buf)
        if cut == 0:
            self._buf = buf
            return b"", 0
        complete, self._buf = buf[:cut], buf[cut:]
        if b'"usage"' in complete or b'"error"' in complete or b"[DONE]" in complete:
            return self._slow(complete)
        return complete, self._count_tokens(complete)

    @staticmethod
    def _count_tokens(chunk: bytes) -> int:
        if chunk.count(b"data:") <= 1:
            return 1 if _TOKEN_RE.search(chunk) else 0
        return sum(1 for ev in _events(chunk) if _TOKEN_RE.search(ev))

    def _slow(self, complete: bytes) -> tuple[bytes, int]:
        """Per-event path for reads holding usage, error or [DONE] events (once per stream)."""
        kept: list[bytes] = []
        tokens = 0
        for event in _events(complete):
            payload = _data_of(event)
            if payload == b"[DONE]":
                self.done = True
            elif payload is not None and _USAGE_RE.search(payload):
                parsed = _loads(payload)
                usage = parsed.get("usage") if parsed else None
                if isinstance(usage, dict):
                    self.usage = usage
                if _EMPTY_CHOICES_RE.search(payload):
                    if self.strip_usage:
                        continue
                elif _TOKEN_RE.search(payload):
                    tokens += 1
            elif payload is not None and payload.startswith(b'{"error"'):
                self.error = True
            elif payload is not None and _TOKEN_RE.search(payload):
                tokens += 1
            kept.append(event)
        return b"".join(kept), tokens

    def pending(self) -> bytes:
        """Bytes of an incomplete trailing event (relayed as is when the stream ends)."""
        return self._buf


def _events(chunk: bytes) -> list[bytes]:
    """Split complete events, keeping each one's own terminator."""
    sep = b"\r\n\r\n" if b"\r\n\r\n" in chunk else b"\n\n"
    parts = chunk.split(sep)
    return [p + sep for p in parts[:-1]]


def _data_of(event: bytes) -> bytes | None:
    """The `data:` payload of one event (multi-line data joined), or None."""
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


def usage_of_body(body: bytes) -> dict[str, Any] | None:
    """The `usage` object of a non-streamed JSON response, if any."""
    parsed = _loads(body)
    usage = parsed.get("usage") if parsed else None
    return usage if isinstance(usage, dict) else None
