"""Numbers of one run (pure over the joined requests), the targets, and the report files."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadgen.truth.join import EngineBalance, Joined
from loadgen.truth.workload import ADVERSARY

# The accuracy targets: per-request median and p95 error, each tenant's total.
MEDIAN_MAX = 0.05
P95_MAX = 0.15
TENANT_MAX = 0.02


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (nan when empty)."""
    if not values:
        return math.nan
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    n: int
    bill_j: float
    truth_j: float
    median_abs: float
    p95_abs: float
    median_signed: float
    p05_signed: float
    p95_signed: float
    residency_j: float  # the residency view, beside
    p95_abs_residency: float

    @property
    def total_error(self) -> float:
        return (self.bill_j - self.truth_j) / self.truth_j if self.truth_j > 0 else math.nan


def group(name: str, rows: Sequence[Joined]) -> Group:
    errs = [r.error for r in rows if r.truth_j > 0]
    res = [abs(r.residency_error) for r in rows if r.residency_j > 0]
    return Group(name, len(rows), math.fsum(r.bill_j for r in rows),
                 math.fsum(r.truth_j for r in rows), quantile([abs(e) for e in errs], 0.5),
                 quantile([abs(e) for e in errs], 0.95), quantile(errs, 0.5),
                 quantile(errs, 0.05), quantile(errs, 0.95),
                 math.fsum(r.residency_j for r in rows), quantile(res, 0.95))


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    value: float
    limit: float
    met: bool


def run_summary(label: str, sent: int, rows: Sequence[Joined],
                engines: Sequence[EngineBalance],
                extra: Callable[[Sequence[Joined]], list[Target]] | None = None
                ) -> dict[str, Any]:
    """The numbers of one run: overall, per class, per tenant, conservation and targets
    (`extra` adds targets of its own over the final rows)."""
    final = [r for r in rows if r.final]
    overall = group("all", [r for r in final if r.truth_j > 0])
    classes = sorted({r.sent.shape.cls for r in final})
    tenants = sorted({r.sent.shape.tenant for r in final})
    by_class = [group(c, [r for r in final if r.sent.shape.cls == c]) for c in classes]
    by_tenant = [group(t, [r for r in final if r.sent.shape.tenant == t]) for t in tenants]
    targets = [Target("per-request |error| median", overall.median_abs, MEDIAN_MAX,
                      overall.median_abs <= MEDIAN_MAX),
               Target("per-request |error| p95", overall.p95_abs, P95_MAX,
                      overall.p95_abs <= P95_MAX)]
    for g in by_class:
        if not math.isnan(g.p95_abs):
            targets.append(Target(f"class {g.name} |error| p95", g.p95_abs, P95_MAX,
                                  g.p95_abs <= P95_MAX))
    for g in by_tenant:
        name = f"tenant {g.name}" + (" (adversarial)" if g.name == ADVERSARY else "")
        targets.append(Target(name, abs(g.total_error), TENANT_MAX,
                              abs(g.total_error) <= TENANT_MAX))
    if extra is not None:
        targets += extra(final)
    for e in engines:
        targets.append(Target(f"conservation {e.engine} (|shares + idle - metered| J)",
                              abs(e.residual_j), 1e-9 * max(e.metered_j, 1.0), e.exact))
    return {"label": label, "sent": sent, "joined": len(rows), "final": len(final),
            "statuses": _count(r.status for r in final),
            "overall": asdict(overall), "classes": [asdict(g) for g in by_class],
            "tenants": [asdict(g) | {"total_error": g.total_error,
                                     "residency_error": _rel(g.bill_j, g.residency_j)}
                        for g in by_tenant],
            "engines": [asdict(e) | {"residual_j": e.residual_j} for e in engines],
            "targets": [asdict(t) for t in targets],
            "errors_by_class": {c: [r.error for r in final if r.sent.shape.cls == c
                                    and r.truth_j > 0] for c in classes},
            "worst": [_row(r) for r in sorted(final, key=lambda r: -abs(r.error)
                                              if r.truth_j > 0 else 0.0)[:10]]}


def _rel(bill_j: float, truth_j: float) -> float:
    return (bill_j - truth_j) / truth_j if truth_j > 0 else math.nan


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def _row(r: Joined) -> dict[str, Any]:
    s = r.sent.shape
    return {"request_id": r.sent.request_id, "class": s.cls, "engine": r.engine,
            "status": r.status, "prompt": s.prompt_tokens, "max_tokens": s.max_tokens,
            "tokens_seen": r.sent.tokens_seen, "billed_prompt": r.prompt_tokens,
            "billed_completion": r.completion_tokens,
            "truth_completion": r.truth_completion_tokens,
            "bill_j": r.bill_j, "truth_j": r.truth_j, "error": r.error,
            "residency_j": r.residency_j, "residency_error": r.residency_error}


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.1%}"


def _apct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1%}"


def markdown_run(s: dict[str, Any]) -> list[str]:
    o = s["overall"]
    lines = [f"### {s['label']}", "",
             f"{s['sent']} requests sent, {s['joined']} joined to a bill, {s['final']} final; "
             f"outcomes {s['statuses']}.", "",
             "| target | value | limit | met |", "| --- | ---: | ---: | --- |"]
    for t in s["targets"]:
        if t["name"].startswith("conservation"):
            lines.append(f"| {t['name']} | {t['value']:.2e} | {t['limit']:.1e} | "
                         f"{'met' if t['met'] else 'NOT MET'} |")
        else:
            lines.append(f"| {t['name']} | {_apct(t['value'])} | {t['limit']:.0%} | "
                         f"{'met' if t['met'] else 'NOT MET'} |")
    lines += ["", "Against the Shapley truth; the residency view beside (last three columns).", "",
              "| class | n | billed J | truth J | total error | median abs | p95 abs | "
              "signed p5 / median / p95 | residency J | error | p95 abs |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for g in [*s["classes"], o]:
        lines.append(f"| {g['name']} | {g['n']} | {g['bill_j']:.0f} | {g['truth_j']:.0f} | "
                     f"{_pct(_rel(g['bill_j'], g['truth_j']))} | {_apct(g['median_abs'])} | "
                     f"{_apct(g['p95_abs'])} | {_pct(g['p05_signed'])} / "
                     f"{_pct(g['median_signed'])} / {_pct(g['p95_signed'])} | "
                     f"{g['residency_j']:.0f} | {_pct(_rel(g['bill_j'], g['residency_j']))} | "
                     f"{_apct(g['p95_abs_residency'])} |")
    lines += ["", "| tenant | n | billed J | truth J | error | residency J | error |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for g in s["tenants"]:
        lines.append(f"| {g['name']} | {g['n']} | {g['bill_j']:.0f} | {g['truth_j']:.0f} | "
                     f"{_pct(g['total_error'])} | {g['residency_j']:.0f} | "
                     f"{_pct(g['residency_error'])} |")
    lines += ["", "| engine | intervals | metered J | shares J | idle J | shares + idle - metered |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for e in s["engines"]:
        lines.append(f"| {e['engine']} | {e['intervals']} | {e['metered_j']:.1f} | "
                     f"{e['shares_j']:.1f} | {e['idle_j']:.1f} | {e['residual_j']:.2e} |")
    lines += ["", "Largest per-request errors:", "",
              "| class | status | prompt | max_tokens | seen | billed p/c | truth c | bill J | "
              "truth J | error |", "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for w in s["worst"][:6]:
        lines.append(f"| {w['class']} | {w['status']} | {w['prompt']} | {w['max_tokens']} | "
                     f"{w['tokens_seen']} | {w['billed_prompt']}/{w['billed_completion']} | "
                     f"{w['truth_completion']} | {w['bill_j']:.1f} | {w['truth_j']:.1f} | "
                     f"{_pct(w['error'])} |")
    return [*lines, ""]


def plot(runs: Sequence[dict[str, Any]], path: Path) -> None:
    """Signed error by request class, one panel per run: box (quartiles), whiskers p5-p95,
    the median written above each box."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 4.2 * len(runs)), squeeze=False)
    for ax, s in zip(axes[:, 0], runs, strict=True):
        names = list(s["errors_by_class"])
        data = [[100 * e for e in s["errors_by_class"][c]] or [math.nan] for c in names]
        ax.boxplot(data, whis=(5, 95), showfliers=True, flierprops={"markersize": 3})
        ax.set_xticks(range(1, len(names) + 1), names, rotation=20, fontsize=8)
        ax.axhspan(-5, 5, color="tab:green", alpha=0.08)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_ylabel("bill vs truth (%)")
        ax.set_title(f"{s['label']}: per-request error by class (box: quartiles, whiskers p5-p95)",
                     fontsize=10)
        for i, vals in enumerate(data, start=1):
            if vals and not math.isnan(vals[0]):
                ax.annotate(f"{statistics.median(vals):+.1f}%", (i, statistics.median(vals)),
                            xytext=(0, 6), textcoords="offset points", ha="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
