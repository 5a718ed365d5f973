"""The gateway's log: text or JSON lines, and repeated warnings held to a few a minute.

What goes into the log is the code's own messages: request ids, endpoint names, error kinds.
Client input (keys, prompts, header bytes) never does: the edge logs the kind of a malformed
request, not its bytes (gateway/front/aiohttp_errors.py).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import orjson

from gateway.config import Logging

REPEATS_PER_WINDOW = 5  # the same message template from one logger, per window
WINDOW_S = 60.0


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message (and the exception's kind and
    traceback when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": round(record.created, 6), "level": record.levelname.lower(),
            "logger": record.name, "message": record.getMessage()}
        if record.exc_info and record.exc_info[0] is not None:
            doc["exc_type"] = record.exc_info[0].__name__
            doc["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


class RepeatLimiter(logging.Filter):
    """Lets through at most REPEATS_PER_WINDOW records of one (logger, template) per window
    of WARNING and above, then one line saying how many were held back. A meter of a down
    engine warned several times a second; a flood of one bad client does likewise."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._clock = clock
        self._seen: dict[tuple[str, object], list[float]] = {}  # key -> [window start, count]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.msg)
        now = self._clock()
        slot = self._seen.get(key)
        if slot is None or now - slot[0] >= WINDOW_S:
            held = int(slot[1]) - REPEATS_PER_WINDOW if slot is not None else 0
            self._seen[key] = [now, 1.0]
            if held > 0:
                record.msg = f"{record.msg} [{held} more like this in the last minute]"
            if len(self._seen) > 4096:  # bounded: forget the oldest windows
                for old in sorted(self._seen, key=lambda k: self._seen[k][0])[:2048]:
                    del self._seen[old]
            return True
        slot[1] += 1
        return slot[1] <= REPEATS_PER_WINDOW


def configure(cfg: Logging, level: str | None = None) -> None:
    """Root logging to stderr in the configured format; `level` overrides the config's."""
    handler = logging.StreamHandler(sys.stderr)
    if cfg.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RepeatLimiter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel((level or cfg.level).upper())
    # aiohttp's access log is off; its server log quotes raw input on parse errors, which the
    # gateway's own handler answers instead: keep only its errors
    logging.getLogger("aiohttp.server").setLevel(logging.ERROR)
