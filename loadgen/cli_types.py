"""The load generator's option types: numbers checked where they are given, so nonsense
(`--rate 0`, `--duration nan`, `--rates 1,x`, `--quality fp8=abc`) is a one-line usage error,
not a traceback, a hang, or a report of nothing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import click

from loadgen.targets import parse_pairs


class Finite(click.FloatRange):
    """A finite number in a range (click's FloatRange lets NaN through: it compares false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


POSITIVE = Finite(min=0.0, min_open=True)
NON_NEGATIVE = Finite(min=0.0)
SHARE = Finite(min=0.0, max=1.0, min_open=True)  # of requests: an attainment
SCORE = Finite(min=0.0, max=1.0)  # a quality score relative to 16-bit
COUNT = click.IntRange(min=1)


def rate_list(ctx: click.Context, param: click.Parameter, value: str) -> list[float]:
    """An option's comma-separated rates (req/s), each finite and > 0; "" is none (a click
    callback)."""
    return [POSITIVE.convert(x.strip(), param, ctx) for x in value.split(",") if x.strip()]


def scores(items: Sequence[str], what: str, among: Sequence[str] = ()) -> dict[str, float]:
    """`PRECISION=SCORE` options, each score a finite number from 0 to 1, each precision one
    of `among` when given (a typo would otherwise leave the published figure in force)."""
    out = {}
    for key, raw in parse_pairs(items, what).items():
        if among and key not in among:
            raise click.BadParameter(f"{key} is not among --precisions ({', '.join(among)})",
                                     param_hint=what)
        try:
            out[key] = SCORE.convert(raw, None, None)
        except click.BadParameter as exc:
            raise click.BadParameter(f"{key}={raw}: {exc.message}", param_hint=what) from None
    return out
