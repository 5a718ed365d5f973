"""Spend against budget per tenant (`wattgate report --budgets`): read from the ledger as
admission reads it, rendered as a table, CSV or JSON."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from accounting.ledger.budget_store import BudgetStore
from accounting.report import fixed, positional
from gateway.config import FieldReader
from gateway.tenancy.budget import Cost, Spend, period_start_hour, spends
from gateway.tenancy.config import TenantBudgets, parse_budgets
from gateway.tenancy.renewal import NEW_REPLICA_S, REPLICA_LIVE_S

COLUMNS = ("tenant", "period", "unit", "budget", "spent", "held", "remaining", "used_percent")


def budgets_of(raw_config: Mapping[str, Any]) -> dict[str, TenantBudgets]:
    """Each tenant's budgets from a gateway YAML document (nothing else of it is checked:
    the report needs no API keys)."""
    out = {}
    for i, t in enumerate(raw_config.get("tenants") or []):
        r = FieldReader(t, f"tenants[{i}]")
        budgets = parse_budgets(r)
        if budgets.budgets:
            out[r.text("name")] = budgets
    return out


async def standing(ledger: BudgetStore, budgets: Mapping[str, TenantBudgets],
                   ttl_s: float = 900.0, now_s: float | None = None
                   ) -> list[tuple[str, Spend]]:
    now = time.time() if now_s is None else now_s
    out: list[tuple[str, Spend]] = []
    for tenant, tb in budgets.items():
        since = min(period_start_hour(b.period, now) for b in tb.budgets)
        hours = await ledger.tenant_hours(tenant, since)
        energy, carbon, cost, _ = await ledger.reservations_held(
            tenant, now - NEW_REPLICA_S, now - REPLICA_LIVE_S, now - ttl_s)
        out += [(tenant, s) for s in spends(tb.budgets, hours, Cost(energy, carbon, cost), now)]
    return out


def rows(items: Sequence[tuple[str, Spend]]) -> list[dict[str, Any]]:
    return [{"tenant": t, "period": s.budget.period, "unit": s.budget.unit,
             "budget": s.budget.limit, "spent": s.spent, "held": s.held,
             "remaining": s.remaining, "used_percent": 100.0 * s.used_ratio}
            for t, s in items]


def render(items: Sequence[tuple[str, Spend]], fmt: str) -> str:
    data = rows(items)
    if fmt == "json":
        return orjson.dumps({"budgets": data}, option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows({k: positional(v) if isinstance(v, float) else v for k, v in r.items()}
                    for r in data)
        return buf.getvalue()
    cells = [list(COLUMNS)] + [[fixed(r[c]) if isinstance(r[c], float) else str(r[c])
                                for c in COLUMNS] for r in data]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"
