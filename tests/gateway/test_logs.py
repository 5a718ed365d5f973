"""The gateway's log: repeated warnings held to a few a minute; JSON lines."""

from __future__ import annotations

import logging

import orjson

from gateway.logs import REPEATS_PER_WINDOW, WINDOW_S, JsonFormatter, RepeatLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(msg: str, *args: object, level: int = logging.WARNING,
           name: str = "wattgate.meter") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_meter_of_a_down_engine_warns_a_few_times_a_minute_then_says_how_many_were_held() -> None:
    """3.5 warnings a second for a minute (what a meter of a down engine wrote) become 5,
    and the next minute's first line counts the ones held back."""
    clock = Clock()
    limiter = RepeatLimiter(clock)
    passed = []
    for i in range(210):
        clock.now = i / 3.5
        rec = record("meter of engine %s failed: %s", "e1", "connection refused")
        if limiter.filter(rec):
            passed.append(rec.getMessage())
    assert len(passed) == REPEATS_PER_WINDOW
    clock.now = WINDOW_S + 1.0
    rec = record("meter of engine %s failed: %s", "e1", "connection refused")
    assert limiter.filter(rec)
    assert f"[{210 - REPEATS_PER_WINDOW} more like this in the last minute]" in rec.getMessage()


def test_other_messages_and_info_lines_are_not_held() -> None:
    limiter = RepeatLimiter(Clock())
    for _ in range(20):
        assert limiter.filter(record("request %s: 502", level=logging.INFO))
    for _ in range(REPEATS_PER_WINDOW):
        assert limiter.filter(record("a"))
        assert limiter.filter(record("b", name="wattgate.other"))
    assert not limiter.filter(record("a"))


def test_json_lines_carry_the_message_and_the_exception_kind() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = logging.LogRecord("wattgate.proxy", logging.ERROR, __file__, 1,
                                "request %s failed", ("r1",), sys.exc_info())
    doc = orjson.loads(JsonFormatter().format(rec))
    assert doc["message"] == "request r1 failed" and doc["level"] == "error"
    assert doc["exc_type"] == "ValueError" and "Traceback" in doc["traceback"]
