"""Chargeback report (pure): ledger aggregates -> rows grouped by tenant/model/precision/
engine/hour, with the engines' idle accounts as separate `idle` rows.

Energy, carbon and cost count the shares of intervals that start in [since, until), so the
request rows plus the idle rows add up to the metered energy of that window. Requests,
tokens and goodput count requests that finished in the window. `j_per_token` is joules per
output (completion) token; `idle_share` is the part of a row's energy that is static (idle)
power: the engine's idle draw while the row's requests were resident, and 1 for idle rows.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.accounting.ledger.base import HOUR_S, UsageData

GROUP_KEYS: tuple[str, ...] = ("tenant", "model", "precision", "engine", "hour")
IDLE_TENANT = "(idle)"
J_PER_KWH = 3.6e6


@dataclass(slots=True)
class UsageRow:
    key: tuple[str, ...]
    account: str  # "requests" or "idle"
    requests: int = 0
    ok: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    slo_met: int = 0
    energy_j: float = 0.0
    static_j: float = 0.0
    carbon_g: float = 0.0
    cost_usd: float = 0.0
    estimated: bool = False
    _parts: list[tuple[float, float, float, float]] = field(default_factory=list, repr=False)

    def add_energy(self, energy_j: float, static_j: float, carbon_g: float, cost_usd: float
                   ) -> None:
        self._parts.append((energy_j, static_j, carbon_g, cost_usd))

    def settle(self) -> None:
        # fsum makes the totals independent of the order rows came back from the store.
        for i, name in enumerate(("energy_j", "static_j", "carbon_g", "cost_usd")):
            setattr(self, name, math.fsum(p[i] for p in self._parts))

    def as_dict(self, group_by: Sequence[str], duration_s: float) -> dict[str, Any]:
        out: dict[str, Any] = dict(zip(group_by, self.key, strict=True))
        out.update(
            account=self.account, requests=self.requests, ok=self.ok,
            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
            energy_j=self.energy_j, energy_kwh=self.energy_j / J_PER_KWH,
            carbon_g=self.carbon_g, cost_usd=self.cost_usd,
            goodput_rps=self.slo_met / duration_s if duration_s > 0 else 0.0,
            j_per_token=(self.energy_j / self.completion_tokens
                         if self.completion_tokens else None),
            idle_share=(1.0 if self.account == "idle" else
                        (self.static_j / self.energy_j if self.energy_j > 0 else 0.0)),
            estimated=self.estimated,
        )
        return out


@dataclass(frozen=True, slots=True)
class Report:
    since_s: float
    until_s: float
    group_by: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]
    total: dict[str, Any]


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

    for tenant, model, precision, engine, hour, e, st, c, usd, est in data.energy:
        r = row(tenant, model, precision, engine, hour, "requests")
        r.add_energy(e, st, c, usd)
        r.estimated = r.estimated or bool(est)
    for tenant, model, precision, engine, hour, n, ok, pt, ct, met in data.requests:
        r = row(tenant, model, precision, engine, hour, "requests")
        r.requests += int(n)
        r.ok += int(ok)
        r.prompt_tokens += int(pt)
        r.completion_tokens += int(ct)
        r.slo_met += int(met)
    for engine, model, precision, hour, e, c, usd, est in data.idle:
        r = row(IDLE_TENANT, model, precision, engine, hour, "idle")
        r.add_energy(e, e, c, usd)
        r.estimated = r.estimated or bool(est)
    duration = until_s - since_s
    ordered = sorted(rows.values(), key=lambda r: (r.account != "requests", r.key))
    total = UsageRow(tuple("TOTAL" if i == 0 else "" for i in range(len(group_by))), "all")
    for r in ordered:
        r.settle()
        total.add_energy(r.energy_j, r.static_j, r.carbon_g, r.cost_usd)
        for name in ("requests", "ok", "prompt_tokens", "completion_tokens", "slo_met"):
            setattr(total, name, getattr(total, name) + getattr(r, name))
        total.estimated = total.estimated or r.estimated
    total.settle()
    total_dict = total.as_dict(group_by, duration)
    total_dict["idle_share"] = (math.fsum(r.energy_j for r in ordered if r.account == "idle")
                                / total.energy_j if total.energy_j > 0 else 0.0)
    return Report(since_s, until_s, tuple(group_by),
                  tuple(r.as_dict(group_by, duration) for r in ordered), total_dict)


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        # fixed point, never 1e-05 notation: more decimals for smaller magnitudes
        digits = 1 if abs(v) >= 1000 else 3 if abs(v) >= 1 else 6
        text = f"{v:.{digits}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return "" if v is None else str(v)


def columns(report: Report) -> list[str]:
    return [*report.group_by, "account", "requests", "ok", "prompt_tokens", "completion_tokens",
            "energy_j", "energy_kwh", "carbon_g", "cost_usd", "goodput_rps", "j_per_token",
            "idle_share", "estimated"]


def render(report: Report, fmt: str) -> str:
    """The report as `table`, `csv` or `json` text."""
    cols = columns(report)
    if fmt == "json":
        return orjson.dumps({"since_s": report.since_s, "until_s": report.until_s,
                             "group_by": list(report.group_by), "rows": list(report.rows),
                             "total": report.total}, option=orjson.OPT_INDENT_2).decode()
    records = [*report.rows, report.total]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for r in records:
            w.writerow(["" if r.get(c) is None else r.get(c) for c in cols])
        return buf.getvalue()
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}; use table, csv or json")
    cells = [cols] + [[_fmt(r.get(c)) for c in cols] for r in records]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(len(lines) - 1, lines[1])
    return "\n".join(lines) + "\n"
