"""A small, fast reader of Prometheus text exposition for the few gauges routing needs."""

from __future__ import annotations

import math

from engines.adapters.base import MetricsParseError


def sample_sums(body: bytes, wanted: frozenset[str]) -> tuple[dict[str, float], dict[str, int]]:
    """Sum (and count) the samples of each wanted metric name over all label sets."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    try:
        text = body.decode()
    except UnicodeDecodeError as exc:
        raise MetricsParseError(f"metrics are not UTF-8: {exc}") from None
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if 0 <= brace < space or (brace >= 0 and space < 0) else space
        if end <= 0:
            continue
        name = line[:end]
        if name not in wanted:
            continue
        value_part = line[line.rfind("}") + 1:] if brace >= 0 else line[space:]
        fields = value_part.split()
        if not fields:
            raise MetricsParseError(f"sample without a value: {line[:80]!r}")
        try:
            value = float(fields[0])
        except ValueError:
            raise MetricsParseError(f"bad sample value: {line[:80]!r}") from None
        if math.isnan(value):
            continue
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    return sums, counts
