"""Chargeback report (pure): ledger aggregates -> rows grouped by tenant/model/precision/
engine/hour, with the engines' idle accounts as separate `idle` rows and their failed
accounts (failed requests' energy not billed to their tenants, accounting/failed.py)
as `failed` rows.

Energy, carbon and cost count the shares of intervals that start in [since, until), so the
request rows plus the idle and failed rows add up to the metered energy of that window. A
request row's `failed_energy_j` is its failed requests' energy in the failed account (not in
its `energy_j`). Requests, tokens and goodput count requests that finished in the window,
and `served`, `refused`, `failed`, `cancelled` count them by outcome class
(core/outcomes.py); `ok` is `served`, kept for readers of the older column. Rates are taken over the
data's real span, never over the query window (a day's window holding a minute of traffic
would understate them 1440 times): `requests_per_s` and `goodput_rps` from the first arrival
to the last finish of the requests selected; `power_w` (J/s) from the start of the first
metered interval to the end of the last (the requests' span when the selection has no
interval of its own, as with a tenant filter). None where there is nothing to divide by.
`j_per_token` is joules per output (completion) token; `idle_share` is the part of a
row's energy that is static (idle) power: the engine's idle draw while the row's requests
were resident, and 1 for idle rows.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson

from accounting.ledger.base import HOUR_S, UsageData
from core.vocab import OUTCOME_CLASSES

GROUP_KEYS: tuple[str, ...] = ("tenant", "model", "precision", "engine", "hour")
IDLE_TENANT = "(idle)"
FAILED_TENANT = "(failed)"
J_PER_KWH = 3.6e6


@dataclass(slots=True)
class UsageRow:
    key: tuple[str, ...]
    account: str  # "requests", "idle" or "failed"
    requests: int = 0
    ok: int = 0
    served: int = 0
    refused: int = 0
    failed: int = 0
    cancelled: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    slo_met: int = 0
    energy_j: float = 0.0
    static_j: float = 0.0
    carbon_g: float = 0.0
    cost_usd: float = 0.0
    failed_energy_j: float = 0.0  # of its failed requests, in the failed account
    estimated: bool = False
    _parts: list[tuple[float, float, float, float, float]] = field(default_factory=list,
                                                                   repr=False)

    def add_energy(self, energy_j: float, static_j: float, carbon_g: float, cost_usd: float,
                   failed_j: float = 0.0) -> None:
        self._parts.append((energy_j, static_j, carbon_g, cost_usd, failed_j))

    def settle(self) -> None:
        # fsum makes the totals independent of the order rows came back from the store.
        for i, name in enumerate(("energy_j", "static_j", "carbon_g", "cost_usd",
                                  "failed_energy_j")):
            setattr(self, name, math.fsum(p[i] for p in self._parts))

    def as_dict(self, group_by: Sequence[str], span_s: float | None,
                metered_s: float | None) -> dict[str, Any]:
        out: dict[str, Any] = dict(zip(group_by, self.key, strict=True))

        def rate(amount: float, over: float | None = span_s) -> float | None:
            return amount / over if over else None

        out.update(
            account=self.account, requests=self.requests, ok=self.ok, served=self.served,
            refused=self.refused, failed=self.failed, cancelled=self.cancelled,
            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
            energy_j=self.energy_j, energy_kwh=self.energy_j / J_PER_KWH,
            carbon_g=self.carbon_g, cost_usd=self.cost_usd,
            requests_per_s=rate(self.requests), goodput_rps=rate(self.slo_met),
            power_w=rate(self.energy_j, metered_s),
            j_per_token=(self.energy_j / self.completion_tokens
                         if self.completion_tokens else None),
            idle_share=(1.0 if self.account == "idle" else 0.0 if self.account == "failed" else
                        (self.static_j / self.energy_j if self.energy_j > 0 else 0.0)),
            failed_energy_j=self.failed_energy_j, estimated=self.estimated,
        )
        return out


@dataclass(frozen=True, slots=True)
class Report:
    since_s: float  # the query window
    until_s: float
    group_by: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]
    total: dict[str, Any]
    # The data's spans, which the rates divide by (wall clock; None: no such data): the
    # selected requests' first arrival and last finish; the metered intervals' first start
    # and last end.
    first_s: float | None = None
    last_s: float | None = None
    metered_first_s: float | None = None
    metered_last_s: float | None = None

    @property
    def span_s(self) -> float | None:
        return _span(self.first_s, self.last_s)

    @property
    def metered_s(self) -> float | None:
        return _span(self.metered_first_s, self.metered_last_s) or self.span_s


def _span(first_s: float | None, last_s: float | None) -> float | None:
    return None if first_s is None or last_s is None else max(last_s - first_s, 0.0)


def hour_label(hour_idx: int) -> str:
    return datetime.fromtimestamp(hour_idx * HOUR_S, UTC).strftime("%Y-%m-%dT%H:00Z")


def _key(dims: dict[str, Any], group_by: Sequence[str]) -> tuple[str, ...]:
    return tuple(hour_label(int(dims["hour"])) if g == "hour" else str(dims[g]) for g in group_by)


def build_report(data: UsageData, group_by: Sequence[str], since_s: float, until_s: float
                 ) -> Report:
    bad = [g for g in group_by if g not in GROUP_KEYS]
    if bad:
        raise ValueError(f"cannot group by {bad[0]!r}; use {', '.join(GROUP_KEYS)}")
    rows: dict[tuple[tuple[str, ...], str], UsageRow] = {}

    def row(tenant: Any, model: Any, precision: Any, engine: Any, hour: Any, account: str
            ) -> UsageRow:
        dims = {"tenant": tenant, "model": model, "precision": precision, "engine": engine,
                "hour": hour}
        key = _key(dims, group_by)
        r = rows.get((key, account))
        if r is None:
            r = rows[(key, account)] = UsageRow(key, account)
        return r

    for tenant, model, precision, engine, hour, e, st, c, usd, est, *failed in data.energy:
        r = row(tenant, model, precision, engine, hour, "requests")
        r.add_energy(e, st, c, usd, float(failed[0] or 0.0) if failed else 0.0)
        r.estimated = r.estimated or bool(est)
    firsts, lasts = [], []
    for (tenant, model, precision, engine, hour, n, ok, pt, ct, met, first, last,
         *by_class) in data.requests:
        firsts.append(float(first))
        lasts.append(float(last))
        r = row(tenant, model, precision, engine, hour, "requests")
        r.requests += int(n)
        r.ok += int(ok)
        r.prompt_tokens += int(pt)
        r.completion_tokens += int(ct)
        r.slo_met += int(met)
        for name, count in zip(OUTCOME_CLASSES, by_class, strict=False):
            setattr(r, name, getattr(r, name) + int(count or 0))
    starts, ends = [], []
    for engine, model, precision, hour, e, c, usd, est, start, end, *_ in data.idle:
        starts.append(float(start))
        ends.append(float(end))
        r = row(IDLE_TENANT, model, precision, engine, hour, "idle")
        r.add_energy(e, e, c, usd)
        r.estimated = r.estimated or bool(est)
    for engine, model, precision, hour, e, c, usd, est in data.failed:
        r = row(FAILED_TENANT, model, precision, engine, hour, "failed")
        r.add_energy(e, 0.0, c, usd)
        r.estimated = r.estimated or bool(est)
    spans = Report(since_s, until_s, tuple(group_by), (), {},
                   *((min(firsts), max(lasts)) if firsts else (None, None)),
                   *((min(starts), max(ends)) if starts else (None, None)))
    span, metered = spans.span_s, spans.metered_s
    order = {"requests": 0, "idle": 1, "failed": 2}
    ordered = sorted(rows.values(), key=lambda r: (order[r.account], r.key))
    total = UsageRow(tuple("TOTAL" if i == 0 else "" for i in range(len(group_by))), "all")
    counts: tuple[str, ...] = ("requests", "ok", *OUTCOME_CLASSES, "prompt_tokens",
                               "completion_tokens", "slo_met")
    for r in ordered:
        r.settle()
        total.add_energy(r.energy_j, r.static_j, r.carbon_g, r.cost_usd, r.failed_energy_j)
        for column in counts:
            setattr(total, column, getattr(total, column) + getattr(r, column))
        total.estimated = total.estimated or r.estimated
    total.settle()
    total_dict = total.as_dict(group_by, span, metered)
    total_dict["idle_share"] = (math.fsum(r.energy_j for r in ordered if r.account == "idle")
                                / total.energy_j if total.energy_j > 0 else 0.0)
    return replace(spans, rows=tuple(r.as_dict(group_by, span, metered) for r in ordered),
                   total=total_dict)


def fixed(v: float) -> str:
    """`v` in fixed point for people: 1 decimal from 1000 up, 3 from 1, else at least three
    significant digits (0.00000028, never 2.8e-07)."""
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    magnitude = abs(v)
    digits = (1 if magnitude >= 1000 else 3 if magnitude >= 1
              else min(max(2 - math.floor(math.log10(magnitude)), 6), 15))
    text = f"{v:.{digits}f}"
    return text.rstrip("0").rstrip(".")


def positional(v: float) -> str:
    """`v` exactly as Python's shortest repr, but in positional notation (for CSV)."""
    text = repr(v)
    return format(Decimal(text), "f") if "e" in text and math.isfinite(v) else text


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return fixed(v)
    return "" if v is None else str(v)


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    return positional(v) if isinstance(v, float) else v


def columns(report: Report) -> list[str]:
    return [*report.group_by, "account", "requests", "ok", *OUTCOME_CLASSES, "prompt_tokens",
            "completion_tokens", "energy_j", "energy_kwh", "carbon_g", "cost_usd",
            "failed_energy_j", "requests_per_s", "goodput_rps", "power_w", "j_per_token",
            "idle_share", "estimated"]


def _stamp(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def span_lines(report: Report) -> list[str]:
    """What the rates divide by, in words."""
    out = []
    if report.first_s is None or report.last_s is None or report.span_s is None:
        out.append("requests/s, goodput: n/a (no request in the window)")
    else:
        out.append(f"requests/s, goodput over {fixed(report.span_s)} s: first arrival "
                   f"{_stamp(report.first_s)} to last finish {_stamp(report.last_s)}")
    first, last = report.metered_first_s, report.metered_last_s
    if first is not None and last is not None and report.metered_s:
        out.append(f"power_w over {fixed(report.metered_s)} s: metered intervals "
                   f"{_stamp(first)} to {_stamp(last)}")
    elif report.metered_s:
        out.append("power_w over the requests' span")
    else:
        out.append("power_w: n/a (nothing metered in the window)")
    return out


def render(report: Report, fmt: str) -> str:
    """The report as `table`, `csv` or `json` text."""
    cols = columns(report)
    if fmt == "json":
        return orjson.dumps({"since_s": report.since_s, "until_s": report.until_s,
                             "first_s": report.first_s, "last_s": report.last_s,
                             "span_s": report.span_s, "metered_first_s": report.metered_first_s,
                             "metered_last_s": report.metered_last_s,
                             "metered_s": report.metered_s, "group_by": list(report.group_by),
                             "rows": list(report.rows), "total": report.total},
                            option=orjson.OPT_INDENT_2).decode()
    records = [*report.rows, report.total]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for r in records:
            w.writerow([_csv_cell(r.get(c)) for c in cols])
        return buf.getvalue()
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}; use table, csv or json")
    cells = [cols] + [[_fmt(r.get(c)) for c in cols] for r in records]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(len(lines) - 1, lines[1])
    return "\n".join([*lines, *span_lines(report)]) + "\n"
