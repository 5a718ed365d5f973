"""What a load client reads of one streamed answer: a timestamp per read with the token-bearing
SSE events it completed (work per read, not per event), the usage, and an error event.

Token-bearing events carry a non-empty "content" (chat) or "text" (completions) string. The
patterns cannot occur inside a JSON string value, where quotes are escaped, so counting them
in the bytes needs no JSON parse per event.
"""

from __future__ import annotations

import time

import orjson

_PATTERNS: dict[str, tuple[bytes, ...]] = {
    "chat": (b'"content":"', b'"content": "'),
    "completions": (b'"text":"', b'"text": "'),
}
_EMPTY: dict[str, tuple[bytes, ...]] = {
    "chat": (b'"content":""', b'"content": ""'),
    "completions": (b'"text":""', b'"text": ""'),
}
ERROR_CHARS = 300  # of an error body or event, kept for the report


def usage_of(block: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from the SSE line holding a usage object, or from a
    whole JSON answer."""
    idx = block.rfind(b'"usage":{')
    if idx < 0:
        idx = block.rfind(b'"usage": {')
    if idx < 0:
        return None
    start = block.rfind(b"data:", 0, idx)
    end = block.find(b"\n", idx)
    # no event before it: a whole JSON answer (an engine that does not stream)
    line = block[start + 5: end if end >= 0 else len(block)] if start >= 0 else block
    try:
        usage = orjson.loads(line)["usage"]
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


class StreamTally:
    """Fed each read of a 200 answer's body as it arrives (`feed`, also usable as a
    `wire` body sink); times are seconds from `t0` on the monotonic clock."""

    __slots__ = ("_carry", "_empty", "_pattern", "_t0", "error", "reads", "usage")

    def __init__(self, api: str, t0: float):
        self._pattern = _PATTERNS[api]
        self._empty = _EMPTY[api]
        self._t0 = t0
        self._carry = b""
        self.reads: list[tuple[float, int]] = []  # (time, token-bearing events completed)
        self.usage: tuple[int, int] | None = None
        self.error = b""  # the error event's tail, if the stream carried one

    def feed(self, chunk: bytes, at_end: bool = False) -> None:
        """One read's body bytes (`at_end`: the answer ended with them)."""
        if not chunk:
            return
        now = time.monotonic() - self._t0
        buf = self._carry + chunk if self._carry else chunk
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._carry = buf
            return
        done, self._carry = buf[: cut + 1], buf[cut + 1:]
        pat0, pat1 = self._pattern
        emp0, emp1 = self._empty
        n = done.count(pat0) + done.count(pat1) - done.count(emp0) - done.count(emp1)
        if n > 0:
            self.reads.append((now, n))
        if b'"usage"' in done:
            self.usage = usage_of(done) or self.usage
        if b'"error":' in done:
            self.error = done[-ERROR_CHARS:]

    def finish(self) -> None:
        """The answer ended: a non-streamed or tokenless body ends in the carry (no trailing
        newline), where its usage may be."""
        tail = self._carry
        if not self.reads and b'"usage"' in tail:
            self.usage = usage_of(tail + b"\n") or self.usage
