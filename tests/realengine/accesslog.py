"""Read the gateway's access log (`access_log: PATH`, one JSON object per finished request).

The client tests join what a real client saw with what the gateway recorded: by request id
(`x-wattgate-request-id`) where the client keeps response headers, else by position, from a
byte offset taken before the client ran (a client that sends one request at a time finishes them
in order; the gateway writes a line when a request finishes, with its arrival time `ts`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

WAIT_S = 15.0  # a line is written when its request finishes; give a busy machine time


def offset(path: Path) -> int:
    """The log's current size: records written after this point belong to what runs next."""
    return path.stat().st_size if path.exists() else 0


def records(path: Path, start: int = 0) -> list[dict[str, Any]]:
    """Complete lines from byte `start` on (a line still being written is left out)."""
    if not path.exists():
        return []
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    return [orjson.loads(line) for line in data.split(b"\n")[:-1] if line.strip()]


def wait_for(path: Path, done: Callable[[list[dict[str, Any]]], bool], start: int = 0,
             timeout_s: float = WAIT_S) -> list[dict[str, Any]]:
    """The records from `start` once `done(records)` holds; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = records(path, start)
        if done(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"access log {path} did not get the expected records in "
                                 f"{timeout_s:g} s; it has {len(got)} after offset {start}: "
                                 f"{got[-3:]}")
        time.sleep(0.1)


def by_id(path: Path, ids: set[str], start: int = 0) -> dict[str, dict[str, Any]]:
    """The records of these request ids, waiting until every one is written."""
    got = wait_for(path, lambda rs: ids <= {str(r.get("request_id")) for r in rs}, start)
    return {str(r["request_id"]): r for r in got if str(r.get("request_id")) in ids}


def after(path: Path, start: int, since_s: float, count: int) -> list[dict[str, Any]]:
    """The records written after byte `start` of requests that arrived at or after `since_s`
    (wall clock), ordered by arrival (`ts`), once there are `count`. Both bounds: the writer
    thread may still be writing an earlier request's line when `start` is taken."""
    def mine(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rs if float(r["ts"]) >= since_s]

    got = mine(wait_for(path, lambda rs: len(mine(rs)) >= count, start))
    return sorted(got, key=lambda r: float(r["ts"]))
