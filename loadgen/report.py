"""Outputs: terminal tables (and their rows, for the HTML tables), JSON (summary + per
request), CSV. The HTML page is built by loadgen/report_html.py."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from loadgen.experiments import (
    PairedDelta,
    SweepResult,
    accuracy_condition,
    numeric_format,
)
from loadgen.precision import PRECISION_HEADER, PrecisionReport, headline, precision_rows
from loadgen.runner import RunOutcome
from loadgen.timebase import WALL, TimeBase


def _ms(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x * 1e3:.1f}"


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                      enumerate(zip(r, widths, strict=True))) for r in rows]
    return "\n".join(out)


# ok: served; refused: 4xx from the gateway (a tenant's limit or budget, a bad key) or an
# engine's 4xx but 429; failed: 5xx, an engine's 429, timeouts, connect and stream errors
ATTAINMENT_NOTE = "attain = SLO met / (ok + failed); refused and cancelled are not judged"
RUN_HEADER = ("arm", "sent", "ok", "refused", "failed", "req/s", "TTFT p50", "TTFT p99",
              "TPOT p50", "TPOT p99", "E2E p50", "lag p99", "goodput", "attain", "J/req",
              "J/out-tok", "gCO2e/1M tok", "USD/1M tok")


def run_rows(outcomes: Sequence[RunOutcome], base: TimeBase = WALL) -> list[list[str]]:
    """One row per run (arm): latency (ms) from intended arrival, goodput, energy; latencies
    and rates in `base` (the client's lag stays on the wall, where the client keeps time)."""
    rows = []

    def ms(x: float | None) -> str:
        return _ms(None if x is None else base.seconds(x))

    def rps(x: float | None) -> str:
        return _num(None if x is None else base.rate(x))

    for o in outcomes:
        s, e = o.summary, o.energy_overall
        lat = s.from_intended
        rows.append([o.label or "run", str(s.requests), str(s.ok), str(s.refused),
                     str(s.failed), rps(s.throughput_rps),
                     ms(lat.ttft_s.p50), ms(lat.ttft_s.p99), ms(lat.tpot_s.p50),
                     ms(lat.tpot_s.p99), ms(lat.e2e_s.p50), _ms(s.lag_s.p99),
                     rps(s.goodput_rps), _num(s.attainment, "{:.1%}"),
                     _num(e.j_per_request if e else None, "{:.1f}"),
                     _num(e.j_per_output_token if e else None, "{:.3f}"),
                     _num(e.carbon_g_per_1k_tokens * 1e3 if e else None, "{:.1f}"),
                     _num(e.usd_per_1k_tokens * 1e3 if e else None, "{:.3f}")])
    return rows


def run_notes(outcomes: Sequence[RunOutcome], arm_precisions: dict[str, str] | None = None,
              quality: dict[str, float] | None = None) -> list[str]:
    # one footnote per distinct text, naming the runs it is about, not one per run
    notes = _once([(o.label or "run", o.summary.grading_note) for o in outcomes])
    notes += _once([(o.label or "run", f"energy {o.energy_note}") for o in outcomes
                    if o.energy_note])
    # One plan usually feeds every arm: say once what its prompt lengths count.
    notes += [f"prompts: {n}" for n in dict.fromkeys(o.prompt_note for o in outcomes) if n]
    if arm_precisions:
        notes += [f"{label}: {numeric_format(p)}; {accuracy_condition(p, quality or {})}"
                  for label, p in arm_precisions.items()]
    return notes


def _once(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """'a, b: text' for each distinct text of (label, text) pairs, in first-seen order."""
    labels: dict[str, list[str]] = {}
    for label, text in pairs:
        labels.setdefault(text, []).append(label)
    return [f"{', '.join(who) if len(who) < len(pairs) or len(who) == 1 else 'every run'}: "
            f"{text}" for text, who in labels.items()]


def time_note(base: TimeBase = WALL) -> str:
    extra = "" if base.time_scale == 1.0 else " (lag p99: the client's, wall time)"
    return (f"time base: {base.name}: latency in ms and rates in req/s, measured from "
            f"intended arrival{extra}")


def run_table(outcomes: Sequence[RunOutcome], arm_precisions: dict[str, str] | None = None,
              quality: dict[str, float] | None = None, base: TimeBase = WALL) -> str:
    """One row per run (arm): latency from intended arrival, goodput, energy, in `base`."""
    text = (time_note(base) + "; " + ATTAINMENT_NOTE + "\n"
            + text_table(RUN_HEADER, run_rows(outcomes, base)))
    return text + "\n" + "\n".join(run_notes(outcomes, arm_precisions, quality))


def precision_table(r: PrecisionReport) -> str:
    """The precision report for a terminal: the answer, then one row per precision."""
    return (headline(r) + "\n" + f"SLO: {r.slo} for {r.target_attainment:.0%} of requests; "
            f"rates: {r.rate_note}\n" + text_table(PRECISION_HEADER, precision_rows(r)))


def send_vs_intended(o: RunOutcome) -> str:
    s = o.summary
    rows = [[name, _ms(getattr(s.from_send, f).p50), _ms(getattr(s.from_send, f).p99),
             _ms(getattr(s.from_intended, f).p50), _ms(getattr(s.from_intended, f).p99)]
            for name, f in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"),
                            ("E2E", "e2e_s"))]
    head = (f"wall time: requested {_num(s.requested_rate_rps)} req/s, achieved "
            f"{_num(s.achieved_rate_rps)}"
            f" req/s; schedule lag p50 {_ms(s.lag_s.p50)} ms, p99 {_ms(s.lag_s.p99)} ms, "
            f"max {_ms(s.lag_s.max)} ms")
    return head + "\n" + text_table(["metric (ms)", "send p50", "send p99", "intended p50",
                                 "intended p99"], rows)


TENANT_HEADER = ("tenant", "slo class", "sent", "ok", "refused", "failed", "TTFT p50", "TTFT p99", "TPOT p50",
                 "goodput", "attain", "energy J", "gCO2e", "USD", "J/out-tok")


def tenant_rows(o: RunOutcome) -> list[list[str]]:
    """Each tenant's latency (ms), goodput and bill (J, gCO2e, USD) in one run."""
    energy = {e.name: e for e in o.energy_by_tenant}
    rows = []
    for g in o.summary.per_tenant:
        e = energy.get(g.name)
        rows.append([g.name, g.slo, str(g.sent), str(g.ok), str(g.refused), str(g.failed),
                     _ms(g.ttft_s.p50), _ms(g.ttft_s.p99),
                     _ms(g.tpot_s.p50), _num(g.goodput_rps), _num(g.attainment, "{:.1%}"),
                     _num(e.energy_j if e else None, "{:.1f}"),
                     _num(e.carbon_g if e else None, "{:.4f}"),
                     _num(e.cost_usd if e else None, "{:.6f}"),
                     _num(e.j_per_output_token if e else None, "{:.3f}")])
    return rows


def tenant_table(o: RunOutcome) -> str:
    return ("per tenant, latency in ms and goodput in req/s, wall time\n"
            + text_table(TENANT_HEADER, tenant_rows(o)))


def class_table(o: RunOutcome) -> str:
    rows = [[g.slo, str(g.sent), str(g.ok), str(g.refused), str(g.failed),
             _num(g.goodput_rps), _num(g.attainment, "{:.1%}")] for g in o.summary.per_class]
    return text_table(["slo class", "sent", "ok", "refused", "failed",
                       "goodput req/s (wall time)", "attainment"], rows)


DELTA_HEADER = ("arm", "vs", "pairs", "dTTFT ms", "dTPOT ms", "dE2E ms", "TTFT faster",
                "dJ/token")


def delta_rows(deltas: Sequence[PairedDelta], base: TimeBase = WALL) -> list[list[str]]:
    """Paired deltas, latency deltas in ms of `base`."""
    return [[d.arm, d.baseline, str(d.pairs), _ms(base.seconds(d.ttft_median_delta_s)),
             _ms(base.seconds(d.tpot_median_delta_s)), _ms(base.seconds(d.e2e_median_delta_s)),
             _num(d.ttft_faster_share, "{:.0%}"), _num(d.j_per_token_delta_pct, "{:+.1f}%")]
            for d in deltas]


def delta_table(deltas: Sequence[PairedDelta], base: TimeBase = WALL) -> str:
    return (f"paired deltas, latency in ms, {base.name}\n"
            + text_table(DELTA_HEADER, delta_rows(deltas, base)))


def sweep_table(sw: SweepResult) -> str:
    rows = [[p.arm, _num(p.rate_rps), _num(p.achieved_rate_rps), _num(p.goodput_rps),
             _num(p.attainment, "{:.1%}"), _ms(p.ttft_p99_s), _ms(p.tpot_p99_s),
             _num(p.j_per_output_token, "{:.3f}"), "yes" if p.graded else "no"]
            for p in sw.points]
    text = text_table(["arm", "rate", "achieved", "goodput", "attain", "TTFT p99", "TPOT p99",
                   "J/out-tok", "graded"], rows)
    lines = [text]
    for arm, p in sw.best_goodput.items():
        lines.append(f"{arm}: max goodput {p.goodput_rps:.2f} req/s at {p.rate_rps:g} req/s "
                     f"(attainment {p.attainment:.1%} >= {sw.target_attainment:.0%})")
    missing = sorted({p.arm for p in sw.points} - set(sw.best_goodput))
    lines += [f"{arm}: no rate met attainment {sw.target_attainment:.0%}" for arm in missing]
    if sw.min_energy is not None:
        m = sw.min_energy
        lines.append(f"lowest J/token meeting the SLO: {m.j_per_output_token:.3f} J/token "
                     f"({m.arm} at {m.rate_rps:g} req/s)")
    else:
        lines.append("lowest J/token meeting the SLO: n/a (no energy data or no point met it)")
    return "\n".join(lines)


# --- files ---------------------------------------------------------------------------------


def _jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    return x


def request_rows(o: RunOutcome) -> list[dict[str, Any]]:
    rows = []
    fetch = o.energy_fetch
    for m in o.requests:
        r = m.result
        e = fetch.row(r) if fetch else None
        rows.append({
            "arm": o.label, "index": r.index, "tenant": r.tenant, "slo_class": r.slo_class,
            "status": r.status, "http_status": r.http_status, "code": r.code,
            "outcome": r.outcome, "request_id": r.request_id,
            "client_request_id": r.client_request_id,
            "intended_s": r.intended_s, "sent_s": r.sent_s, "first_token_s": r.first_token_s,
            "end_s": r.end_s, "lag_s": r.lag_s, "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens, "token_events": sum(n for _, n in r.reads),
            "ttft_send_s": m.from_send.ttft_s, "tpot_send_s": m.from_send.tpot_s,
            "e2e_send_s": m.from_send.e2e_s, "ttft_intended_s": m.from_intended.ttft_s,
            "tpot_intended_s": m.from_intended.tpot_s, "e2e_intended_s": m.from_intended.e2e_s,
            "slo_met": m.slo_met, "energy_j": e.energy_j if e else None,
            "carbon_g": e.carbon_g if e else None, "cost_usd": e.cost_usd if e else None,
            "precision": e.precision if e else "", "energy_estimated": e.estimated if e else None,
        })
    return rows


def write_json(path: Path, outcomes: Sequence[RunOutcome], extra: dict[str, Any] | None = None
               ) -> None:
    doc = {
        "runs": [{"label": o.label, "target": _jsonable(o.target), "summary": _jsonable(o.summary),
                  "energy_note": o.energy_note,
                  "energy": _jsonable(o.energy_overall),
                  "energy_by_tenant": _jsonable(o.energy_by_tenant),
                  "energy_by_precision": _jsonable(o.energy_by_precision),
                  "requests": _jsonable(request_rows(o))} for o in outcomes],
        **_jsonable(extra or {}),
    }
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def write_csv(path: Path, outcomes: Sequence[RunOutcome]) -> None:
    rows = [row for o in outcomes for row in request_rows(o)]
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    path.write_text(buf.getvalue())


def pareto_points(outcomes: Sequence[RunOutcome], sweep: SweepResult | None
                  ) -> list[tuple[str, float, float]]:
    """(label, goodput, J/token) for every run, or sweep point, with both numbers."""
    if sweep is not None:
        return [(f"{p.arm}@{p.rate_rps:g}", p.goodput_rps, p.j_per_output_token)
                for p in sweep.points
                if p.goodput_rps is not None and p.j_per_output_token is not None]
    return [(o.label, o.summary.goodput_rps, o.energy_overall.j_per_output_token)
            for o in outcomes
            if o.summary.goodput_rps is not None and o.energy_overall is not None]
