"""HTML building blocks for the reports (pure: data in, markup out): real tables, full-width
labelled plots (matplotlib to inline SVG), the answer first, raw text folded in <details>."""

from __future__ import annotations

import html
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadgen import decide, report
from loadgen import search_report as sr
from loadgen.capacity import Interval
from loadgen.experiments import PairedDelta, SweepPoint, SweepResult, pareto_front
from loadgen.precision import PRECISION_HEADER, PrecisionReport, headline, precision_rows
from loadgen.runner import RunOutcome
from loadgen.search_report import SearchReport
from loadgen.timebase import WALL, TimeBase

# Tables fit the page: headers wrap, cells are tight, and a table still too wide scrolls
# inside its own box rather than widening the page; printed, the page is A4 landscape.
STYLE = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:auto;padding:0 16px;"
         "color:#222}.wide{max-width:100%;overflow-x:auto}"
         "table{border-collapse:collapse;margin:8px 0;font-size:12px}"
         "th,td{border:1px solid #ccc;padding:3px 5px;text-align:right}"
         "th{white-space:normal;vertical-align:bottom}"
         "@media print{@page{size:A4 landscape;margin:10mm}body{max-width:none}"
         "table{font-size:9px}}"
         "th{background:#eef}td:first-child,th:first-child{text-align:left}"
         ".answer{background:#eaf6ea;border-left:6px solid #3a3;padding:10px 16px;"
         "font-size:16px}figure{margin:12px 0}figure svg{width:100%;height:auto}"
         "figcaption{font-size:13px;color:#555}pre{background:#f6f6f6;padding:8px;"
         "overflow-x:auto;font-size:12px}details{margin:8px 0}summary{cursor:pointer}")


def esc(text: str) -> str:
    return html.escape(text)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "") -> str:
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (f"<div class='wide'><table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}"
            "</tbody></table></div>")


def details(summary: str, text: str) -> str:
    return f"<details><summary>{esc(summary)}</summary><pre>{esc(text)}</pre></details>"


def svg(fig: Any) -> str:
    """The figure as inline SVG that scales to the page width (no fixed width/height)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    head, rest = text.split(">", 1)
    head = re.sub(r'\s(width|height)="[^"]*"', "", head)
    return head + ">" + rest


def figure(svg_text: str, caption: str) -> str:
    return f"<figure>{svg_text}<figcaption>{esc(caption)}</figcaption></figure>"


def _by_arm(points: Sequence[SweepPoint]) -> dict[str, list[SweepPoint]]:
    out: dict[str, list[SweepPoint]] = {}
    for p in sorted(points, key=lambda p: p.rate_rps):
        out.setdefault(p.arm, []).append(p)
    return out


def load_curve_plot(r: PrecisionReport, rate_label: str) -> str:
    """Goodput and J per output token against offered rate, one line per precision."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4))
    ax_g, ax_e = fig.subplots(1, 2)
    for arm in r.arms:
        pts = list(arm.curve)
        rates = [p.rate_rps for p in pts]
        ax_g.plot(rates, [p.goodput_rps or 0.0 for p in pts], marker="o", label=arm.precision)
        e_pts = [p for p in pts if p.j_per_output_token is not None]
        ax_e.plot([p.rate_rps for p in e_pts], [p.j_per_output_token or 0.0 for p in e_pts],
                  marker="o", label=arm.precision)
        if arm.capacity is not None and arm.capacity.j_per_output_token is not None:
            ax_e.scatter([arm.capacity.rate_rps], [arm.capacity.j_per_output_token], s=120,
                         facecolors="none", edgecolors="k")
    ax_g.set_title("Goodput vs offered rate")
    ax_g.set_xlabel(f"offered rate ({rate_label})")
    ax_g.set_ylabel(f"goodput ({rate_label} meeting the SLO)")
    ax_e.set_title("J per output token vs offered rate (circle: SLO capacity)")
    ax_e.set_xlabel(f"offered rate ({rate_label})")
    ax_e.set_ylabel("energy (J per output token)")
    for ax in (ax_g, ax_e):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    return svg(fig)


def pareto_plot(points: Sequence[tuple[str, float, float]], title: str, rate_label: str) -> str:
    """(label, goodput, J/token) per precision, with the non-dominated frontier."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4))
    ax = fig.subplots()
    for lab, g, e in points:
        ax.scatter([e], [g], s=60)
        ax.annotate(lab, (e, g), fontsize=10, xytext=(5, 5), textcoords="offset points")
    front = pareto_front(points)
    if len(front) > 1:
        ax.plot([p[2] for p in front], [p[1] for p in front], "k--", lw=1, label="Pareto front")
        ax.legend(fontsize=9)
    ax.set_title(title)
    ax.set_xlabel("energy (J per output token; lower is better)")
    ax.set_ylabel(f"goodput ({rate_label} meeting the SLO; higher is better)")
    ax.grid(alpha=0.3)
    return svg(fig)


def capacity_pareto_points(r: PrecisionReport) -> list[tuple[str, float, float]]:
    """Each precision at its SLO capacity: (precision, goodput, J per output token)."""
    return [(a.precision, a.capacity.goodput_rps, a.capacity.j_per_output_token)
            for a in r.arms if a.capacity is not None and a.capacity.goodput_rps is not None
            and a.capacity.j_per_output_token is not None]


def precision_section(r: PrecisionReport, rate_label: str = "req/s") -> str:
    """The precision answer: the table, the load curves and the Pareto plot over the arms."""
    parts = ["<h2>Precisions at the SLO</h2>",
             f"<p>SLO: {esc(r.slo)} for {r.target_attainment:.0%} of requests; "
             f"rates: {esc(r.rate_note)}.</p>",
             table(PRECISION_HEADER, precision_rows(r)),
             figure(load_curve_plot(r, rate_label),
                    "Each precision swept over the same offered rates (one seeded schedule per "
                    "rate, replayed on every precision).")]
    pts = capacity_pareto_points(r)
    if pts:
        parts.append(figure(pareto_plot(
            pts, "Goodput vs energy per token at SLO capacity (Pareto frontier across "
            "precisions)", rate_label), "One point per precision, at the highest rate at "
            "which it met the SLO."))
    else:
        parts.append("<p>Pareto frontier: n/a (no precision met the SLO with energy data).</p>")
    return "\n".join(parts)


def search_plot(r: SearchReport) -> str:
    """Attainment and J per output token against offered rate, with 95 % intervals, one line
    per arm, in the report's time base."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4))
    ax_a, ax_e = fig.subplots(1, 2)
    for label, steps in sr.curve_series(r):
        rates = [s.rate_rps for s in steps]
        ax_a.errorbar(rates, [s.attainment.mean for s in steps], yerr=_err([
            s.attainment for s in steps]), marker="o", capsize=3, label=label)
        e = [s for s in steps if s.j_per_output_token is not None]
        ax_e.errorbar([s.rate_rps for s in e], [s.j_per_output_token.mean for s in e
                                                if s.j_per_output_token is not None],
                      yerr=_err([s.j_per_output_token for s in e]), marker="o", capsize=3,
                      label=label)
    ax_a.axhline(r.config.target_attainment, color="k", lw=0.8, ls="--")
    ax_a.set_title("SLO attainment vs offered rate (dashed: target)")
    ax_a.set_ylabel("attainment (mean of trials, 95 % CI)")
    ax_e.set_title("J per output token vs offered rate")
    ax_e.set_ylabel("J per output token (95 % CI)")
    for ax in (ax_a, ax_e):
        ax.set_xlabel(f"offered rate (req/s, {r.base.name})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    return svg(fig)


def _err(ivs: Sequence[Interval | None]) -> list[list[float]]:
    """Error bar lengths below and above each mean (0 where the interval is unknown)."""
    lows, highs = [], []
    for iv in ivs:
        ok = iv is not None and iv.n > 1
        lows.append(iv.mean - iv.low if ok and iv is not None else 0.0)
        highs.append(iv.high - iv.mean if ok and iv is not None else 0.0)
    return [lows, highs]


def search_section(r: SearchReport) -> str:
    """The capacity search: method, table, curves with intervals."""
    return "".join(["<h2>Precisions: SLO capacity by search, J per output token along the "
                    "load curve</h2>", f"<p>{esc(sr.method_note(r))}</p>",
                    f"<p>{esc(sr.quality_note(r))}</p>",
                    table(sr.header(r), sr.rows(r), f"time base: {r.base.name}"),
                    f"<p>{esc(sr.curve_title(r))}:</p><ul>",
                    *(f"<li>{esc(x)}</li>" for x in sr.curve_lines(r)), "</ul>",
                    *(f"<p>{esc(n)}</p>" for n in r.notes),
                    figure(search_plot(r), f"Each arm's rates as the search tried them; "
                           f"{r.base.name}."), _search_pareto(r)])


def _search_pareto(r: SearchReport) -> str:
    """Each arm at its estimated capacity: (label, capacity, J/out-tok at its rate met
    closest to it), with the non-dominated frontier."""
    pts = [(a.label, cap, j.mean) for a in r.arms
           if (cap := a.search.capacity_rps) is not None
           and (j := decide.j_at(a, cap)) is not None]
    if not pts:
        return "<p>Pareto frontier: n/a (no arm met the SLO with energy data).</p>"
    return figure(pareto_plot(pts, "SLO capacity vs energy per token (Pareto frontier across "
                              "arms)", f"req/s, {r.base.name}"),
                  "One point per arm at its SLO capacity.")


def answer_box(lines: Sequence[str]) -> str:
    return "<div class='answer'>" + "".join(f"<p>{esc(x)}</p>" for x in lines) + "</div>"


def page(title: str, body: Sequence[str]) -> str:
    return ("<!doctype html><html><head><meta charset='utf-8'><title>" + esc(title)
            + f"</title><style>{STYLE}</style></head><body><h1>{esc(title)}</h1>"
            + "\n".join(body) + "</body></html>")


def cdf_plot(outcomes: Sequence[RunOutcome], base: TimeBase = WALL) -> str:
    """TTFT, TPOT and E2E CDFs from intended arrival, one line per run, in `base`."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.8))
    axes = fig.subplots(1, 3)
    for ax, (name, pick) in zip(axes, (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s")),
                                strict=True):
        for o in outcomes:
            vals = sorted(base.seconds(v) * 1e3 for m in o.requests if m.result.ok
                          and (v := getattr(m.from_intended, pick)) is not None)
            if vals:
                ax.step(vals, [(i + 1) / len(vals) for i in range(len(vals))], where="post",
                        label=o.label or "run")
        ax.set_title(f"{name} CDF")
        ax.set_xlabel(f"{name} from intended arrival (ms, {base.name})")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return svg(fig)


def sweep_plot(sw: SweepResult) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4))
    ax = fig.subplots()
    for arm, pts in _by_arm(sw.points).items():
        ax.plot([p.rate_rps for p in pts], [p.goodput_rps or 0.0 for p in pts], marker="o",
                label=arm)
    ax.set_title("Goodput vs offered rate")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("goodput (req/s meeting the SLO)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    return svg(fig)


def runs_section(outcomes: Sequence[RunOutcome], arm_precisions: dict[str, str] | None,
                 quality: dict[str, float] | None, deltas: Sequence[PairedDelta],
                 base: TimeBase = WALL, title: str = "Runs",
                 delta_base: TimeBase | None = None) -> list[str]:
    """The runs' table, notes, paired deltas (in `delta_base`, default `base`: the deltas
    may come from other runs than these) and latency CDFs."""
    delta_base = base if delta_base is None else delta_base
    parts = [f"<h2>{esc(title)}</h2>", table(report.RUN_HEADER, report.run_rows(outcomes, base),
                                             report.time_note(base)),
             "<ul>" + "".join(f"<li>{esc(n)}</li>"
                              for n in report.run_notes(outcomes, arm_precisions, quality))
             + "</ul>"]
    if deltas:
        parts += ["<h2>Paired deltas (same requests, arm minus baseline)</h2>",
                  table(report.DELTA_HEADER, report.delta_rows(deltas, delta_base),
                        f"latency in ms, {delta_base.name}")]
    parts.append(f"<h2>Latency ({esc(title)})</h2>" + figure(
        cdf_plot(outcomes, base), f"Cumulative distributions over successful requests, "
        f"{base.name}."))
    return parts


def write_html(path: Path, title: str, outcomes: Sequence[RunOutcome], *,
               deltas: Sequence[PairedDelta] = (), sweep: SweepResult | None = None,
               precision: PrecisionReport | None = None, rate_label: str = "req/s",
               arm_precisions: dict[str, str] | None = None,
               quality: dict[str, float] | None = None, notes: Sequence[str] = (),
               answer: Sequence[str] = (), sections: Sequence[str] = (),
               raw: Sequence[tuple[str, str]] = (), base: TimeBase = WALL,
               search: SearchReport | None = None, runs_title: str = "Runs",
               delta_base: TimeBase | None = None) -> None:
    """One self-contained page: the answer first (the recommendation, then `answer` lines),
    `notes`, the precision section, caller `sections` (HTML), the runs, paired
    deltas and plots, and the raw text tables folded in <details> (plus `raw` (title, text))."""
    lines = [*([decide.headline(search.decision)] if search else []),
             *([headline(precision)] if precision else []), *answer]
    body = [answer_box(lines)] if lines else []
    body += [f"<p>{esc(n)}</p>" for n in notes]
    if search is not None:
        body.append(search_section(search))
    if precision is not None:
        body.append(precision_section(precision, rate_label))
    body += sections
    body += runs_section(outcomes, arm_precisions, quality, deltas, base, runs_title,
                         delta_base)
    if sweep is not None and precision is None:
        body += ["<h2>Goodput vs offered rate</h2>", figure(sweep_plot(sweep), "")]
        raw = [("sweep table", report.sweep_table(sweep)), *raw]
    if precision is None and sweep is None and search is None:
        pts = report.pareto_points(outcomes, None)
        if pts:
            body.append("<h2>Goodput vs energy per token</h2>" + figure(pareto_plot(
                pts, "Goodput vs energy per token (Pareto frontier across precisions)",
                "req/s"), "One point per run."))
    body.append("<h2>Raw tables</h2>")
    body += [details(t, text) for t, text in raw]
    body += [details(f"{o.label or 'run'}: send vs intended, SLO classes, tenants",
                     report.send_vs_intended(o) + "\n\n" + report.class_table(o) + "\n\n"
                     + report.tenant_table(o)) for o in outcomes]
    path.write_text(page(title, body))
