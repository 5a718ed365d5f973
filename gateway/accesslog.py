"""The access log: one JSON line per finished request, written off the event loop.

The line holds what an operator joins on and looks at (request id, tenant, model, precision,
endpoint, status, tokens and how the prompt's were counted, TTFT/TPOT/E2E, duration, attempts),
never a key, a prompt or a header. The request path only appends the encoded line to a queue;
a writer thread writes and flushes whatever is queued, so a slow disk never stalls a request.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
from typing import IO, Any

import orjson

from core.records import RequestRecord

_STOP = b""


def access_entry(rec: RequestRecord) -> dict[str, Any]:
    """The access-log fields of one record (pure)."""
    lat = rec.latency
    return {
        "ts": round(rec.arrived_wall_s, 6), "request_id": rec.request_id, "tenant": rec.tenant,
        "model": rec.model, "precision": rec.precision, "endpoint": rec.engine,
        "status": rec.status, "http_status": rec.http_status, "stream": rec.stream,
        "prompt_tokens": rec.prompt_tokens, "prompt_source": rec.prompt_source,
        "completion_tokens": rec.completion_tokens, "token_events": rec.token_events,
        "ttft_s": lat.ttft_s, "tpot_s": lat.tpot_s, "e2e_s": lat.e2e_s,
        "duration_s": rec.finished_s - rec.arrived_s, "attempts": rec.attempts,
        "slo_class": rec.slo_class, "slo_met": rec.slo_met,
    }


class AccessLog:
    """A record sink writing JSON lines to `target` (a path, or "-" for stderr)."""

    def __init__(self, target: str):
        self._target = target
        self._queue: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __call__(self, rec: RequestRecord) -> None:
        self._queue.put(orjson.dumps(access_entry(rec)) + b"\n")

    def start(self) -> None:
        out: IO[bytes] = (sys.stderr.buffer if self._target == "-"
                          else open(self._target, "ab"))  # noqa: SIM115 - the thread owns it
        self._thread = threading.Thread(target=self._write, args=(out,), name="access-log",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write what is queued, then stop the writer."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=10)
            self._thread = None

    def _write(self, out: IO[bytes]) -> None:
        try:
            while True:
                lines = [self._queue.get()]
                with contextlib.suppress(queue.Empty):
                    while len(lines) < 4096:
                        lines.append(self._queue.get_nowait())
                stop = _STOP in lines
                out.write(b"".join(line for line in lines if line))
                out.flush()
                if stop:
                    return
        finally:
            if out is not sys.stderr.buffer:
                out.close()
